package main

import (
	"bytes"
	"context"
	"fmt"
	"sort"
	"strings"

	"k8s.io/client-go/kubernetes"
)

// apiCounts is what the API server served to every client (the cluster's
// components, the operator, the bench), from its own metrics: requests by
// verb and resource, watch events by resource and their bytes.
type apiCounts map[string]float64

// apiServer, when set (startCluster sets it), reads the newest cluster's
// API server's metrics and profiles.
var apiServer kubernetes.Interface

// snapAPI reads apiCounts now (empty when the API server is not known or
// does not answer: the tables then show nothing).
func snapAPI() apiCounts {
	out := apiCounts{}
	if apiServer == nil {
		return out
	}
	b, err := apiServer.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(context.Background())
	if err != nil {
		return out
	}
	m, err := parseMetrics(bytes.NewReader(b))
	if err != nil {
		return out
	}
	for _, s := range m["apiserver_request_total"] {
		res := s.labels["resource"]
		if sub := s.labels["subresource"]; sub != "" {
			res += "/" + sub
		}
		if res == "" {
			continue // discovery, health, metrics: not the work
		}
		out["request "+strings.ToLower(s.labels["verb"])+" "+res] += s.value
	}
	for _, s := range m["apiserver_watch_events_total"] {
		out["watch events "+s.labels["resource"]] += s.value
	}
	for _, s := range m["apiserver_watch_events_sizes_sum"] {
		out["watch KiB "+s.labels["resource"]] += s.value / 1024
	}
	return out
}

// since is what was served between before and c.
func (c apiCounts) since(before apiCounts) apiCounts {
	out := apiCounts{}
	for k, v := range c {
		if d := v - before[k]; d > 0 {
			out[k] = d
		}
	}
	return out
}

// printAPICounts prints, for each phase, what the API server served to
// every client in the direct baseline with chartpilot's writes and in
// chartpilot's phase, the largest differences first.
func printAPICounts(rows []result) {
	if !anyRow(rows, func(r result) bool { return r.directWrites != nil }) {
		return
	}
	fmt.Println("\nWhat the API server served to every client (the cluster's components, the operator, the bench) until convergence, from its own metrics (apiserver_request_total, apiserver_watch_events_total and _sizes): direct + writes / chartpilot, the largest differences:")
	fmt.Println()
	fmt.Println("| N | phase | what | direct + writes | chartpilot | difference |")
	fmt.Println("|---:|---|---|---:|---:|---:|")
	for _, r := range rows {
		for _, pair := range r.directPairs(r.directWrites) {
			keys := map[string]bool{}
			for k := range pair.d.api {
				keys[k] = true
			}
			for k := range pair.c.api {
				keys[k] = true
			}
			var list []string
			for k := range keys {
				list = append(list, k)
			}
			diff := func(k string) float64 { return pair.c.api[k] - pair.d.api[k] }
			sort.Slice(list, func(i, j int) bool {
				a, b := diff(list[i]), diff(list[j])
				if a < 0 {
					a = -a
				}
				if b < 0 {
					b = -b
				}
				return a > b || a == b && list[i] < list[j]
			})
			for i, k := range list {
				if i == 12 {
					break
				}
				fmt.Printf("| %d | %s | %s | %.0f | %.0f | %+.0f |\n", r.n, pair.name, k, pair.d.api[k], pair.c.api[k], diff(k))
			}
		}
	}
}
