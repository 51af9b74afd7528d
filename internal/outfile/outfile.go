// Package outfile writes the results of long commands. Check and CheckDir
// tell up front whether a result can be written where the user asked, so
// that an hour of simulation is not lost to a mistyped path at the end;
// WriteFile writes a file whole (a temporary file in the same directory,
// renamed into place), so that an interrupted write never leaves half a
// file where a previous result stood.
//
// It knows nothing of what the files hold.
package outfile

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// Check reports whether a file can be written at path: path is not a
// directory, and its directory exists and takes a new file. It leaves
// nothing behind.
func Check(path string) error {
	if st, err := os.Stat(path); err == nil && st.IsDir() {
		return fmt.Errorf("cannot write %s: it is a directory", path)
	}
	if err := probe(filepath.Dir(path)); err != nil {
		return fmt.Errorf("cannot write %s: %w", path, err)
	}
	return nil
}

// CheckDir creates dir and its parents where missing and reports whether
// it takes new files.
func CheckDir(dir string) error {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("cannot create directory %s: %w", dir, cause(err))
	}
	return probe(dir)
}

// probe creates a file in dir and removes it again.
func probe(dir string) error {
	f, err := os.CreateTemp(dir, ".autobyte-check-*")
	if err != nil {
		return fmt.Errorf("cannot create a file in %s: %w", dir, cause(err))
	}
	name := f.Name()
	f.Close()
	return os.Remove(name)
}

// WriteFile writes data to path whole: into a temporary file in path's
// directory, flushed to disk, then renamed over path. A reader sees the old
// file or the new one, never a part.
func WriteFile(path string, data []byte, perm os.FileMode) error {
	f, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp-*")
	if err != nil {
		return fmt.Errorf("writing %s: %w", path, cause(err))
	}
	tmp := f.Name()
	_, err = f.Write(data)
	if err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Chmod(tmp, perm)
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("writing %s: %w", path, cause(err))
	}
	return nil
}

// cause is the reason of a path error, without the path (the callers name
// the path the user gave, not a temporary one).
func cause(err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) {
		return pe.Err
	}
	var le *os.LinkError
	if errors.As(err, &le) {
		return le.Err
	}
	return err
}
