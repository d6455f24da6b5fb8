package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"io"
	"os"
	"sort"
	"strconv"
	"strings"
)

// operatorUser is the user the benchmarked operator authenticates as: the
// API server's audit log records its requests, and only its.
const operatorUser = "chartpilot-operator"

// auditLog counts the operator's requests from the API server's audit log,
// each request once (a watch appears when it starts and when it ends).
type auditLog struct {
	path string
	off  int64
	seen map[string]bool
}

// requests are counted API requests by verb and by verb+resource.
type requests struct {
	byVerb     map[string]int
	byResource map[string]int
	total      int
}

func (r requests) perResource(n int) float64 {
	if n == 0 {
		return float64(r.total)
	}
	return float64(r.total) / float64(n)
}

// top lists the n largest verb+resource counts, largest first.
func (r requests) top(n int) string {
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range r.byResource {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || (all[i].v == all[j].v && all[i].k < all[j].k) })
	var out []string
	for i := 0; i < len(all) && i < n; i++ {
		out = append(out, all[i].k+" "+strconv.Itoa(all[i].v))
	}
	return strings.Join(out, ", ")
}

// take counts the requests logged since the last take.
func (a *auditLog) take() (requests, error) {
	r := requests{byVerb: map[string]int{}, byResource: map[string]int{}}
	f, err := os.Open(a.path)
	if err != nil {
		return r, err
	}
	defer f.Close()
	if _, err := f.Seek(a.off, io.SeekStart); err != nil {
		return r, err
	}
	if a.seen == nil {
		a.seen = map[string]bool{}
	}
	br := bufio.NewReaderSize(f, 1<<20)
	for {
		line, err := br.ReadBytes('\n')
		if err != nil {
			break // a line still being written is read next time
		}
		a.off += int64(len(line))
		var ev struct {
			AuditID   string                    `json:"auditID"`
			Verb      string                    `json:"verb"`
			User      struct{ Username string } `json:"user"`
			ObjectRef *struct {
				Resource    string `json:"resource"`
				Subresource string `json:"subresource"`
			} `json:"objectRef"`
			RequestURI     string `json:"requestURI"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
		}
		if json.Unmarshal(bytes.TrimSpace(line), &ev) != nil || ev.User.Username != operatorUser || a.seen[ev.AuditID] {
			continue
		}
		a.seen[ev.AuditID] = true
		what := ev.RequestURI
		if ev.ObjectRef != nil {
			what = ev.ObjectRef.Resource
			if ev.ObjectRef.Subresource != "" {
				what += "/" + ev.ObjectRef.Subresource
			}
		} else if i := strings.IndexByte(what, '?'); i >= 0 {
			what = what[:i]
		}
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code >= 400 {
			what += " (" + strconv.Itoa(ev.ResponseStatus.Code) + ")"
		}
		r.byVerb[ev.Verb]++
		r.byResource[ev.Verb+" "+what]++
		r.total++
	}
	return r, nil
}
