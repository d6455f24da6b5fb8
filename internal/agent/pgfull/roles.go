package pgfull

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Roles is what a server holds of its roles, read from its catalogs as
// rows (pg_authid, pg_auth_members, pg_db_role_setting), not as SQL text:
// a restore builds each statement from these fields, quoting every name
// and value, so nothing a role wrote (a name, a setting's value) is ever
// read as SQL.
type Roles struct {
	Roles    []Role       `json:"roles"`
	Members  []Membership `json:"members"`
	Settings []Setting    `json:"settings"`
}

// Role is one row of pg_authid (predefined roles, pg_*, left out).
type Role struct {
	Name            string  `json:"name"`
	Superuser       bool    `json:"superuser"`
	Inherit         bool    `json:"inherit"`
	CreateRole      bool    `json:"createRole"`
	CreateDB        bool    `json:"createDB"`
	Login           bool    `json:"login"`
	Replication     bool    `json:"replication"`
	BypassRLS       bool    `json:"bypassRLS"`
	ConnectionLimit int     `json:"connectionLimit"`
	Password        *string `json:"password"`
	ValidUntil      *string `json:"validUntil"`
}

// Membership is one row of pg_auth_members. Inherit and Set are the grant's
// options where the server has them (16 and later).
type Membership struct {
	Role    string `json:"role"`
	Member  string `json:"member"`
	Admin   bool   `json:"admin"`
	Inherit *bool  `json:"inherit,omitempty"`
	Set     *bool  `json:"set,omitempty"`
}

// Setting is a role's settings (pg_db_role_setting), in one database or,
// Database empty, in all; each entry of Config is "name=value" as the
// server keeps it.
type Setting struct {
	Role     string   `json:"role"`
	Database string   `json:"database,omitempty"`
	Config   []string `json:"config"`
	// Parsed are settings read from SQL text: each its name, then its
	// values (a list setting's elements apart).
	Parsed [][]string `json:"-"`
}

// rolesQuery reads Roles as one JSON document. Membership options are read
// through to_jsonb, so that the query runs on servers with and without them.
const rolesQuery = `SELECT json_build_object(
  'roles', (SELECT coalesce(json_agg(json_build_object('name', rolname, 'superuser', rolsuper, 'inherit', rolinherit,
      'createRole', rolcreaterole, 'createDB', rolcreatedb, 'login', rolcanlogin, 'replication', rolreplication,
      'bypassRLS', rolbypassrls, 'connectionLimit', rolconnlimit, 'password', rolpassword, 'validUntil', rolvaliduntil) ORDER BY rolname), '[]')
    FROM pg_authid WHERE rolname !~ '^pg_'),
  'members', (SELECT coalesce(json_agg(json_build_object('role', r.rolname, 'member', m.rolname, 'admin', a.admin_option,
      'inherit', (to_jsonb(a)->>'inherit_option')::bool, 'set', (to_jsonb(a)->>'set_option')::bool) ORDER BY r.rolname, m.rolname), '[]')
    FROM pg_auth_members a JOIN pg_authid r ON r.oid = a.roleid JOIN pg_authid m ON m.oid = a.member WHERE m.rolname !~ '^pg_'),
  'settings', (SELECT coalesce(json_agg(json_build_object('role', r.rolname, 'database', d.datname, 'config', s.setconfig) ORDER BY r.rolname, d.datname), '[]')
    FROM pg_db_role_setting s JOIN pg_authid r ON r.oid = s.setrole LEFT JOIN pg_database d ON d.oid = s.setdatabase))`

// ReadRoles reads the server's roles.
func ReadRoles(ctx context.Context, c Commander) (*Roles, error) {
	out, err := c.run(ctx, nil, nil, nil, "psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres", "-c", rolesQuery)
	if err != nil {
		return nil, err
	}
	var r Roles
	if err := json.Unmarshal([]byte(out), &r); err != nil {
		return nil, fmt.Errorf("reading the roles: %w", err)
	}
	return &r, nil
}

// privilegedRoles are the predefined roles whose members can read or write
// the server's files or run programs on it: as good as superuser.
var privilegedRoles = []string{"pg_execute_server_program", "pg_read_server_files", "pg_write_server_files"}

// Options says how a full backup is restored.
type Options struct {
	// StageDir keeps each database's archive while it loads (empty:
	// $CHARTPILOT_STAGE_DIR, else the temporary directory).
	StageDir string
	// Privileged restores SUPERUSER, REPLICATION and BYPASSRLS, and
	// memberships in superusers and in the predefined roles that reach the
	// server's files and programs, as backed up (a major upgrade: the same
	// server). Without it they are restored only for roles that have them
	// on the target already, and those are left as the target has them.
	Privileged bool
}

// serverRole is what the target server says of one of its roles.
type serverRole struct {
	Name        string `json:"name"`
	Superuser   bool   `json:"superuser"`
	Replication bool   `json:"replication"`
	BypassRLS   bool   `json:"bypassRLS"`
	Self        bool   `json:"self"`
}

