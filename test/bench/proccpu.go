package main

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
)

// procCPU is the CPU seconds (user and system) of the bench and each
// process it started, directly or not, by command name: the cluster's
// components, the operator (chartpilot-manager) and the bench itself.
type procCPU map[string]float64

// snapProcCPU reads procCPU from /proc. Processes that ended since the
// last snapshot are missing from it; the bench's phases start and stop
// none of the cluster's.
func snapProcCPU() procCPU {
	type proc struct {
		ppid int
		comm string
		cpu  float64
	}
	procs := map[int]proc{}
	stats, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, path := range stats {
		b, err := os.ReadFile(path)
		if err != nil {
			continue
		}
		s := string(b)
		open, closing := strings.IndexByte(s, '('), strings.LastIndexByte(s, ')')
		if open < 0 || closing < open || closing+2 > len(s) {
			continue
		}
		f := strings.Fields(s[closing+2:])
		if len(f) < 13 {
			continue
		}
		pid, err1 := strconv.Atoi(strings.TrimSpace(s[:open]))
		ppid, err2 := strconv.Atoi(f[1])
		utime, _ := strconv.ParseFloat(f[11], 64)
		stime, _ := strconv.ParseFloat(f[12], 64)
		if err1 != nil || err2 != nil {
			continue
		}
		procs[pid] = proc{ppid: ppid, comm: s[open+1 : closing], cpu: (utime + stime) / 100}
	}
	self := os.Getpid()
	out := procCPU{}
	for pid, p := range procs {
		// Walk up to the bench (or to init: not one of ours).
		for up, hops := pid, 0; up > 1 && hops < 64; up, hops = procs[up].ppid, hops+1 {
			if up == self {
				out[p.comm] += p.cpu
				break
			}
			if _, ok := procs[up]; !ok {
				break
			}
		}
	}
	return out
}

// since is what each process used between before and p.
func (p procCPU) since(before procCPU) procCPU {
	out := procCPU{}
	for k, v := range p {
		if d := v - before[k]; d > 0.005 {
			out[k] = d
		}
	}
	return out
}

// operatorComm is the operator's command name in /proc (15 characters at
// most).
const operatorComm = "chartpilot-mana"

// printProcCPU prints, for each phase, the CPU seconds of each process
// until convergence in the direct baseline, the baseline with chartpilot's
// writes, and chartpilot: where the difference goes.
func printProcCPU(rows []result) {
	if !anyRow(rows, func(r result) bool { return r.direct != nil }) {
		return
	}
	fmt.Println("\nCPU seconds by process from each phase's start to its convergence (the cluster's components, the operator, the bench): direct / direct + writes / chartpilot:")
	fmt.Println()
	fmt.Println("| N | phase | process | direct | direct + writes | chartpilot | chartpilot − (direct + writes) |")
	fmt.Println("|---:|---|---|---:|---:|---:|---:|")
	for _, r := range rows {
		plain := r.directPairs(r.direct)
		writes := r.directPairs(r.directWrites)
		for i, pair := range plain {
			var withWrites procCPU
			if i < len(writes) {
				withWrites = writes[i].d.procs
			}
			names := map[string]bool{}
			for _, m := range []procCPU{pair.d.procs, withWrites, pair.c.procs} {
				for k := range m {
					names[k] = true
				}
			}
			all := procCPU{}
			for k := range names {
				all[k] = pair.c.procs[k]
			}
			total := [3]float64{}
			for _, k := range strings.Split(all.order(), "\x00") {
				if k == "" {
					continue
				}
				a, b, c := pair.d.procs[k], withWrites[k], pair.c.procs[k]
				total[0], total[1], total[2] = total[0]+a, total[1]+b, total[2]+c
				if a < 0.05 && b < 0.05 && c < 0.05 {
					continue
				}
				fmt.Printf("| %d | %s | %s | %.1f | %.1f | %.1f | %+.1f |\n", r.n, pair.name, displayComm(k), a, b, c, c-b)
			}
			fmt.Printf("| %d | %s | **all** | %.1f | %.1f | %.1f | %+.1f |\n", r.n, pair.name, total[0], total[1], total[2], total[2]-total[1])
		}
	}
}

// order is p's names, the busiest first, joined by NUL.
func (p procCPU) order() string {
	names := make([]string, 0, len(p))
	for k := range p {
		names = append(names, k)
	}
	sort.Slice(names, func(i, j int) bool {
		return p[names[i]] > p[names[j]] || p[names[i]] == p[names[j]] && names[i] < names[j]
	})
	return strings.Join(names, "\x00")
}

// displayComm names the operator and the bench in the table.
func displayComm(comm string) string {
	switch comm {
	case operatorComm:
		return "operator"
	case filepath.Base(os.Args[0]):
		return "bench"
	}
	return comm
}
