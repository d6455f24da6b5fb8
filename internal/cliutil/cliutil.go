// Package cliutil holds start-up checks shared by the commands: each turns a
// bad flag or environment into one error line that names the fix.
package cliutil

import (
	"errors"
	"fmt"
	"net"
	"os"
	"syscall"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
)

// CheckPortFree returns a clear error when addr (host:port) cannot be bound.
// flag names the command-line flag that chose addr. An empty addr or "0"
// (serving disabled) is always fine.
func CheckPortFree(addr, flag string) error {
	if addr == "" || addr == "0" {
		return nil
	}
	l, err := net.Listen("tcp", addr)
	if err != nil {
		if errors.Is(err, syscall.EADDRINUSE) {
			return fmt.Errorf("address %s is already in use: stop the process holding it or choose another with %s", addr, flag)
		}
		return fmt.Errorf("cannot listen on %s (%s): %w", addr, flag, err)
	}
	return l.Close()
}

// LoadKubeconfig builds a client configuration. path may be empty: then
// $KUBECONFIG, ~/.kube/config and the in-cluster configuration are tried, in
// that order. Errors say which file failed and how to fix it.
func LoadKubeconfig(path string) (*rest.Config, error) {
	if path != "" {
		if _, err := os.Stat(path); err != nil {
			return nil, fmt.Errorf("kubeconfig %s cannot be read (%w): pass an existing file with --kubeconfig", path, errors.Unwrap(err))
		}
		if _, err := clientcmd.LoadFromFile(path); err != nil {
			return nil, fmt.Errorf("kubeconfig %s does not parse: %w: pass a valid kubeconfig with --kubeconfig", path, err)
		}
		cfg, err := clientcmd.BuildConfigFromFlags("", path)
		if err != nil {
			return nil, fmt.Errorf("kubeconfig %s is not usable: %w: check its current-context, cluster and user", path, err)
		}
		return cfg, nil
	}
	rules := clientcmd.NewDefaultClientConfigLoadingRules()
	cfg, err := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(rules, &clientcmd.ConfigOverrides{}).ClientConfig()
	if err == nil {
		return cfg, nil
	}
	if inCluster, icErr := rest.InClusterConfig(); icErr == nil {
		return inCluster, nil
	}
	return nil, fmt.Errorf("no usable kubeconfig (%w): pass one with --kubeconfig or set KUBECONFIG", err)
}

// CheckFileReadable returns a clear error when path cannot be read; flag names
// the command-line flag that chose it.
func CheckFileReadable(path, flag string) error {
	f, err := os.Open(path)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return fmt.Errorf("%s %s does not exist: create it or pass another path with %s", flag, path, flag)
		}
		return fmt.Errorf("%s %s cannot be read: %w", flag, path, errors.Unwrap(err))
	}
	return f.Close()
}
