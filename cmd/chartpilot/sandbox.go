//go:build !manager

package main

import (
	"os"

	"github.com/landlock-lsm/go-landlock/landlock"
	"golang.org/x/sys/unix"
)

// sandboxStoreHelper limits what the store helper's process may open to
// what a store's client needs: the trust store and the resolver's files,
// read-only, and its own working directory (the manager gives it a fresh
// one). Whatever a request makes the clients try, the manager's
// ServiceAccount token and every other file of the container stay out of
// reach. Where the kernel has no Landlock, nothing is limited (the
// request's credentials are still checked by shape before any client
// sees them); enforced reports whether the limit holds.
func sandboxStoreHelper() (enforced bool, err error) {
	wd, err := os.Getwd()
	if err != nil {
		return false, err
	}
	ro := []string{"/etc/ssl", "/etc/pki", "/etc/ca-certificates", "/usr/share/ca-certificates", "/usr/local/share/ca-certificates"}
	files := []string{"/etc/resolv.conf", "/etc/hosts", "/etc/nsswitch.conf", "/etc/gai.conf", "/etc/host.conf"}
	if d := os.Getenv("SSL_CERT_DIR"); d != "" {
		ro = append(ro, d)
	}
	if f := os.Getenv("SSL_CERT_FILE"); f != "" {
		files = append(files, f)
	}
	err = landlock.V5.BestEffort().RestrictPaths(
		landlock.RODirs(ro...).IgnoreIfMissing(),
		landlock.ROFiles(files...).IgnoreIfMissing(),
		landlock.RWDirs(wd),
	)
	if err != nil {
		return false, err
	}
	return landlockABI() >= 1, nil
}

// landlockABI is the kernel's Landlock ABI version (0: none).
func landlockABI() int {
	v, _, errno := unix.Syscall(unix.SYS_LANDLOCK_CREATE_RULESET, 0, 0, unix.LANDLOCK_CREATE_RULESET_VERSION)
	if errno != 0 {
		return 0
	}
	return int(v)
}
