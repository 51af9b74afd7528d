package model

import (
	"bytes"
	"testing"
)

// FuzzParse: a profile file parses into a profile that writes back out and
// parses again to the same totals, or into an error; never a panic.
func FuzzParse(f *testing.F) {
	f.Add([]byte(`{"name":"mine","batch_size":4,"device":"x","layers":[{"name":"a","forward_s":0.01,"backward_s":0.02,"tensors":[{"name":"a.w","params":1000000}]}]}`))
	f.Add([]byte(`{"name":"x","batch_size":1,"layers":[]}`))
	f.Add([]byte(`{"name":"x","batch_size":-1,"layers":[{"name":"a","forward_s":-1,"backward_s":1e309,"tensors":[{"name":"w","params":-5}]}]}`))
	f.Add([]byte(`{} {}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		p, err := Parse(bytes.NewReader(data))
		if err != nil {
			return
		}
		var buf bytes.Buffer
		if err := p.WriteJSON(&buf); err != nil {
			t.Fatalf("parsed %q, but WriteJSON refuses it: %v", data, err)
		}
		q, err := Parse(&buf)
		if err != nil {
			t.Fatalf("parsed %q, wrote %q, which does not parse: %v", data, buf.Bytes(), err)
		}
		if q.TotalParams() != p.TotalParams() || q.TotalBytes() != p.TotalBytes() || len(q.Layers) != len(p.Layers) {
			t.Fatalf("round trip of %q changed the profile: %d/%d params, %d/%d layers", data, p.TotalParams(), q.TotalParams(), len(p.Layers), len(q.Layers))
		}
	})
}