const serverRolesQuery = `SELECT json_build_object('version', current_setting('server_version_num')::int,
  'roles', (SELECT coalesce(json_agg(json_build_object('name', rolname, 'superuser', rolsuper, 'replication', rolreplication,
    'bypassRLS', rolbypassrls, 'self', rolname = current_user)), '[]') FROM pg_authid))`

// RestoreRoles creates and alters the target's roles to match want. The
// restoring superuser's own role, and any role the target has already
// with SUPERUSER, REPLICATION or BYPASSRLS (the roles its chart made: their
// credentials are the target's own), keep their attributes and passwords.
// It returns what it left out, one line each.
func RestoreRoles(ctx context.Context, c Commander, want *Roles, o Options) ([]string, error) {
	out, err := c.run(ctx, nil, nil, nil, "psql", "-X", "-A", "-t", "-q", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres", "-c", serverRolesQuery)
	if err != nil {
		return nil, err
	}
	var target struct {
		Version int          `json:"version"`
		Roles   []serverRole `json:"roles"`
	}
	if err := json.Unmarshal([]byte(out), &target); err != nil {
		return nil, fmt.Errorf("reading the target's roles: %w", err)
	}
	script, skipped, err := rolesScript(want, target.Roles, target.Version, o)
	if err != nil {
		return nil, err
	}
	if _, err := c.run(ctx, nil, strings.NewReader(script), nil, "psql", "-X", "-q", "-1", "-v", "ON_ERROR_STOP=1", "--dbname", "postgres", "-f", "-"); err != nil {
		return nil, fmt.Errorf("restoring the roles: %w", err)
	}
	return skipped, nil
}

// rolesScript is the SQL that makes the target's roles (existing) match
// want, built from quoted names and values only.
func rolesScript(want *Roles, existing []serverRole, version int, o Options) (string, []string, error) {
	have := map[string]serverRole{}
	for _, r := range existing {
		have[r.Name] = r
	}
	// kept roles are the target's own: left as they are.
	kept := func(name string) bool {
		r, ok := have[name]
		return ok && (r.Self || r.Superuser || r.Replication || r.BypassRLS)
	}
	super := map[string]bool{}
	for _, r := range existing {
		super[r.Name] = r.Superuser
	}
	var b strings.Builder
	var skipped []string
	b.WriteString("SET standard_conforming_strings = on;\nSET client_encoding = 'UTF8';\n")
	for _, r := range want.Roles {
		if err := checkText(r.Name); err != nil {
			return "", nil, fmt.Errorf("role %q: %w", r.Name, err)
		}
		if kept(r.Name) {
			continue
		}
		if _, ok := have[r.Name]; !ok {
			fmt.Fprintf(&b, "CREATE ROLE %s;\n", ident(r.Name))
		}
		attrs := []string{
			flag(r.Inherit, "INHERIT"), flag(r.CreateRole, "CREATEROLE"), flag(r.CreateDB, "CREATEDB"), flag(r.Login, "LOGIN"),
			"CONNECTION LIMIT " + strconv.Itoa(r.ConnectionLimit),
		}
		for _, p := range []struct {
			on   bool
			name string
		}{{r.Superuser, "SUPERUSER"}, {r.Replication, "REPLICATION"}, {r.BypassRLS, "BYPASSRLS"}} {
			if p.on && !o.Privileged {
				skipped = append(skipped, fmt.Sprintf("role %q: %s not restored (only the target's own roles have it)", r.Name, p.name))
			}
			attrs = append(attrs, flag(p.on && o.Privileged, p.name))
		}
		if r.Password != nil {
			if err := checkText(*r.Password); err != nil {
				return "", nil, fmt.Errorf("role %q's password: %w", r.Name, err)
			}
			attrs = append(attrs, "PASSWORD "+literal(*r.Password))
		} else {
			attrs = append(attrs, "PASSWORD NULL")
		}
		if r.ValidUntil != nil {
			if err := checkText(*r.ValidUntil); err != nil {
				return "", nil, fmt.Errorf("role %q's expiry: %w", r.Name, err)
			}
			attrs = append(attrs, "VALID UNTIL "+literal(*r.ValidUntil))
		}
		fmt.Fprintf(&b, "ALTER ROLE %s WITH %s;\n", ident(r.Name), strings.Join(attrs, " "))
		if o.Privileged {
			super[r.Name] = r.Superuser
		}
	}
	for _, m := range want.Members {
		if err := errors.Join(checkText(m.Role), checkText(m.Member)); err != nil {
			return "", nil, fmt.Errorf("membership of %q in %q: %w", m.Member, m.Role, err)
		}
		if kept(m.Member) {
			continue
		}
		// A membership in one of the target's own roles (its superuser,
		// its replication role) would hand their rights over.
		if !o.Privileged && (super[m.Role] || kept(m.Role) || slices.Contains(privilegedRoles, m.Role)) {
			skipped = append(skipped, fmt.Sprintf("role %q: membership in %q not restored (it reaches the server as a superuser)", m.Member, m.Role))
			continue
		}
		fmt.Fprintf(&b, "GRANT %s TO %s", ident(m.Role), ident(m.Member))
		var with []string
		if m.Admin {
			with = append(with, "ADMIN OPTION")
		}
		if version >= 160000 {
			if m.Inherit != nil {
				with = append(with, "INHERIT "+strings.ToUpper(strconv.FormatBool(*m.Inherit)))
			}
			if m.Set != nil {
				with = append(with, "SET "+strings.ToUpper(strconv.FormatBool(*m.Set)))
			}
		}
		if len(with) > 0 {
			b.WriteString(" WITH " + strings.Join(with, ", "))
		}
		b.WriteString(";\n")
	}
	for _, s := range want.Settings {
		if kept(s.Role) {
			continue
		}
		if s.Database != "" {
			// A database's own role settings come with the database (its
			// archive holds them) when it is created by the restore.
			continue
		}
		pairs := s.Parsed
		for _, kv := range s.Config {
			name, value, ok := strings.Cut(kv, "=")
			if !ok || name == "" {
				return "", nil, fmt.Errorf("role %q: a setting that is not name=value", s.Role)
			}
			values := []string{value}
			if listSetting(name) {
				if values, ok = splitGUCList(value); !ok {
					return "", nil, fmt.Errorf("role %q's setting %q: not a list", s.Role, name)
				}
			}
			pairs = append(pairs, append([]string{name}, values...))
		}
		for _, pair := range pairs {
			name := pair[0]
			quoted := make([]string, 0, len(pair)-1)
			for _, v := range pair[1:] {
				if err := errors.Join(checkText(name), checkText(v)); err != nil {
					return "", nil, fmt.Errorf("role %q's setting %q: %w", s.Role, name, err)
				}
				quoted = append(quoted, literal(v))
			}
			if len(quoted) == 0 {
				quoted = []string{"''"}
			}
			fmt.Fprintf(&b, "ALTER ROLE %s SET %s TO %s;\n", ident(s.Role), ident(name), strings.Join(quoted, ", "))
		}
	}
	return b.String(), skipped, nil
}

func flag(on bool, name string) string {
	if on {
		return name
	}
	return "NO" + name
}

// ident quotes a name as an SQL identifier.
func ident(s string) string { return `"` + strings.ReplaceAll(s, `"`, `""`) + `"` }

// literal quotes a value as an SQL string literal (the script sets
// standard_conforming_strings: a backslash is a character like any other).
func literal(s string) string { return `'` + strings.ReplaceAll(s, `'`, `''`) + `'` }

// checkText refuses what no name or value can hold and quoting cannot
// carry: a NUL, or bytes that are not UTF-8 (the script's encoding).
func checkText(s string) error {
	if strings.ContainsRune(s, 0) || !utf8.ValidString(s) {
		return errors.New("holds a NUL or bytes that are not UTF-8")
	}
	return nil
}

// listSetting reports whether the server keeps name's value as a list of
// quoted elements (GUC_LIST_QUOTE), which SET takes as separate values.
func listSetting(name string) bool {
	switch strings.ToLower(name) {
	case "local_preload_libraries", "search_path", "session_preload_libraries", "shared_preload_libraries", "temp_tablespaces", "unix_socket_directories":
		return true
	}
	return false
}

// splitGUCList splits a list setting's value as the server wrote it:
// elements separated by commas, each bare or double-quoted ("" within).
func splitGUCList(s string) ([]string, bool) {
	var out []string
	i := 0
	skip := func() {
		for i < len(s) && (s[i] == ' ' || s[i] == '\t' || s[i] == '\n' || s[i] == '\r' || s[i] == '\f' || s[i] == '\v') {
			i++
		}
	}
	skip()
	if i == len(s) {
		return nil, true
	}
	for {
		var elem strings.Builder
		if i < len(s) && s[i] == '"' {
			i++
			for {
				if i >= len(s) {
					return nil, false
				}
				if s[i] == '"' {
					if i+1 < len(s) && s[i+1] == '"' {
						elem.WriteByte('"')
						i += 2
						continue
					}
					i++
					break
				}
				elem.WriteByte(s[i])
				i++
			}
		} else {
			start := i
			for i < len(s) && s[i] != ',' && !strings.ContainsRune(" \t\n\r\f\v", rune(s[i])) {
				i++
			}
			if i == start {
				return nil, false
			}
			elem.WriteString(s[start:i])
		}
		out = append(out, elem.String())
		skip()
		if i == len(s) {
			return out, true
		}
		if s[i] != ',' {
			return nil, false
		}
		i++
		skip()
	}
}
