package instance

import (
	"crypto/hmac"
	"crypto/pbkdf2"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"
)

// Standbys clone, rewind and stream as a replication role of their own
// (Config.ReplicationUser): LOGIN REPLICATION, no superuser, and EXECUTE
// on the four functions pg_rewind reads the source's files with. The
// primary makes the role, or repairs it, as soon as it leads; the password
// reaches the server as a SCRAM verifier computed here, in a script read
// from standard input (never a command line, never the server's log).
// Until the primary has the role (a primary of an older manager, during a
// rolling upgrade), a standby connects as the superuser, and says so.

// rewindFunctions are what pg_rewind calls on its source.
var rewindFunctions = []string{
	"pg_catalog.pg_ls_dir(text, boolean, boolean)",
	"pg_catalog.pg_stat_file(text, boolean)",
	"pg_catalog.pg_read_binary_file(text)",
	"pg_catalog.pg_read_binary_file(text, bigint, bigint, boolean)",
}

// roleName is what a role this manager makes may be called: it goes into
// SQL and pg_hba.conf unquoted.
var roleName = regexp.MustCompile(`^[a-z_][a-z0-9_]{0,62}$`)

// checkReplication reports a configuration error of the replication
// role, naming the flag.
func (c *Config) checkReplication() error {
	switch {
	case c.ReplicationUser == "":
		return nil
	case !roleName.MatchString(c.ReplicationUser):
		return fmt.Errorf("--replication-user %q: a role name of lower-case letters, digits and _ (at most 63, not starting with a digit)", c.ReplicationUser)
	case c.ReplicationUser == c.User:
		return fmt.Errorf("--replication-user %q is the superuser (--user): give a role of its own, or none to replicate as the superuser", c.ReplicationUser)
	case strings.HasPrefix(c.ReplicationUser, "pg_"):
		return fmt.Errorf("--replication-user %q: names starting with pg_ are reserved by PostgreSQL", c.ReplicationUser)
	}
	for _, r := range c.ReplicationPassword {
		if r < 0x20 || r > 0x7e {
			return errors.New("the replication password ($REPLICATION_PASSWORD or --replication-password-file) holds a character other than printable ASCII: use letters, digits and punctuation")
		}
	}
	return nil
}

// replicating reports whether a replication role is configured and usable
// (it has a password: with none, standbys connect as the superuser).
func (c *Config) replicating() bool {
	return c.ReplicationUser != "" && c.ReplicationPassword != ""
}

// scramIterations is PostgreSQL's default (scram_iterations).
const scramIterations = 4096

// scramVerifier is the SCRAM-SHA-256 verifier of password, as PostgreSQL
// stores it in pg_authid.rolpassword. The password must be printable
// ASCII, which SASLprep leaves as it is.
func scramVerifier(password string, salt []byte, iterations int) (string, error) {
	stored, server, err := scramKeys(password, salt, iterations)
	if err != nil {
		return "", err
	}
	b64 := base64.StdEncoding.EncodeToString
	return fmt.Sprintf("SCRAM-SHA-256$%d:%s$%s:%s", iterations, b64(salt), b64(stored), b64(server)), nil
}

func scramKeys(password string, salt []byte, iterations int) (stored, server []byte, err error) {
	salted, err := pbkdf2.Key(sha256.New, password, salt, iterations, sha256.Size)
	if err != nil {
		return nil, nil, err
	}
	mac := func(msg string) []byte {
		h := hmac.New(sha256.New, salted)
		h.Write([]byte(msg))
		return h.Sum(nil)
	}
	client := sha256.Sum256(mac("Client Key"))
	return client[:], mac("Server Key"), nil
}

// verifies reports whether verifier (a pg_authid.rolpassword) is
// password's SCRAM-SHA-256 verifier; any other form is not.
func verifies(verifier, password string) bool {
	rest, ok := strings.CutPrefix(verifier, "SCRAM-SHA-256$")
	if !ok {
		return false
	}
	params, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return false
	}
	iter, saltB64, ok1 := strings.Cut(params, ":")
	storedB64, serverB64, ok2 := strings.Cut(keys, ":")
	n, err := strconv.Atoi(iter)
	if !ok1 || !ok2 || err != nil || n < 1 || n > 1<<20 {
		return false
	}
	salt, err1 := base64.StdEncoding.DecodeString(saltB64)
	wantStored, err2 := base64.StdEncoding.DecodeString(storedB64)
	wantServer, err3 := base64.StdEncoding.DecodeString(serverB64)
	if err1 != nil || err2 != nil || err3 != nil {
		return false
	}
	stored, server, err := scramKeys(password, salt, n)
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare(stored, wantStored) == 1 && subtle.ConstantTimeCompare(server, wantServer) == 1
}

