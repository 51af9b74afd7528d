package model

import (
	"bytes"
	"strings"
	"testing"
)

func TestWriteTable(t *testing.T) {
	var ps []*Profile
	for _, n := range []string{"vgg16", "toy3"} {
		p, _ := Get(n)
		ps = append(ps, p)
	}
	var buf bytes.Buffer
	if err := WriteTable(&buf, ps); err != nil {
		t.Fatal(err)
	}
	lines := strings.Split(strings.TrimRight(buf.String(), "\n"), "\n")
	if len(lines) != 3 {
		t.Fatalf("got %d lines:\n%s", len(lines), buf.String())
	}
	for _, w := range []string{"vgg16", "138,357,544", "553.4 MB", "411.0 MB", "32"} {
		if !strings.Contains(lines[1], w) {
			t.Errorf("vgg16 row %q lacks %q", lines[1], w)
		}
	}
	for _, w := range []string{"toy3", "1,500,000", "6.0 MB", "6.0 s", "3.0 MB"} {
		if !strings.Contains(lines[2], w) {
			t.Errorf("toy3 row %q lacks %q", lines[2], w)
		}
	}
	if len([]rune(lines[0])) != len([]rune(lines[1])) || len([]rune(lines[1])) != len([]rune(lines[2])) {
		t.Errorf("rows not aligned:\n%s", buf.String())
	}
	if err := WriteTable(&buf, []*Profile{nil}); err == nil {
		t.Error("nil profile accepted")
	}
}

func TestFormatters(t *testing.T) {
	for in, want := range map[int64]string{0: "0 B", 999: "999 B", 1000: "1.0 kB", 553_430_176: "553.4 MB", 999_960: "1.0 MB", 2_000_000_000: "2.0 GB"} {
		if got := formatBytes(in); got != want {
			t.Errorf("formatBytes(%d) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[int64]string{0: "0", 999: "999", 1000: "1,000", 25_557_032: "25,557,032", -1234: "-1,234"} {
		if got := groupDigits(in); got != want {
			t.Errorf("groupDigits(%d) = %q, want %q", in, got, want)
		}
	}
	for in, want := range map[float64]string{0.1: "100.0 ms", 6: "6.0 s", 1.2e-6: "1.2 µs"} {
		if got := formatSeconds(in); got != want {
			t.Errorf("formatSeconds(%v) = %q, want %q", in, got, want)
		}
	}
}
