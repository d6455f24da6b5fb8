//go:build manager

package main

import (
	"context"
	"errors"
	"io"
)

// Built with -tags manager, chartpilot is chartpilot-manager: the manager
// and the CLI without the backup data path, whose object stores' clients
// are most of the full binary's size (and of its resident memory). The
// manager runs the full chartpilot as its store helper; backup Jobs copy
// the full chartpilot too.

var errNoDataPath = errors.New("this is chartpilot-manager, built without the backup data path: run the chartpilot binary beside it")

func backupCommand(context.Context, []string, io.Writer, io.Writer) error { return errNoDataPath }

func storeCommand(context.Context, []string, io.Reader, io.Writer) error { return errNoDataPath }

func installAgent([]string) error { return errNoDataPath }

func walCommand(context.Context, string, []string, io.Writer, io.Writer) error { return errNoDataPath }