// ensureReplicationRole makes the replication role on this primary as
// configured, writing only what differs (a primary that already has it
// writes nothing).
func (s *server) ensureReplicationRole() error {
	if !s.cfg.replicating() {
		return nil
	}
	name := s.cfg.ReplicationUser
	var grants []string
	for _, f := range rewindFunctions {
		grants = append(grants, fmt.Sprintf("has_function_privilege('%s', '%s', 'EXECUTE')", name, f))
	}
	// Wrong besides its attributes: a role that made it first (CREATEROLE
	// on PostgreSQL 16 and later keeps ADMIN on what it makes) or was
	// granted it could take its privileges (SET ROLE, the rewind's file
	// functions), lock it out (VALID UNTIL, CONNECTION LIMIT) or give it
	// settings. So nobody may be a member of it, it of nobody, and it has
	// no settings of its own.
	out, err := s.query(fmt.Sprintf(`SELECT rolsuper OR rolcreaterole OR rolcreatedb OR rolbypassrls OR NOT rolcanlogin OR NOT rolreplication
  OR COALESCE(rolvaliduntil <> 'infinity', false) OR rolconnlimit <> -1
  OR EXISTS (SELECT FROM pg_auth_members m WHERE m.roleid = a.oid OR m.member = a.oid)
  OR EXISTS (SELECT FROM pg_db_role_setting d WHERE d.setrole = a.oid),
  COALESCE(rolpassword, ''), %s FROM pg_authid a WHERE rolname = '%s'`,
		strings.Join(grants, " AND "), name))
	if err != nil {
		return fmt.Errorf("reading the replication role %s: %w", name, err)
	}
	if out != "" {
		wrong, rest, _ := strings.Cut(out, "|")
		verifier, granted, _ := strings.Cut(rest, "|")
		if wrong == "f" && granted == "t" && verifies(verifier, s.cfg.ReplicationPassword) {
			return nil
		}
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return err
	}
	verifier, err := scramVerifier(s.cfg.ReplicationPassword, salt, scramIterations)
	if err != nil {
		return err
	}
	var b strings.Builder
	// Not logged whatever the server's settings: the statement carries
	// the verifier.
	// Bounded: a role holding a lock on the replication role (ALTER ROLE
	// in an open transaction) must not stall the primary's manager.
	b.WriteString("SET log_statement = 'none';\nSET log_min_duration_statement = -1;\n")
	b.WriteString("SET lock_timeout = '5s';\nSET statement_timeout = '60s';\n")
	b.WriteString("CREATE TEMPORARY TABLE chartpilot_former (member oid);\nBEGIN;\n")
	fmt.Fprintf(&b, "DO $$BEGIN IF NOT EXISTS (SELECT FROM pg_roles WHERE rolname = '%s') THEN CREATE ROLE \"%s\"; END IF; END$$;\n", name, name)
	fmt.Fprintf(&b, "INSERT INTO chartpilot_former SELECT m.member FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_authid a ON a.oid = m.roleid WHERE a.rolname = '%s';\n", name)
	fmt.Fprintf(&b, "ALTER ROLE \"%s\" WITH LOGIN REPLICATION NOSUPERUSER NOCREATEDB NOCREATEROLE NOBYPASSRLS CONNECTION LIMIT -1 VALID UNTIL 'infinity' PASSWORD '%s';\n", name, verifier)
	fmt.Fprintf(&b, repairMemberships, name)
	for _, f := range rewindFunctions {
		fmt.Fprintf(&b, "REVOKE EXECUTE ON FUNCTION %s FROM \"%s\";\n", f, name)
	}
	b.WriteString("COMMIT;\n")
	// A session that became the role (SET ROLE, by a former member) or
	// logged in as it (with a password its maker set) stays it: such
	// sessions end before the role gets the rewind's file functions. Its
	// own streaming standbys reconnect with the password just set.
	fmt.Fprintf(&b, "SELECT count(pg_catalog.pg_terminate_backend(pid, 5000)) FROM pg_catalog.pg_stat_activity WHERE pid <> pg_catalog.pg_backend_pid() AND (usesysid IN (SELECT member FROM chartpilot_former) OR usename = '%s');\n", name)
	b.WriteString("BEGIN;\n")
	for _, f := range rewindFunctions {
		fmt.Fprintf(&b, "GRANT EXECUTE ON FUNCTION %s TO \"%s\";\n", f, name)
	}
	b.WriteString("COMMIT;\n")
	if _, err := s.script(b.String()); err != nil {
		return fmt.Errorf("making the replication role %s: %w", name, err)
	}
	if out == "" {
		s.cfg.Log.Info("Made the replication role", "role", name)
	} else {
		s.cfg.Log.Info("Repaired the replication role (attributes, grants or password)", "role", name)
	}
	return nil
}

