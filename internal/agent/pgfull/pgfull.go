// Package pgfull backs up everything a PostgreSQL server holds as one
// stream, and restores such a stream into another server: the roles (with
// their attributes, passwords and memberships) and every database that
// accepts connections, each with its owner, its grants and the owners of
// its objects. A logical backup of one database (pg_dump of "postgres")
// leaves out the databases applications keep their data in, and the roles
// that own it.
//
// The stream is Magic, then parts. A part is a line "part NAME\n" followed
// by chunks, each its length in decimal, "\n" and that many bytes; a chunk
// of length 0 ends the part. The first part is "roles": the server's roles,
// memberships and role settings as rows (JSON, see Roles), never as SQL
// text; each other is "database" and the database's name quoted as Go
// quotes strings, holding pg_dump -Fc of it. Streams written before the
// roles were rows start with "globals" (pg_dumpall's SQL), which a restore
// reads into Roles (parseGlobals) and never runs.
// Nothing is staged on disk on either side: parts are produced and
// consumed as they stream.
//
// The commands (psql, pg_dumpall, pg_dump, pg_restore) come from PATH and
// reach the server through libpq's environment (PGHOST, PGPORT, PGUSER,
// PGPASSWORD), as the superuser.
package pgfull

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
)

// Magic starts every full backup stream.
const Magic = "chartpilot-pgfull v1\n"

// maxRoles bounds the roles part read into memory on restore (kilobytes
// for any real server).
const maxRoles = 64 << 20

// maxChunk bounds one chunk's length on restore.
const maxChunk = 64 << 20

// Commander makes the command that runs name with args, with libpq's
// environment plus env (exec.CommandContext and the process's own
// environment when nil).
type Commander func(ctx context.Context, env []string, name string, args ...string) *exec.Cmd

func (c Commander) command(ctx context.Context, env []string, name string, args ...string) *exec.Cmd {
	if c != nil {
		return c(ctx, env, name, args...)
	}
	cmd := exec.CommandContext(ctx, name, args...)
	cmd.Env = append(append(os.Environ(), "PGCLIENTENCODING=UTF8"), env...)
	return cmd
}

// run runs a command with stdin (nil: none) and stdout (nil: captured and
// returned); its standard error is kept for the error.
func (c Commander) run(ctx context.Context, env []string, stdin io.Reader, stdout io.Writer, name string, args ...string) (string, error) {
	cmd := c.command(ctx, env, name, args...)
	var out, errb bytes.Buffer
	cmd.Stdin, cmd.Stderr = stdin, &errb
	cmd.Stdout = &out
	if stdout != nil {
		cmd.Stdout = stdout
	}
	if err := cmd.Run(); err != nil {
		return "", fmt.Errorf("%s: %w: %s", name, err, strings.TrimSpace(errb.String()))
	}
	return out.String(), nil
}

// Databases lists the server's databases that accept connections, but
// for the templates, sorted.
func Databases(ctx context.Context, c Commander) ([]string, error) {
	out, err := c.run(ctx, nil, nil, nil, "psql", "-X", "-A", "-t", "-0", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres",
		"-c", "SELECT datname FROM pg_database WHERE datallowconn AND NOT datistemplate ORDER BY datname")
	if err != nil {
		return nil, err
	}
	var dbs []string
	for _, d := range strings.Split(out, "\x00") {
		if d = strings.TrimSuffix(d, "\n"); d != "" {
			dbs = append(dbs, d)
		}
	}
	return dbs, nil
}

// Dump writes the full backup of the server to w.
func Dump(ctx context.Context, w io.Writer, c Commander) error {
	dbs, err := Databases(ctx, c)
	if err != nil {
		return err
	}
	if _, err := io.WriteString(w, Magic); err != nil {
		return err
	}
	part := func(name string, produce func(io.Writer) error) error {
		if _, err := fmt.Fprintf(w, "part %s\n", name); err != nil {
			return err
		}
		cw := &chunkWriter{w: w}
		if err := produce(cw); err != nil {
			return err
		}
		_, err := io.WriteString(w, "0\n")
		return err
	}
	roles, err := ReadRoles(ctx, c)
	if err != nil {
		return err
	}
	if err := part("roles", func(cw io.Writer) error {
		return json.NewEncoder(cw).Encode(roles)
	}); err != nil {
		return err
	}
	for _, db := range dbs {
		if err := part("database "+strconv.Quote(db), func(cw io.Writer) error {
			// The name goes in the environment: as an argument, a name
			// holding "=" would be read as a connection string.
			_, err := c.run(ctx, []string{"PGDATABASE=" + db}, nil, cw, "pg_dump", "-Fc")
			return err
		}); err != nil {
			return fmt.Errorf("database %q: %w", db, err)
		}
	}
	return nil
}

