// Command podutil is the one program of the images the local cluster's real
// nodes run: with no arguments it is the pod sandbox's pause process (it
// holds the pod's namespaces, reaps orphans and exits on SIGTERM); with
// `serve ADDR` it answers every HTTP request at ADDR with the pod's host
// name, so a test can tell a running container from a simulated one.
package main

import (
	"fmt"
	"io"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) == 3 && os.Args[1] == "serve" {
		host, _ := os.Hostname()
		err := http.ListenAndServe(os.Args[2], http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
			fmt.Fprintf(w, "hello from %s\n", host)
		}))
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	if len(os.Args) == 3 && os.Args[1] == "get" {
		c := &http.Client{Timeout: 10 * time.Second}
		resp, err := c.Get(os.Args[2])
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		_, _ = io.Copy(os.Stdout, resp.Body)
		os.Exit(0)
	}
	if len(os.Args) != 1 {
		fmt.Fprintln(os.Stderr, "usage: podutil | podutil serve ADDR | podutil get URL")
		os.Exit(2)
	}
	// Ignoring SIGCHLD makes the kernel reap exited children at once.
	signal.Ignore(syscall.SIGCHLD)
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	<-stop
}