// repairMemberships (a format of the role's name) takes every membership
// in the replication role and of it away, with what was granted through
// them (CASCADE), and its settings in every database. Grants have a
// grantor each from PostgreSQL 16 on, and are revoked as made.
const repairMemberships = `DO $$DECLARE r record; BEGIN
  FOR r IN SELECT m.roleid::regrole AS granted, m.member::regrole AS member, m.grantor::regrole AS grantor
    FROM pg_catalog.pg_auth_members m JOIN pg_catalog.pg_authid a ON a.oid IN (m.roleid, m.member) WHERE a.rolname = '%[1]s'
  LOOP
    IF current_setting('server_version_num')::int >= 160000 THEN
      EXECUTE format('REVOKE %%s FROM %%s GRANTED BY %%s CASCADE', r.granted, r.member, r.grantor);
    ELSE
      EXECUTE format('REVOKE %%s FROM %%s CASCADE', r.granted, r.member);
    END IF;
  END LOOP;
END$$;
ALTER ROLE "%[1]s" RESET ALL;
DO $$DECLARE d name; BEGIN
  FOR d IN SELECT datname FROM pg_catalog.pg_db_role_setting s JOIN pg_catalog.pg_database ON pg_database.oid = s.setdatabase
    WHERE s.setrole = '"%[1]s"'::regrole
  LOOP
    EXECUTE format('ALTER ROLE %%I IN DATABASE %%I RESET ALL', '%[1]s', d);
  END LOOP;
END$$;
`

// replicationUser is the role to clone, rewind and stream from the
// primary at address as: the replication role once the primary has it
// (it can log in with its password and has REPLICATION), else the
// superuser. An error other than the role's own refusal is returned: the
// caller tries again rather than settling on the superuser.
func (s *server) replicationUser(address string) (string, error) {
	if !s.cfg.replicating() {
		return s.cfg.User, nil
	}
	out, err := s.run("psql", "-X", "-A", "-t", "-q", "-d", s.conninfo(address, s.cfg.ReplicationUser)+" dbname=postgres", "-c", "SELECT rolreplication FROM pg_roles WHERE rolname = current_user")
	switch {
	case err == nil && strings.TrimSpace(out) == "t":
		return s.replicateAs(s.cfg.ReplicationUser)
	case err == nil:
		s.cfg.Log.Info("The primary's replication role lacks REPLICATION (an older primary's): replicating as the superuser until it has it", "role", s.cfg.ReplicationUser)
		return s.replicateAs(s.cfg.User)
	case strings.Contains(out, "password authentication failed") || strings.Contains(out, "does not exist"):
		s.cfg.Log.Info("The primary has no replication role for this password yet (an older primary's): replicating as the superuser until it has", "role", s.cfg.ReplicationUser)
		return s.replicateAs(s.cfg.User)
	}
	return "", fmt.Errorf("reaching the primary as %s: %w", s.cfg.ReplicationUser, err)
}

// passfile holds the members' passwords for libpq (PGPASSFILE of every
// client command and of the server's WAL receiver), in the socket
// directory, readable by the server's user only.
func (s *server) passfile() string { return filepath.Join(s.cfg.SocketDir, ".chartpilot.pgpass") }

// writePassfile writes the passfile: the replication role's password,
// and the superuser's only while the superuser is what replicates (no
// replication role, or a primary that has none yet). The server's user
// owns the file, so a role that may read the server's files
// (pg_read_server_files) reads it too: it must not find the superuser's
// password there.
func (s *server) writePassfile(superuser bool) error {
	esc := strings.NewReplacer(`\`, `\\`, `:`, `\:`)
	var b strings.Builder
	if superuser && s.cfg.Password != "" {
		fmt.Fprintf(&b, "*:*:*:%s:%s\n", esc.Replace(s.cfg.User), esc.Replace(s.cfg.Password))
	}
	if s.cfg.replicating() {
		fmt.Fprintf(&b, "*:*:*:%s:%s\n", s.cfg.ReplicationUser, esc.Replace(s.cfg.ReplicationPassword))
	}
	if err := writeAs(s.cfg, s.passfile(), []byte(b.String())); err != nil {
		return fmt.Errorf("writing the passfile %s: %w", s.passfile(), err)
	}
	s.passfileSuperuser = superuser
	return nil
}

// replicateAs makes the passfile hold what replicating as user needs.
func (s *server) replicateAs(user string) (string, error) {
	if super := user == s.cfg.User; super != s.passfileSuperuser {
		if err := s.writePassfile(super); err != nil {
			return "", err
		}
	}
	return user, nil
}

// roleCheckEvery is how often a primary makes sure of the replication
// role (a read of pg_authid; a write only when something differs).
const roleCheckEvery = time.Minute

// reprobeEvery is how often a standby that streams as the superuser
// checks whether the primary has the replication role now.
const reprobeEvery = 30 * time.Second
