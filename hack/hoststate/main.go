// Command hoststate records the parts of this machine that the real nodes
// could change (see internal/testing/testcluster/hoststate) and compares them with
// an earlier record: .ci/run saves one before `make test` and compares
// after it.
//
//	hoststate save FILE      record the machine in FILE
//	hoststate compare FILE   list what differs from FILE; exit 1 if anything does
package main

import (
	"encoding/json"
	"fmt"
	"os"

	"github.com/chartpilot/chartpilot/internal/testing/testcluster/hoststate"
)

func main() {
	if len(os.Args) != 3 || (os.Args[1] != "save" && os.Args[1] != "compare") {
		fmt.Fprintln(os.Stderr, "usage: hoststate save|compare FILE")
		os.Exit(2)
	}
	now, err := hoststate.Take()
	if err != nil {
		fmt.Fprintf(os.Stderr, "hoststate: %v\n", err)
		os.Exit(2)
	}
	file := os.Args[2]
	if os.Args[1] == "save" {
		b, _ := json.Marshal(now)
		if err := os.WriteFile(file, b, 0o644); err != nil {
			fmt.Fprintf(os.Stderr, "hoststate: %v\n", err)
			os.Exit(2)
		}
		fmt.Printf("hoststate: recorded %s in %s\n", now.Summary(), file)
		return
	}
	b, err := os.ReadFile(file)
	if err != nil {
		fmt.Fprintf(os.Stderr, "hoststate: %v\n", err)
		os.Exit(2)
	}
	var before hoststate.State
	if err := json.Unmarshal(b, &before); err != nil {
		fmt.Fprintf(os.Stderr, "hoststate: %s: %v\n", file, err)
		os.Exit(2)
	}
	var diff []string
	for _, d := range hoststate.Diff(before, now) {
		if hoststate.Swept(d) {
			fmt.Println("hoststate: removed what a killed run had left:", d)
			continue
		}
		diff = append(diff, d)
	}
	fmt.Printf("hoststate: compared %s with %s\n", now.Summary(), file)
	if len(diff) == 0 {
		fmt.Println("hoststate: the machine is as it was")
		return
	}
	fmt.Printf("hoststate: %d differences:\n", len(diff))
	for _, d := range diff {
		fmt.Println("  " + d)
	}
	os.Exit(1)
}
