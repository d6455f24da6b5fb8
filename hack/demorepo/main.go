// Command demorepo is the demo's chart repository: `serve` serves a
// directory over HTTP on loopback, `publish` packages test/charts/webapp at
// a version into it and rewrites its index (with -unhealthy, a version
// whose pods never become ready: no node matches their selector).
//
//	demorepo serve -dir D                      prints "serving http://127.0.0.1:PORT"
//	demorepo publish -dir D -url URL -version 1.1.0 [-unhealthy]
package main

import (
	"flag"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"

	"github.com/chartpilot/chartpilot/internal/helm/helmtest"
)

func main() {
	if len(os.Args) < 2 {
		fail(fmt.Errorf("usage: demorepo serve|publish ..."))
	}
	fs := flag.NewFlagSet("demorepo "+os.Args[1], flag.ExitOnError)
	dir := fs.String("dir", "", "the repository's directory")
	url := fs.String("url", "", "publish: the repository's URL (for the index)")
	version := fs.String("version", "", "publish: the chart version")
	chart := fs.String("chart", "test/charts/webapp", "publish: the chart directory")
	unhealthy := fs.Bool("unhealthy", false, "publish: pods that never become ready")
	_ = fs.Parse(os.Args[2:])
	if *dir == "" {
		fail(fmt.Errorf("-dir is required"))
	}
	switch os.Args[1] {
	case "serve":
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			fail(err)
		}
		fmt.Printf("serving http://%s\n", l.Addr())
		fail(http.Serve(l, http.FileServer(http.Dir(*dir))))
	case "publish":
		src := *chart
		if *unhealthy {
			tmp, err := os.MkdirTemp("", "demorepo-")
			if err != nil {
				fail(err)
			}
			defer os.RemoveAll(tmp)
			src = filepath.Join(tmp, "webapp")
			if err := os.CopyFS(src, os.DirFS(*chart)); err != nil {
				fail(err)
			}
			f, err := os.OpenFile(filepath.Join(src, "values.yaml"), os.O_APPEND|os.O_WRONLY, 0)
			if err != nil {
				fail(err)
			}
			fmt.Fprintln(f, "nodeSelector: {chartpilot.dev/no-such-node: \"true\"}")
			f.Close()
		}
		if _, err := helmtest.PackageAs(src, *version, *dir); err != nil {
			fail(err)
		}
		if err := helmtest.WriteIndex(*dir, *url); err != nil {
			fail(err)
		}
		fmt.Printf("published webapp %s%s\n", *version, map[bool]string{true: " (its pods never become ready)", false: ""}[*unhealthy])
	default:
		fail(fmt.Errorf("unknown command %q: serve or publish", os.Args[1]))
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "demorepo:", err)
	os.Exit(1)
}
