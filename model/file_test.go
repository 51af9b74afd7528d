package model

import (
	"bytes"
	"os"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
)

func TestJSONRoundTrip(t *testing.T) {
	for _, name := range Zoo() {
		p, _ := Get(name)
		var buf bytes.Buffer
		if err := p.WriteJSON(&buf); err != nil {
			t.Fatalf("%s: WriteJSON: %v", name, err)
		}
		q, err := Parse(&buf)
		if err != nil {
			t.Fatalf("%s: Parse: %v", name, err)
		}
		if !reflect.DeepEqual(p, q) {
			t.Errorf("%s: round trip changed the profile", name)
		}
	}
}

const smallJSON = `{
  "name": "tiny",
  "batch_size": 8,
  "device": "test",
  "layers": [
    {"name": "fc", "forward_s": 0.001, "backward_s": 0.002,
     "tensors": [{"name": "fc.weight", "params": 1000}]}
  ]
}`

func TestParseDefaultsBytesPerParam(t *testing.T) {
	p, err := Parse(strings.NewReader(smallJSON))
	if err != nil {
		t.Fatal(err)
	}
	if p.BytesPerParam != 4 || p.TotalBytes() != 4000 {
		t.Errorf("BytesPerParam = %d, TotalBytes = %d", p.BytesPerParam, p.TotalBytes())
	}
}

func TestParseRejects(t *testing.T) {
	cases := []struct {
		name, in string
		want     []string
	}{
		{"unknown field", strings.Replace(smallJSON, `"device"`, `"devise"`, 1), []string{"unknown field", "devise"}},
		{"unknown tensor field", strings.Replace(smallJSON, `"params": 1000`, `"params": 1000, "dtype": "f32"`, 1), []string{"dtype"}},
		{"malformed", smallJSON[:40], []string{"malformed JSON"}},
		{"syntax", `{"name": "x",}`, []string{"malformed JSON at byte offset"}},
		{"empty", ``, []string{"empty input"}},
		{"trailing", smallJSON + ` {}`, []string{"unexpected data after"}},
		{"negative params", strings.Replace(smallJSON, `1000`, `-5`, 1),
			[]string{`layer 0 "fc": tensor "fc.weight": params must be > 0, got -5`}},
		{"NaN time", strings.Replace(smallJSON, `0.001`, `NaN`, 1), []string{"malformed JSON"}},
		{"negative time", strings.Replace(smallJSON, `0.002`, `-0.002`, 1), []string{"backward_s", "-0.002"}},
		{"string params", strings.Replace(smallJSON, `1000`, `"1000"`, 1), []string{"params"}},
		{"duplicate tensor", `{"name":"d","batch_size":1,"layers":[
			{"name":"a","forward_s":0,"backward_s":0,"tensors":[{"name":"w","params":1}]},
			{"name":"b","forward_s":0,"backward_s":0,"tensors":[{"name":"w","params":1}]}]}`,
			[]string{`tensor "w"`, "duplicate"}},
		{"empty layer", `{"name":"d","batch_size":1,"layers":[{"name":"a","forward_s":0,"backward_s":0,"tensors":[]}]}`,
			[]string{`layer 0 "a"`, "at least one tensor"}},
		{"no layers", `{"name":"d","batch_size":1,"layers":[]}`, []string{"at least one layer"}},
		{"negative bytes", strings.Replace(smallJSON, `"device": "test",`, `"device": "test", "bytes_per_param": -2,`, 1),
			[]string{"bytes_per_param", "-2"}},
	}
	for _, c := range cases {
		_, err := Parse(strings.NewReader(c.in))
		if err == nil {
			t.Errorf("%s: Parse accepted %s", c.name, c.in)
			continue
		}
		for _, w := range c.want {
			if !strings.Contains(err.Error(), w) {
				t.Errorf("%s: error %q does not contain %q", c.name, err, w)
			}
		}
	}
}

func TestLoad(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "good.json")
	p, _ := Get("toy3")
	var buf bytes.Buffer
	if err := p.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(good, buf.Bytes(), 0o644); err != nil {
		t.Fatal(err)
	}
	q, err := Load(good)
	if err != nil || !reflect.DeepEqual(p, q) {
		t.Fatalf("Load(good) = %v, %v", q, err)
	}

	bad := filepath.Join(dir, "x.json")
	if err := os.WriteFile(bad, []byte(strings.Replace(smallJSON, `1000`, `-5`, 1)), 0o644); err != nil {
		t.Fatal(err)
	}
	_, err = Load(bad)
	want := `profile "` + bad + `": layer 0 "fc": tensor "fc.weight": params must be > 0, got -5`
	if err == nil || err.Error() != want {
		t.Errorf("Load(bad) error = %v, want %s", err, want)
	}

	missing := filepath.Join(dir, "missing.json")
	if _, err := Load(missing); err == nil || !strings.Contains(err.Error(), missing) {
		t.Errorf("Load(missing) error = %v", err)
	}
}

func TestWriteJSONRejectsInvalid(t *testing.T) {
	p := validProfile()
	p.Layers[0].Tensors[0].Params = -1
	var buf bytes.Buffer
	if err := p.WriteJSON(&buf); err == nil || buf.Len() != 0 {
		t.Errorf("WriteJSON(invalid) = %v, wrote %d bytes", err, buf.Len())
	}
}
