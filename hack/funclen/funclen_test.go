package funclen

import (
	"bufio"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
)

// TestFunctionsStayShort: no function is longer than Limit lines but
// those longer.txt lists, and none of those grew.
func TestFunctionsStayShort(t *testing.T) {
	long, err := Measure(filepath.Join("..", ".."))
	if err != nil {
		t.Fatal(err)
	}
	allowed := readAllowed(t)
	seen := map[string]bool{}
	for _, f := range long {
		seen[f.Name] = true
		max, ok := allowed[f.Name]
		switch {
		case !ok:
			t.Errorf("%s is %d lines, over %d: split it", f.Name, f.Lines, Limit)
		case f.Lines > max:
			t.Errorf("%s grew to %d lines (longer.txt allows %d): split it rather than raise the number", f.Name, f.Lines, max)
		case f.Lines < max:
			t.Errorf("%s shrank to %d lines: write %d in longer.txt", f.Name, f.Lines, f.Lines)
		}
	}
	for name := range allowed {
		if !seen[name] {
			t.Errorf("%s is no longer over %d lines (or gone): remove it from longer.txt", name, Limit)
		}
	}
}

func readAllowed(t *testing.T) map[string]int {
	t.Helper()
	f, err := os.Open("longer.txt")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	out := map[string]int{}
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, n, ok := strings.Cut(line, " ")
		lines, err := strconv.Atoi(strings.TrimSpace(n))
		if !ok || err != nil {
			t.Fatalf("longer.txt: %q is not NAME LINES", line)
		}
		out[name] = lines
	}
	return out
}

// TestMeasure: a function's lines run from func to its closing brace;
// methods are named by their receiver's type.
func TestMeasure(t *testing.T) {
	dir := t.TempDir()
	body := strings.Repeat("\t_ = 1\n", Limit-2)
	src := "package x\n\ntype T struct{}\n\nfunc fits() {\n" + body + "}\n\nfunc (t *T) over() {\n" + body + "\t_ = 2\n}\n"
	if err := os.WriteFile(filepath.Join(dir, "x.go"), []byte(src), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "x_test.go"), []byte("package x\n\nfunc long() {\n"+body+body+"}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	got, err := Measure(dir)
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 1 || got[0] != (Func{Name: "x.go:T.over", Lines: Limit + 1}) {
		t.Errorf("Measure = %+v, want only x.go:T.over at %d lines", got, Limit+1)
	}
}
