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
	"slices"
	"strings"
	"sync"
	"time"

	"golang.org/x/sys/unix"
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
	// Requests at once: PostgreSQL asks one at a time; more wait in the
	// socket's backlog.
	busy := make(chan struct{}, maxAnswering)
	for {
		conn, err := l.Accept()
		if err != nil {
			if ctx.Err() != nil {
				return nil
			}
			if errors.Is(err, unix.EMFILE) || errors.Is(err, unix.ENFILE) || errors.Is(err, unix.ENOBUFS) || errors.Is(err, unix.ENOMEM) {
				time.Sleep(100 * time.Millisecond) // out of descriptors or memory for a moment: the service stays
				continue
			}
			return err
		}
		busy <- struct{}{}
		go func() {
			defer func() { <-busy }()
			s.answer(ctx, conn)
		}()
	}
}

// maxAnswering bounds the requests answered at once.
const maxAnswering = 32

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
	name, err := s.under(req.Path)
	if err != nil {
		return err
	}
	wal, err := s.walDir()
	if err != nil {
		return err
	}
	defer unix.Close(wal)
	switch req.Op {
	case "push":
		return s.push(ctx, wal, name)
	case "fetch":
		data, err := s.Archive.Read(ctx, req.Name)
		if err != nil {
			return err
		}
		return writeAt(wal, name, data)
	}
	return fmt.Errorf("unknown request %q (push or fetch)", req.Op)
}

// under is the file name of path if path is a file of the data
// directory's pg_wal (where PostgreSQL's %p always is).
func (s *Service) under(path string) (string, error) {
	dir, name := filepath.Split(filepath.Clean(path))
	if !filepath.IsAbs(path) || filepath.Clean(dir) != filepath.Join(filepath.Clean(s.DataDir), "pg_wal") || name == "" || strings.HasPrefix(name, ".") {
		return "", fmt.Errorf("%q is not a path under the data directory %s (a file of its pg_wal)", path, s.DataDir)
	}
	return name, nil
}

// walDir opens the data directory's pg_wal beneath the directory that
// holds the data directory, following no symbolic link on the way: a
// process of the server's user cannot point the service elsewhere.
func (s *Service) walDir() (int, error) {
	data := filepath.Clean(s.DataDir)
	root, err := unix.Open(filepath.Dir(data), unix.O_DIRECTORY|unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("opening %s: %w", filepath.Dir(data), err)
	}
	defer unix.Close(root)
	fd, err := unix.Openat2(root, filepath.Join(filepath.Base(data), "pg_wal"), &unix.OpenHow{
		Flags: unix.O_DIRECTORY | unix.O_RDONLY | unix.O_CLOEXEC, Resolve: unix.RESOLVE_BENEATH | unix.RESOLVE_NO_SYMLINKS})
	if err != nil {
		return -1, fmt.Errorf("opening %s/pg_wal (no symbolic link followed): %w", data, err)
	}
	return fd, nil
}

// push archives pg_wal's file name and, meanwhile, up to Parallel-1 of
// the next ones PostgreSQL marked ready (see Archive.PushReady).
func (s *Service) push(ctx context.Context, wal int, name string) error {
	var more []string
	if s.Parallel > 1 {
		if f, err := readDirAt(wal, "archive_status"); err == nil {
			for _, e := range f {
				n, ok := strings.CutSuffix(e, ".ready")
				if ok && n != name && segmentName.MatchString(n) && n > name {
					more = append(more, n)
				}
			}
		}
		slices.Sort(more)
		if len(more) > s.Parallel-1 {
			more = more[:s.Parallel-1]
		}
	}
	one := func(n string) error {
		data, err := readAt(wal, n, s.Archive.MaxFile(n))
		if err != nil {
			return err
		}
		err = s.Archive.PushBytes(ctx, n, data)
		var other *StoredOtherError
		if errors.As(err, &other) && s.standby() {
			// A standby archives what it received (archive_mode always)
			// only so that nothing the primary had not stored is lost.
			// At the end of a timeline it also marks the segment it was
			// in, cut short at the fork, under the full name: what the
			// old primary stored stays, and the standby goes on.
			if s.Log != nil {
				s.Log("push", n, fmt.Errorf("kept the archived file, this standby's differs (cut at a timeline's end): %w", err))
			}
			return nil
		}
		return err
	}
	var wg sync.WaitGroup
	for _, n := range more {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = one(n) // retried when PostgreSQL asks for it
		}()
	}
	err := one(name)
	wg.Wait()
	return err
}

// standby reports whether the server of DataDir starts as a standby
// (standby.signal; a promoted standby's server removed it).
func (s *Service) standby() bool {
	_, err := os.Lstat(filepath.Join(s.DataDir, "standby.signal"))
	return err == nil
}

// readAt reads regular file name of directory dir, of at most max bytes,
// not following a symbolic link.
func readAt(dir int, name string, max int64) ([]byte, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, fmt.Errorf("opening pg_wal/%s: %w", name, err)
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	if fi, err := f.Stat(); err != nil || !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("pg_wal/%s is not a regular file", name)
	}
	data, err := io.ReadAll(io.LimitReader(f, max+1))
	if err != nil {
		return nil, err
	}
	if int64(len(data)) > max {
		return nil, fmt.Errorf("pg_wal/%s is larger than %d bytes: not a WAL file of this server's segment size", name, max)
	}
	return data, nil
}

// writeAt writes data to file name of directory dir: to a new file
// beside it (none followed or reused), synced, then renamed over name.
func writeAt(dir int, name string, data []byte) error {
	tmp := name + ".chartpilot-fetch"
	if err := unix.Unlinkat(dir, tmp, 0); err != nil && !errors.Is(err, unix.ENOENT) {
		return err
	}
	fd, err := unix.Openat(dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return fmt.Errorf("creating pg_wal/%s: %w", tmp, err)
	}
	f := os.NewFile(uintptr(fd), tmp)
	if err := writeSynced(f, data); err != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
		return err
	}
	if err := unix.Renameat(dir, tmp, dir, name); err != nil {
		_ = unix.Unlinkat(dir, tmp, 0)
		return err
	}
	return nil
}

// readDirAt lists directory name of dir, not following a symbolic link.
func readDirAt(dir int, name string) ([]string, error) {
	fd, err := unix.Openat(dir, name, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	f := os.NewFile(uintptr(fd), name)
	defer f.Close()
	return f.Readdirnames(-1)
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
