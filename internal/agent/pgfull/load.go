package pgfull

import (
	"bufio"
	"context"
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
)

// A database is loaded in three passes over its archive, so that no code a
// role wrote runs with more rights than that role has: loading a table's
// rows runs its CHECK constraints, generated columns, partition keys and
// the functions they call, and a superuser loading them would run them as
// a superuser (SET ROLE or SET SESSION AUTHORIZATION would not do: such
// code can RESET them).
//
//  1. The schema (pre-data) as the superuser: creating objects runs none
//     of them.
//  2. Each table's rows over a connection of a login role made for the
//     load (a random password, dropped after): a member of the table's
//     owner and of nothing else, which takes the owner's role. Code that
//     resets it is left with the member's rights: none of its own.
//     Tables a superuser owns load as the superuser.
//  3. Everything else (sequence values, large objects, indexes,
//     constraints, triggers, grants) as the superuser, but for CHECK
//     constraints pg_dump writes apart from their table or domain (adding
//     one checks every row): each is added by the owner's loading role,
//     as in 2. Index expressions run as the table's owner (the server
//     itself switches to it).

// stageDir is where a database's archive is kept while it loads:
// $CHARTPILOT_STAGE_DIR, else the temporary directory.
func stageDir(o Options) string {
	if o.StageDir != "" {
		return o.StageDir
	}
	if d := os.Getenv("CHARTPILOT_STAGE_DIR"); d != "" {
		return d
	}
	return os.TempDir()
}

// stage copies body to a new file; remove it when done.
func stage(body io.Reader, o Options) (string, error) {
	f, err := os.CreateTemp(stageDir(o), "chartpilot-db-*.dump")
	if err != nil {
		return "", fmt.Errorf("staging the database's archive: %w", err)
	}
	if _, err := io.Copy(f, body); err != nil {
		f.Close()
		os.Remove(f.Name())
		return "", fmt.Errorf("staging the database's archive: %w", err)
	}
	if err := f.Close(); err != nil {
		os.Remove(f.Name())
		return "", err
	}
	return f.Name(), nil
}

// tableData is a TOC line (pg_restore -l) of a table's rows: the type
// comes before the names, which cannot make a line look like one.
var tableData = regexp.MustCompile(`^\s*\d+;\s+\d+\s+\d+\s+TABLE DATA\s`)

// tableOwner is a table of the loaded schema and its owner.
type tableOwner struct {
	Schema    string `json:"schema"`
	Table     string `json:"table"`
	Owner     string `json:"owner"`
	Superuser bool   `json:"superuser"`
}

const tableOwnersQuery = `SELECT coalesce(json_agg(json_build_object('schema', n.nspname, 'table', c.relname, 'owner', r.rolname, 'superuser', r.rolsuper)
    ORDER BY n.nspname, c.relname), '[]')
  FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace JOIN pg_roles r ON r.oid = c.relowner
  WHERE c.relkind IN ('r', 'p') AND n.nspname NOT IN ('pg_catalog', 'information_schema') AND n.nspname !~ '^pg_toast'`

