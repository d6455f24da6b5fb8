package main

import (
	"io"
	"os"
	"strings"

	"golang.org/x/term"
)

// ANSI colours of the READY column.
const (
	green = "\x1b[32m"
	red   = "\x1b[31m"
	amber = "\x1b[33m"
	reset = "\x1b[0m"
)

// colourful reports whether w is a terminal that takes colour: not when
// NO_COLOR is set (no-color.org), nor when TERM is dumb, nor into a pipe
// or a file.
func colourful(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok || !term.IsTerminal(int(f.Fd())) {
		return false
	}
	return os.Getenv("NO_COLOR") == "" && os.Getenv("TERM") != "dumb"
}

// colourReady colours the READY cell of each line of a table that
// tabwriter has already aligned (so the escape codes, which a terminal
// does not show, cannot shift a column): True green, False red, anything
// else amber.
func colourReady(table string) string {
	lines := strings.Split(table, "\n")
	if len(lines) == 0 {
		return table
	}
	col := strings.Index(lines[0], "READY")
	if col < 0 {
		return table
	}
	for i := 1; i < len(lines); i++ {
		l := lines[i]
		if len(l) <= col {
			continue
		}
		cell := l[col:]
		word := cell
		if j := strings.Index(cell, " "); j >= 0 {
			word = cell[:j]
		}
		c := amber
		switch word {
		case "True":
			c = green
		case "False":
			c = red
		}
		lines[i] = l[:col] + c + word + reset + cell[len(word):]
	}
	return strings.Join(lines, "\n")
}