// loadPart stages a database's archive and loads it (loadDatabase).
func loadPart(ctx context.Context, c Commander, body io.Reader, db string, create bool, o Options) error {
	path, err := stage(body, o)
	if err != nil {
		return err
	}
	defer os.Remove(path)
	return loadDatabase(ctx, c, path, db, create, o)
}

// chunkWriter frames each write as a chunk.
type chunkWriter struct{ w io.Writer }

func (cw *chunkWriter) Write(p []byte) (int, error) {
	if len(p) == 0 {
		return 0, nil
	}
	if _, err := fmt.Fprintf(cw.w, "%d\n", len(p)); err != nil {
		return 0, err
	}
	return cw.w.Write(p)
}

// reader reads a stream's parts.
type reader struct {
	r *bufio.Reader
}

// next reads the next part's name; io.EOF after the last.
func (rd *reader) next() (string, error) {
	line, err := rd.r.ReadString('\n')
	if err == io.EOF && line == "" {
		return "", io.EOF
	}
	if err != nil {
		return "", fmt.Errorf("reading a part: %w", err)
	}
	name, ok := strings.CutPrefix(strings.TrimSuffix(line, "\n"), "part ")
	if !ok {
		return "", fmt.Errorf("not a full backup's part: %.40q", line)
	}
	return name, nil
}

// body is the current part's content, read as it is consumed; it must be
// read to its end before the next part.
func (rd *reader) body() io.Reader { return &chunkReader{r: rd.r} }

type chunkReader struct {
	r    *bufio.Reader
	left int
	done bool
}

func (c *chunkReader) Read(p []byte) (int, error) {
	if c.done {
		return 0, io.EOF
	}
	if c.left == 0 {
		line, err := c.r.ReadString('\n')
		if err != nil {
			return 0, fmt.Errorf("reading a chunk: %w", io.ErrUnexpectedEOF)
		}
		n, err := strconv.Atoi(strings.TrimSuffix(line, "\n"))
		if err != nil || n < 0 || n > maxChunk {
			return 0, fmt.Errorf("not a chunk length: %.20q", line)
		}
		if n == 0 {
			c.done = true
			return 0, io.EOF
		}
		c.left = n
	}
	if len(p) > c.left {
		p = p[:c.left]
	}
	n, err := c.r.Read(p)
	c.left -= n
	if err == io.EOF {
		err = io.ErrUnexpectedEOF
	}
	return n, err
}

// IsFull reports whether a backup stream that starts with head is a full
// backup (else: one database's pg_dump -Fc, as backups were before).
func IsFull(head []byte) bool { return bytes.HasPrefix(head, []byte(Magic)) }

// Restore restores a full backup stream (Magic already read from r, see
// IsFull) into the server: the roles first (RestoreRoles), then each
// database, created with its owner and grants unless it exists (as
// "postgres" does), with the owners of its objects.
func Restore(ctx context.Context, r io.Reader, c Commander) error {
	_, err := RestoreWith(ctx, r, c, Options{})
	return err
}

