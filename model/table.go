package model

import (
	"fmt"
	"io"
	"strconv"
	"strings"
	"unicode/utf8"
)

// WriteTable writes one aligned row per profile, for `autobyte models`:
// name, layers, tensors, parameters, gradient size (decimal units), forward +
// backward compute time per iteration, batch size and the size of the
// largest tensor. A nil profile is an error; nothing is written then.
func WriteTable(w io.Writer, profiles []*Profile) error {
	header := []string{"NAME", "LAYERS", "TENSORS", "PARAMS", "SIZE", "COMPUTE", "BATCH", "LARGEST"}
	rows := [][]string{header}
	for i, p := range profiles {
		if p == nil {
			return fmt.Errorf("model table: profile %d is nil", i)
		}
		largest := "-"
		if t, ok := p.LargestTensor(); ok {
			largest = formatBytes(t.Params * int64(p.BytesPerParam))
		}
		rows = append(rows, []string{
			p.Name,
			strconv.Itoa(len(p.Layers)),
			strconv.Itoa(p.NumTensors()),
			groupDigits(p.TotalParams()),
			formatBytes(p.TotalBytes()),
			formatSeconds(p.ForwardS() + p.BackwardS()),
			strconv.Itoa(p.BatchSize),
			largest,
		})
	}
	width := make([]int, len(header))
	for _, r := range rows {
		for j, c := range r {
			width[j] = max(width[j], utf8.RuneCountInString(c))
		}
	}
	var sb strings.Builder
	for _, r := range rows {
		for j, c := range r {
			pad := strings.Repeat(" ", width[j]-utf8.RuneCountInString(c))
			switch {
			case j == 0: // name: left-aligned
				sb.WriteString(c)
				if j < len(r)-1 {
					sb.WriteString(pad)
				}
			default: // numbers: right-aligned
				sb.WriteString("  ")
				sb.WriteString(pad)
				sb.WriteString(c)
			}
		}
		sb.WriteByte('\n')
	}
	if _, err := io.WriteString(w, sb.String()); err != nil {
		return fmt.Errorf("model table: %w", err)
	}
	return nil
}

// formatBytes renders n bytes in decimal units with one decimal: "553.4 MB".
func formatBytes(n int64) string {
	if n < 1000 && n > -1000 {
		return fmt.Sprintf("%d B", n)
	}
	v := float64(n)
	for _, unit := range []string{"kB", "MB", "GB", "TB", "PB"} {
		v /= 1000
		if v < 999.95 && v > -999.95 {
			return fmt.Sprintf("%.1f %s", v, unit)
		}
	}
	return fmt.Sprintf("%.1f EB", v/1000)
}

// formatSeconds renders a duration in s, ms or µs with one decimal.
func formatSeconds(s float64) string {
	switch {
	case s >= 1 || s == 0:
		return fmt.Sprintf("%.1f s", s)
	case s >= 1e-3:
		return fmt.Sprintf("%.1f ms", s*1e3)
	default:
		return fmt.Sprintf("%.1f µs", s*1e6)
	}
}

// groupDigits renders n with commas between groups of three digits.
func groupDigits(n int64) string {
	s := strconv.FormatInt(n, 10)
	neg := strings.HasPrefix(s, "-")
	if neg {
		s = s[1:]
	}
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}
