package wal

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Request is what archive_command and restore_command ask of the WAL
// service (chartpilot wal-serve) on its Unix socket: Op "push" archives
// the file at Path; "fetch" restores file Name to Path. Paths are
// absolute, under the data directory the service was given.
type Request struct {
	Op   string `json:"op"`
	Name string `json:"name,omitempty"`
	Path string `json:"path"`
}

// reply is the service's answer: nothing for success.
type reply struct {
	Error    string `json:"error,omitempty"`
	NotFound bool   `json:"notFound,omitempty"`
}

// maxRequest bounds a request line.
const maxRequest = 8 << 10

// Service archives and restores WAL for a server that holds none of the
// store's credentials or the archive's key: its archive_command and
// restore_command ask the service, which runs in a container of its
// own (chartpilot wal-serve), on a socket in a directory both share.
type Service struct {
	Archive *Archive
	// DataDir is the server's data directory: requests name files under it.
	DataDir string
	// Parallel is PushReady's (segments uploaded at once).
	Parallel int
	// Log reports each failed request (nil: none).
	Log func(op, name string, err error)
}

// Serve answers requests on l until ctx ends; each connection is one
// request and its reply.
func (s *Service) Serve(ctx context.Context, l net.Listener) error {
	go func() {
		<-ctx.Done()
		l.Close()
	}()
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			var ne net.Error
			if errors.As(err, &ne) && ne.Timeout() {
				continue
			}
			return err
		}
		go s.answer(ctx, conn)
	}
}

func (s *Service) answer(ctx context.Context, conn net.Conn) {
	defer conn.Close()
	_ = conn.SetReadDeadline(time.Now().Add(10 * time.Second))
	line, err := bufio.NewReader(io.LimitReader(conn, maxRequest)).ReadBytes('\n')
	var req Request
	if err == nil {
		err = json.Unmarshal(line, &req)
	}
	if err == nil {
		err = s.do(ctx, req)
	}
	var r reply
	if err != nil {
		r.Error, r.NotFound = err.Error(), errors.Is(err, ErrNotFound)
		if s.Log != nil {
			s.Log(req.Op, filepath.Base(req.Path), err)
		}
	}
	b, _ := json.Marshal(r)
	_ = conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	_, _ = conn.Write(append(b, '\n'))
}

func (s *Service) do(ctx context.Context, req Request) error {
	path, err := s.under(req.Path)
	if err != nil {
		return err
	}
	switch req.Op {
	case "push":
		return s.Archive.PushReady(ctx, path, s.Parallel)
	case "fetch":
		return s.Archive.Fetch(ctx, req.Name, path)
	}
	return fmt.Errorf("unknown request %q (push or fetch)", req.Op)
}

// under is path if it is absolute and under the data directory.
func (s *Service) under(path string) (string, error) {
	root := filepath.Clean(s.DataDir) + string(filepath.Separator)
	p := filepath.Clean(path)
	if !filepath.IsAbs(path) || !strings.HasPrefix(p, root) {
		return "", fmt.Errorf("%q is not a path under the data directory %s", path, s.DataDir)
	}
	return p, nil
}

// Ask sends req to the service at socket and waits for its reply (a
// push waits for the upload): nil once done, an error wrapping
// ErrNotFound when the archive has no such file.
func Ask(ctx context.Context, socket string, req Request) error {
	if !filepath.IsAbs(req.Path) {
		wd, err := os.Getwd()
		if err != nil {
			return err
		}
		req.Path = filepath.Join(wd, req.Path) // restore_command's %p is relative to the data directory
	}
	var d net.Dialer
	conn, err := d.DialContext(ctx, "unix", socket)
	if err != nil {
		return fmt.Errorf("reaching the WAL service at %s (its container, wal-agent, may not have started yet): %w", socket, err)
	}
	defer conn.Close()
	if dl, ok := ctx.Deadline(); ok {
		_ = conn.SetDeadline(dl)
	}
	b, err := json.Marshal(req)
	if err != nil {
		return err
	}
	if _, err := conn.Write(append(b, '\n')); err != nil {
		return err
	}
	line, err := bufio.NewReader(io.LimitReader(conn, maxRequest)).ReadBytes('\n')
	if err != nil {
		return fmt.Errorf("the WAL service did not answer: %w", err)
	}
	var r reply
	if err := json.Unmarshal(line, &r); err != nil {
		return fmt.Errorf("the WAL service's answer: %w", err)
	}
	switch {
	case r.NotFound:
		return fmt.Errorf("%s: %w", req.Name, ErrNotFound)
	case r.Error != "":
		return errors.New(r.Error)
	}
	return nil
}
