package testcluster

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

// AuditLog counts requests from the API server's audit log
// (Options.AuditUsers), each request once (a watch is logged when it
// starts and when it ends).
type AuditLog struct {
	Path string
	off  int64
	seen map[string]bool
}

// Requests are counted API requests of one user.
type Requests struct {
	// ByVerb counts by verb; ByResource by "verb resource[/subresource]"
	// (a failed request with " (code)" added); ByNamespace by the object's
	// namespace ("" for cluster-wide requests).
	ByVerb, ByResource, ByNamespace map[string]int
	// InNamespace counts by namespace, then as ByResource.
	InNamespace map[string]map[string]int
	Total       int
}

// Add counts o's requests into r (the requests of two Takes in a row).
func (r *Requests) Add(o Requests) {
	for _, m := range []struct{ to, from map[string]int }{{r.ByVerb, o.ByVerb}, {r.ByResource, o.ByResource}, {r.ByNamespace, o.ByNamespace}} {
		for k, v := range m.from {
			m.to[k] += v
		}
	}
	for ns, counts := range o.InNamespace {
		if r.InNamespace[ns] == nil {
			r.InNamespace[ns] = map[string]int{}
		}
		for k, v := range counts {
			r.InNamespace[ns][k] += v
		}
	}
	r.Total += o.Total
}

// Top lists the n largest ByResource counts, largest first.
func (r Requests) Top(n int) string {
	type kv struct {
		k string
		v int
	}
	var all []kv
	for k, v := range r.ByResource {
		all = append(all, kv{k, v})
	}
	sort.Slice(all, func(i, j int) bool { return all[i].v > all[j].v || (all[i].v == all[j].v && all[i].k < all[j].k) })
	var out []string
	for i := 0; i < len(all) && i < n; i++ {
		out = append(out, all[i].k+" "+strconv.Itoa(all[i].v))
	}
	return strings.Join(out, ", ")
}

// Take counts the requests user made since the last Take.
func (a *AuditLog) Take(user string) (Requests, error) {
	r := Requests{ByVerb: map[string]int{}, ByResource: map[string]int{}, ByNamespace: map[string]int{}, InNamespace: map[string]map[string]int{}}
	f, err := os.Open(a.Path)
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
				Namespace   string `json:"namespace"`
			} `json:"objectRef"`
			RequestURI     string `json:"requestURI"`
			ResponseStatus *struct {
				Code int `json:"code"`
			} `json:"responseStatus"`
		}
		if json.Unmarshal(bytes.TrimSpace(line), &ev) != nil || ev.User.Username != user || a.seen[ev.AuditID] {
			continue
		}
		a.seen[ev.AuditID] = true
		what, ns := ev.RequestURI, ""
		if ev.ObjectRef != nil {
			what, ns = ev.ObjectRef.Resource, ev.ObjectRef.Namespace
			if ev.ObjectRef.Subresource != "" {
				what += "/" + ev.ObjectRef.Subresource
			}
		} else if i := strings.IndexByte(what, '?'); i >= 0 {
			what = what[:i]
		}
		if ev.ResponseStatus != nil && ev.ResponseStatus.Code >= 400 {
			what += " (" + strconv.Itoa(ev.ResponseStatus.Code) + ")"
		}
		r.ByVerb[ev.Verb]++
		r.ByResource[ev.Verb+" "+what]++
		r.ByNamespace[ns]++
		if r.InNamespace[ns] == nil {
			r.InNamespace[ns] = map[string]int{}
		}
		r.InNamespace[ns][ev.Verb+" "+what]++
		r.Total++
	}
	return r, nil
}