// RestoreWith is Restore with the roles restored as o says; it returns
// what it left out of the roles, one line each.
func RestoreWith(ctx context.Context, r io.Reader, c Commander, o Options) ([]string, error) {
	rd := &reader{r: bufio.NewReader(r)}
	existing, err := Databases(ctx, c)
	if err != nil {
		return nil, err
	}
	var skipped []string
	first := true
	for {
		name, err := rd.next()
		if err == io.EOF {
			if first {
				return nil, errors.New("the backup has no parts")
			}
			return skipped, nil
		}
		if err != nil {
			return nil, err
		}
		switch {
		case first && name == "roles":
			data, err := io.ReadAll(io.LimitReader(rd.body(), maxRoles+1))
			if err != nil {
				return nil, fmt.Errorf("roles: %w", err)
			}
			if len(data) > maxRoles {
				return nil, fmt.Errorf("roles: the roles part is over %d bytes", maxRoles)
			}
			var roles Roles
			if err := json.Unmarshal(data, &roles); err != nil {
				return nil, fmt.Errorf("roles: %w", err)
			}
			if skipped, err = RestoreRoles(ctx, c, &roles, o); err != nil {
				return nil, err
			}
		case first && name == "globals":
			// Written before roles were rows: read, never run.
			sql, err := io.ReadAll(io.LimitReader(rd.body(), maxRoles+1))
			if err != nil {
				return nil, fmt.Errorf("roles: %w", err)
			}
			if len(sql) > maxRoles {
				return nil, fmt.Errorf("roles: the globals part is over %d bytes", maxRoles)
			}
			roles, err := parseGlobals(string(sql))
			if err != nil {
				return nil, fmt.Errorf("roles: %w", err)
			}
			if skipped, err = RestoreRoles(ctx, c, roles, o); err != nil {
				return nil, err
			}
		case first:
			return nil, fmt.Errorf("the backup starts with %q, not its roles", name)
		default:
			quoted, ok := strings.CutPrefix(name, "database ")
			db, err := strconv.Unquote(quoted)
			if !ok || err != nil {
				return nil, fmt.Errorf("not a database part: %.60q", name)
			}
			// Created from the archive (its owner, grants and settings)
			// unless the server has it.
			if err := loadPart(ctx, c, rd.body(), db, !slices.Contains(existing, db), o); err != nil {
				return nil, fmt.Errorf("database %q: %w", db, err)
			}
		}
		first = false
	}
}

// Drill is a restore drill of a full backup stream (Magic already read
// from r) on a server that keeps running for its users: each database is
// restored into a throwaway database named prefix and its number, as
// DrillDump does (the roles are not restored: they are the server's own),
// its tables counted, and dropped whatever happened. It returns the
// number of tables of all databases.
func Drill(ctx context.Context, r io.Reader, c Commander, prefix string) (int, error) {
	rd := &reader{r: bufio.NewReader(r)}
	tables, n := 0, 0
	for {
		name, err := rd.next()
		if err == io.EOF {
			if n == 0 {
				return 0, errors.New("the backup holds no database")
			}
			return tables, nil
		}
		if err != nil {
			return 0, err
		}
		body := rd.body()
		if !strings.HasPrefix(name, "database ") {
			if _, err := io.Copy(io.Discard, body); err != nil {
				return 0, err
			}
			continue
		}
		n++
		db := fmt.Sprintf("%s_%d", prefix, n)
		count, err := DrillDump(ctx, body, c, db)
		if err != nil {
			return 0, fmt.Errorf("%s: %w", name, err)
		}
		tables += count
	}
}

// DrillDump restores one database's pg_dump -Fc from body into a new
// database db, with its objects' owners and grants (the roles must exist:
// the server's own), each table's rows loaded as its owner; counts its
// tables, and drops db whatever happened.
func DrillDump(ctx context.Context, body io.Reader, c Commander, db string) (int, error) {
	if _, err := c.run(ctx, nil, nil, nil, "createdb", "--maintenance-db", "postgres", db); err != nil {
		return 0, err
	}
	defer func() {
		// Dropped even when the pass was cancelled.
		_, _ = c.run(context.WithoutCancel(ctx), nil, nil, nil, "dropdb", "--maintenance-db", "postgres", "--if-exists", db)
	}()
	if err := loadPart(ctx, c, body, db, false, Options{}); err != nil {
		return 0, err
	}
	out, err := c.run(ctx, nil, nil, nil, "psql", "-X", "-A", "-t", "-v", "ON_ERROR_STOP=1", "--dbname", db, "-c",
		"SELECT count(*) FROM pg_catalog.pg_tables WHERE schemaname NOT IN ('pg_catalog', 'information_schema')")
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(out))
}
