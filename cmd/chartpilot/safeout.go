package main

import (
	"fmt"
	"io"
	"unicode/utf8"
)

// safeText is a writer for text that tenants wrote (condition messages,
// events, names): control characters other than newline and tab, and the
// C1 controls, are written escaped (\u001b), so that no escape sequence
// of theirs reaches the terminal (moving the cursor, rewriting lines,
// setting the window title).
type safeText struct{ w io.Writer }

func terminalSafe(w io.Writer) io.Writer { return safeText{w} }

func (s safeText) Write(p []byte) (int, error) {
	clean := true
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		if unsafeRune(r) {
			clean = false
			break
		}
		i += size
	}
	if clean {
		return s.w.Write(p)
	}
	out := make([]byte, 0, len(p)+16)
	for i := 0; i < len(p); {
		r, size := utf8.DecodeRune(p[i:])
		if unsafeRune(r) {
			out = fmt.Appendf(out, "\\u%04x", r)
		} else {
			out = append(out, p[i:i+size]...)
		}
		i += size
	}
	if _, err := s.w.Write(out); err != nil {
		return 0, err
	}
	return len(p), nil
}

func unsafeRune(r rune) bool {
	return (r < 0x20 && r != '\n' && r != '\t') || r == 0x7f || (r >= 0x80 && r <= 0x9f)
}
