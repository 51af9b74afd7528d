package model

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
)

// DefaultBytesPerParam is the gradient element size Parse assumes when a
// profile file omits bytes_per_param or sets it to 0 (fp32).
const DefaultBytesPerParam = 4

// Load reads and validates the JSON profile file at path (see Parse). Errors
// start with `profile "<path>": `.
func Load(path string) (*Profile, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("profile %q: %w", path, err)
	}
	defer f.Close()
	p, err := parse(f)
	if err != nil {
		return nil, fmt.Errorf("profile %q: %w", path, err)
	}
	return p, nil
}

// Parse reads one JSON profile (the format of WriteJSON, documented in
// docs/models.md) from r and validates it. Decoding is strict: unknown fields,
// malformed JSON and data after the profile object are errors. A missing or
// zero bytes_per_param is taken as DefaultBytesPerParam (4) before
// validation. Errors start with "profile: ".
func Parse(r io.Reader) (*Profile, error) {
	p, err := parse(r)
	if err != nil {
		return nil, fmt.Errorf("profile: %w", err)
	}
	return p, nil
}

func parse(r io.Reader) (*Profile, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var p Profile
	if err := dec.Decode(&p); err != nil {
		return nil, decodeError(err)
	}
	var extra json.RawMessage
	if err := dec.Decode(&extra); err != io.EOF {
		if err != nil {
			return nil, fmt.Errorf("unexpected data after the profile object: %w", decodeError(err))
		}
		return nil, fmt.Errorf("unexpected data after the profile object at byte offset %d", dec.InputOffset())
	}
	if p.BytesPerParam == 0 {
		p.BytesPerParam = DefaultBytesPerParam
	}
	if err := p.validate(); err != nil {
		return nil, err
	}
	return &p, nil
}

// decodeError makes encoding/json's errors say what kind of problem the input
// has and where.
func decodeError(err error) error {
	var syn *json.SyntaxError
	switch {
	case errors.Is(err, io.EOF):
		return fmt.Errorf("malformed JSON: empty input")
	case errors.Is(err, io.ErrUnexpectedEOF):
		return fmt.Errorf("malformed JSON: unexpected end of input")
	case errors.As(err, &syn):
		return fmt.Errorf("malformed JSON at byte offset %d: %w", syn.Offset, err)
	}
	return fmt.Errorf("invalid profile JSON: %w", err)
}

// WriteJSON validates p and writes it to w as indented JSON that Parse reads
// back unchanged.
func (p *Profile) WriteJSON(w io.Writer) error {
	if err := p.Validate(); err != nil {
		return fmt.Errorf("write profile: %w", err)
	}
	b, err := json.MarshalIndent(p, "", "  ")
	if err != nil {
		return fmt.Errorf("write profile %q: %w", p.Name, err)
	}
	b = append(b, '\n')
	if _, err := w.Write(b); err != nil {
		return fmt.Errorf("write profile %q: %w", p.Name, err)
	}
	return nil
}