// connDB is a connection string naming database db alone (libpq takes
// the rest from its environment): a name given as it is would be read as
// a connection string of its own when it holds "=".
func connDB(db string) string {
	return "dbname='" + strings.NewReplacer(`\`, `\\`, `'`, `\'`).Replace(db) + "'"
}

// restore runs pg_restore with args on the archive at path, given as its
// standard input (a file: pg_restore seeks in it as in a named one), so
// that the commands need no access to the path.
func restore(ctx context.Context, c Commander, env []string, path string, args ...string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	return c.run(ctx, env, f, nil, "pg_restore", args...)
}

// loadDatabase restores the archive at path into db: created from the
// archive (its owner, grants and settings) when create is set, else an
// existing database.
func loadDatabase(ctx context.Context, c Commander, path, db string, create bool, o Options) error {
	pre := []string{"--exit-on-error", "--section=pre-data", "--dbname", connDB(db)}
	if create {
		pre = []string{"--exit-on-error", "--section=pre-data", "--create", "--dbname", "postgres"}
	}
	if _, err := restore(ctx, c, nil, path, pre...); err != nil {
		return fmt.Errorf("schema: %w", err)
	}
	dbEnv := []string{"PGDATABASE=" + db}
	out, err := c.run(ctx, dbEnv, nil, nil, "psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "-c", tableOwnersQuery)
	if err != nil {
		return err
	}
	var tables []tableOwner
	if err := json.Unmarshal([]byte(out), &tables); err != nil {
		return fmt.Errorf("reading the tables' owners: %w", err)
	}
	// One pg_restore per owner and schema (its -n and -t are exact names).
	type group struct{ owner, schema string }
	groups := map[group][]string{}
	super := map[string]bool{}
	for _, t := range tables {
		g := group{t.Owner, t.Schema}
		groups[g] = append(groups[g], t.Table)
		super[t.Owner] = t.Superuser
	}
	keys := make([]group, 0, len(groups))
	for g := range groups {
		keys = append(keys, g)
	}
	sort.Slice(keys, func(i, j int) bool {
		return keys[i].owner < keys[j].owner || keys[i].owner == keys[j].owner && keys[i].schema < keys[j].schema
	})
	for _, g := range keys {
		args := []string{"--exit-on-error", "--data-only", "--schema", g.schema}
		for _, t := range groups[g] {
			args = append(args, "--table", t)
		}
		if super[g.owner] {
			if _, err := restore(ctx, c, dbEnv, path, append([]string{"--dbname", connDB(db)}, args...)...); err != nil {
				return fmt.Errorf("rows of %q's tables in schema %q: %w", g.owner, g.schema, err)
			}
			continue
		}
		if err := asOwner(ctx, c, db, g.owner, func(env []string) error {
			_, err := restore(ctx, c, env, path, append([]string{"--dbname", connDB(db), "--role", g.owner}, args...)...)
			return err
		}); err != nil {
			return fmt.Errorf("rows of %q's tables in schema %q: %w", g.owner, g.schema, err)
		}
	}
	// The rest, by a list without the tables' rows.
	toc, err := restore(ctx, c, nil, path, "--list")
	if err != nil {
		return err
	}
	list, err := os.CreateTemp(stageDir(o), "chartpilot-db-*.list")
	if err != nil {
		return err
	}
	defer os.Remove(list.Name())
	w := bufio.NewWriter(list)
	var checks []string
	for _, line := range strings.SplitAfter(toc, "\n") {
		if checkConstraint.MatchString(line) {
			checks = append(checks, line)
		}
		if tableData.MatchString(line) || checkConstraint.MatchString(line) {
			w.WriteString(";")
		}
		w.WriteString(line)
	}
	// Readable by the commands' user, which may be another (it holds
	// the objects' names only).
	if err := errors.Join(w.Flush(), list.Chmod(0o644), list.Close()); err != nil {
		return err
	}
	if _, err := restore(ctx, c, dbEnv, path, "--exit-on-error", "--section=data", "--section=post-data", "--use-list", list.Name(), "--dbname", connDB(db)); err != nil {
		return fmt.Errorf("indexes, constraints and the rest: %w", err)
	}
	for _, line := range checks {
		if err := loadCheck(ctx, c, path, db, line, o); err != nil {
			return err
		}
	}
	return nil
}

// checkConstraint is a TOC line of a CHECK constraint pg_dump writes apart
// from its table or domain (ALTER … ADD CONSTRAINT, after the rows): adding
// it checks every row with the constraint's expression, as whoever adds it.
var checkConstraint = regexp.MustCompile(`^\s*\d+;\s+\d+\s+\d+\s+CHECK CONSTRAINT\s`)

// loadCheck adds the CHECK constraint of TOC line as the owner of the
// table or domain it constrains (found in the statement pg_restore writes
// for it, read as SQL tokens, and in the target's catalog).
func loadCheck(ctx context.Context, c Commander, path, db, line string, o Options) error {
	one, err := os.CreateTemp(stageDir(o), "chartpilot-db-*.list")
	if err != nil {
		return err
	}
	defer os.Remove(one.Name())
	_, werr := one.WriteString(line)
	if err := errors.Join(werr, one.Chmod(0o644), one.Close()); err != nil {
		return err
	}
	sql, err := restore(ctx, c, nil, path, "--use-list", one.Name(), "--file", "-")
	if err != nil {
		return err
	}
	kind, schema, name, ok := alteredObject(sql)
	if !ok {
		return fmt.Errorf("a CHECK constraint apart from its table: no ALTER TABLE or ALTER DOMAIN found in %.80q", sql)
	}
	q := fmt.Sprintf(`SELECT json_build_object('owner', r.rolname, 'superuser', r.rolsuper) FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
  JOIN pg_roles r ON r.oid = c.relowner WHERE n.nspname = %s AND c.relname = %s`, literal(schema), literal(name))
	if kind == "domain" {
		q = fmt.Sprintf(`SELECT json_build_object('owner', r.rolname, 'superuser', r.rolsuper) FROM pg_type t JOIN pg_namespace n ON n.oid = t.typnamespace
  JOIN pg_roles r ON r.oid = t.typowner WHERE n.nspname = %s AND t.typname = %s AND t.typtype = 'd'`, literal(schema), literal(name))
	}
	out, err := c.run(ctx, []string{"PGDATABASE=" + db}, nil, nil, "psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1",
		"-c", "SET standard_conforming_strings = on", "-c", q)
	if err != nil {
		return err
	}
	var owner tableOwner
	if err := json.Unmarshal([]byte(strings.TrimSpace(out)), &owner); err != nil || owner.Owner == "" {
		return fmt.Errorf("a CHECK constraint on %s %q.%q: its owner is not found", kind, schema, name)
	}
	args := []string{"--exit-on-error", "--use-list", one.Name(), "--dbname", connDB(db)}
	if owner.Superuser {
		_, err = restore(ctx, c, nil, path, args...)
	} else {
		err = asOwner(ctx, c, db, owner.Owner, func(env []string) error {
			_, err := restore(ctx, c, env, path, append(args, "--role", owner.Owner)...)
			return err
		})
	}
	if err != nil {
		return fmt.Errorf("a CHECK constraint on %s %q.%q, added as %q: %w", kind, schema, name, owner.Owner, err)
	}
	return nil
}

// alteredObject finds the first ALTER TABLE [ONLY] or ALTER DOMAIN of sql
// and the schema and name it alters, reading quoted identifiers, strings
// and comments as the server would (a name cannot pass for a keyword).
func alteredObject(sql string) (kind, schema, name string, ok bool) {
	type tok struct {
		word  string // a keyword or bare name, lower case
		ident string // a name
		quote bool
	}
	var toks []tok
	for i := 0; i < len(sql); {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case strings.HasPrefix(sql[i:], "--"):
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
		case c == '\'' || c == '"':
			text, next, _ := scanQuoted(sql, i) // an unclosed one ends the text
			if c == '"' {
				toks = append(toks, tok{ident: text, quote: true})
			} else {
				toks = append(toks, tok{word: "'"})
			}
			i = next
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := scanWord(sql, i)
			w := strings.ToLower(sql[i:j])
			toks = append(toks, tok{word: w, ident: w})
			i = j
		default:
			toks = append(toks, tok{word: string(c)})
			i++
		}
	}
	isName := func(t tok) bool { return t.quote || t.word != "" && t.ident != "" }
	for i := 0; i+2 < len(toks); i++ {
		if toks[i].quote || toks[i].word != "alter" || toks[i+1].quote || (toks[i+1].word != "table" && toks[i+1].word != "domain") {
			continue
		}
		kind = toks[i+1].word
		j := i + 2
		if kind == "table" && !toks[j].quote && toks[j].word == "only" && j+1 < len(toks) && isName(toks[j+1]) {
			j++
		}
		if j+2 < len(toks) && isName(toks[j]) && !toks[j+1].quote && toks[j+1].word == "." && isName(toks[j+2]) {
			return kind, toks[j].ident, toks[j+2].ident, true
		}
		return "", "", "", false
	}
	return "", "", "", false
}

// asOwner runs load with the libpq environment of a login role made for
// it: a member of owner alone, allowed to connect to db, with a random
// password (the server is sent its SCRAM verifier only). The role is
// dropped afterwards whatever happened (see dropLoader).
func asOwner(ctx context.Context, c Commander, db, owner string, load func(env []string) error) (err error) {
	var b [12]byte
	if _, err := rand.Read(b[:]); err != nil {
		return err
	}
	name := "chartpilot_load_" + hex.EncodeToString(b[:6])
	password := hex.EncodeToString(b[6:]) + hex.EncodeToString(randomBytes(16))
	verifier, err := scramVerifier(password)
	if err != nil {
		return err
	}
	create := fmt.Sprintf("CREATE ROLE %s LOGIN NOINHERIT PASSWORD %s; GRANT %s TO %s", ident(name), literal(verifier), ident(owner), ident(name))
	oid, err := c.run(ctx, nil, nil, nil, "psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres", "-c", "SET standard_conforming_strings = on",
		"-c", create, "-c", "SELECT oid FROM pg_roles WHERE rolname = "+literal(name))
	if err != nil {
		return fmt.Errorf("making the loading role: %w", err)
	}
	oid = strings.TrimSpace(oid)
	if _, err := strconv.ParseUint(oid, 10, 32); err != nil {
		return fmt.Errorf("making the loading role: its OID reads %q", oid)
	}
	defer func() {
		if derr := dropLoader(context.WithoutCancel(ctx), c, db, oid, owner); derr != nil {
			err = errors.Join(err, fmt.Errorf("dropping the loading role %s: %w", name, derr))
		}
	}()
	// CONNECT is granted only where PUBLIC lacks it: a grant would make
	// a database's default privileges explicit for good.
	can, err := c.run(ctx, nil, nil, nil, "psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres", "-c", "SET standard_conforming_strings = on",
		"-c", fmt.Sprintf("SELECT has_database_privilege(%s, %s, 'CONNECT')", literal(name), literal(db)))
	if err != nil {
		return err
	}
	if strings.TrimSpace(can) != "t" {
		if _, err := c.run(ctx, nil, nil, nil, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres", "-c", fmt.Sprintf("GRANT CONNECT ON DATABASE %s TO %s", ident(db), ident(name))); err != nil {
			return err
		}
	}
	return load([]string{"PGUSER=" + name, "PGPASSWORD=" + password, "PGPASSFILE=/dev/null"})
}

// dropLoader drops the loading role of OID oid, whatever it is called
// by now (a role with CREATEROLE may rename it): what the load made it
// own goes to owner (the owner's code may have made objects of the
// owner's depend on it, which would stop DROP OWNED), its privileges are
// revoked, then it is dropped. A role that cannot be dropped is left
// unable to log in.
func dropLoader(ctx context.Context, c Commander, db, oid, owner string) error {
	out, err := c.run(ctx, nil, nil, nil, "psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres", "-c", "SELECT quote_ident(rolname) FROM pg_roles WHERE oid = "+oid)
	if err != nil {
		return err
	}
	quoted := strings.TrimSuffix(out, "\n")
	if quoted == "" {
		return nil // dropped already
	}
	_, err = c.run(ctx, []string{"PGDATABASE=" + db}, nil, nil, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1",
		"-c", "REASSIGN OWNED BY "+quoted+" TO "+ident(owner), "-c", "DROP OWNED BY "+quoted)
	if err == nil {
		_, err = c.run(ctx, nil, nil, nil, "psql", "-X", "-q", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres", "-c", "DROP ROLE "+quoted)
	}
	if err != nil {
		_, _ = c.run(ctx, nil, nil, nil, "psql", "-X", "-q", "--dbname", "postgres", "-c", "ALTER ROLE "+quoted+" NOLOGIN PASSWORD NULL")
	}
	return err
}

func randomBytes(n int) []byte {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return b
}

// scramVerifier is the SCRAM-SHA-256 verifier of password, as the server
// keeps it (RFC 5803): given it instead of the password, the server and
// its logs never see the password.
func scramVerifier(password string) (string, error) {
	const iterations = 4096
	salt := randomBytes(16)
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, 32)
	if err != nil {
		return "", err
	}
	mac := func(key []byte, msg string) []byte {
		h := hmac.New(sha256.New, key)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	stored := sha256.Sum256(mac(salted, "Client Key"))
	enc := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, enc(salt), enc(stored[:]), enc(mac(salted, "Server Key"))), nil
}
