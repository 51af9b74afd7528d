package curves

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestReadAndPlot(t *testing.T) {
	dir := t.TempDir()
	f := filepath.Join(dir, "run.txt")
	body := "log line\n{\"backend\": \"ddp\", \"losses\": [1, 0.5]}\nnot json {\n{\"backend\": \"ddp\", \"losses\": [2.5, 2.0, 1.5]}\n{\"other\": 1}\n"
	if err := os.WriteFile(f, []byte(body), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Read(f, "losses")
	if err != nil || len(got) != 3 || got[0] != 2.5 || got[2] != 1.5 {
		t.Fatalf("Read = %v, %v; want the last line's [2.5 2 1.5]", got, err)
	}
	out := filepath.Join(dir, "p.png")
	if err := Plot(out, "t", "loss", []Series{{"a", got}, {"b", []float64{3, 2, 1}}}); err != nil {
		t.Fatal(err)
	}
	if b, err := os.ReadFile(out); err != nil || len(b) < 1000 || string(b[1:4]) != "PNG" {
		t.Errorf("plot: %d bytes, %v; want a PNG", len(b), err)
	}
	for _, c := range []struct{ body, want string }{
		{"{\"losses\": \"x\"}\n", "not an array"},
		{"{\"loss\": [1]}\n", "no JSON line with field \"losses\""},
		{"{\"losses\": []}\n", "empty"},
	} {
		if err := os.WriteFile(f, []byte(c.body), 0o644); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(f, "losses"); err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Read(%q) = %v, want an error containing %q", c.body, err, c.want)
		}
	}
	if _, err := Read(filepath.Join(dir, "none"), "losses"); err == nil {
		t.Error("Read of a missing file succeeded")
	}
	if err := Plot(out, "t", "loss", nil); err == nil {
		t.Error("Plot of nothing succeeded")
	}
}
