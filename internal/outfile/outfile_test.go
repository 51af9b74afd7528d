package outfile

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	dir := t.TempDir()
	if err := Check(filepath.Join(dir, "w.json")); err != nil {
		t.Fatalf("a file in an existing directory: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("Check left %v behind", left)
	}
	for _, c := range []struct{ path, want string }{
		{filepath.Join(dir, "missing", "w.json"), "cannot write " + filepath.Join(dir, "missing", "w.json") + ": cannot create a file in " + filepath.Join(dir, "missing") + ": no such file or directory"},
		{dir, "cannot write " + dir + ": it is a directory"},
	} {
		if err := Check(c.path); err == nil || err.Error() != c.want {
			t.Errorf("Check(%s) = %v, want %q", c.path, err, c.want)
		}
	}
}

func TestCheckDir(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "a", "b")
	if err := CheckDir(dir); err != nil {
		t.Fatalf("a new nested directory: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 0 {
		t.Errorf("CheckDir left %v behind", left)
	}
	file := filepath.Join(t.TempDir(), "f")
	if err := os.WriteFile(file, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := CheckDir(filepath.Join(file, "sub")); err == nil || !strings.Contains(err.Error(), "cannot create directory "+filepath.Join(file, "sub")) {
		t.Errorf("a directory below a file: %v", err)
	}
}

func TestWriteFile(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "r.json")
	for _, data := range []string{"first", "second, longer"} {
		if err := WriteFile(path, []byte(data), 0o640); err != nil {
			t.Fatal(err)
		}
		got, err := os.ReadFile(path)
		if err != nil || string(got) != data {
			t.Fatalf("read back %q, %v; want %q", got, err, data)
		}
	}
	if st, _ := os.Stat(path); st.Mode().Perm() != 0o640 {
		t.Errorf("mode %v, want 0640", st.Mode().Perm())
	}
	if left, _ := os.ReadDir(dir); len(left) != 1 {
		t.Errorf("temporary files left: %v", left)
	}
	// Over a directory the rename fails: the error names the path, and no
	// temporary file stays.
	sub := filepath.Join(dir, "sub")
	if err := os.Mkdir(sub, 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(sub, "x"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := WriteFile(sub, []byte("x"), 0o644); err == nil || !strings.HasPrefix(err.Error(), "writing "+sub+": ") {
		t.Errorf("WriteFile over a directory: %v", err)
	}
	if left, _ := os.ReadDir(dir); len(left) != 2 {
		t.Errorf("after a failed write, %v in the directory, want r.json and sub", left)
	}
}
