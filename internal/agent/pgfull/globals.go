package pgfull

import (
	"errors"
	"fmt"
	"strconv"
	"strings"
)

// Full backups written before the roles were rows hold them as
// pg_dumpall --globals-only SQL. That text is never run: it is read,
// token by token (quotes and comments as the server reads them, never by
// lines), into Roles, and only the statements pg_dumpall writes for roles
// are accepted. A restore then builds its own statements from the result,
// as for rows.

// token is one lexical token of the SQL text.
type token struct {
	kind byte // 'k' keyword or bare identifier (lower case), 'i' quoted identifier, 's' string, 'n' number, 'p' punctuation
	text string
}

// tokenize splits sql into statements of tokens.
func tokenize(sql string) ([][]token, error) {
	var stmts [][]token
	var cur []token
	i := 0
	for i < len(sql) {
		c := sql[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f':
			i++
		case strings.HasPrefix(sql[i:], "--"):
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
		case strings.HasPrefix(sql[i:], "/*"):
			end := strings.Index(sql[i+2:], "*/")
			if end < 0 {
				return nil, errors.New("an unterminated comment")
			}
			i += end + 4
		case c == ';':
			if len(cur) > 0 {
				stmts = append(stmts, cur)
			}
			cur = nil
			i++
		case c == ',' || c == '=' || c == '(' || c == ')' || c == '.':
			cur = append(cur, token{'p', string(c)})
			i++
		case c == '\'' || c == '"':
			text, next, ok := scanQuoted(sql, i)
			if !ok {
				return nil, errors.New("an unterminated quote")
			}
			kind := byte('s')
			if c == '"' {
				kind = 'i'
			}
			cur = append(cur, token{kind, text})
			i = next
		case c == '-' || c >= '0' && c <= '9':
			j := i + 1
			for j < len(sql) && sql[j] >= '0' && sql[j] <= '9' {
				j++
			}
			cur = append(cur, token{'n', sql[i:j]})
			i = j
		case c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z':
			j := scanWord(sql, i)
			if j < len(sql) && sql[j] == '\'' {
				// E'…', U&'…', B'…': pg_dumpall writes none of them.
				return nil, fmt.Errorf("a %s-prefixed string", sql[i:j])
			}
			cur = append(cur, token{'k', strings.ToLower(sql[i:j])})
			i = j
		case c == '\\':
			// A psql meta-command (\connect): the rest of the line.
			for i < len(sql) && sql[i] != '\n' {
				i++
			}
		default:
			return nil, fmt.Errorf("unexpected %q", c)
		}
	}
	if len(cur) > 0 {
		return nil, errors.New("a statement without its ;")
	}
	return stmts, nil
}

// scanQuoted reads the quoted string or identifier starting at sql[i] (its
// quote doubled within it): its text and the index after it; false when it
// is not closed.
func scanQuoted(sql string, i int) (string, int, bool) {
	q := sql[i]
	var b strings.Builder
	for j := i + 1; j < len(sql); j++ {
		if sql[j] == q {
			if j+1 < len(sql) && sql[j+1] == q {
				b.WriteByte(q)
				j++
				continue
			}
			return b.String(), j + 1, true
		}
		b.WriteByte(sql[j])
	}
	return "", len(sql), false
}

// scanWord is the index after the keyword or bare name starting at sql[i].
func scanWord(sql string, i int) int {
	j := i + 1
	for j < len(sql) && (sql[j] == '_' || sql[j] == '$' || sql[j] >= 'a' && sql[j] <= 'z' || sql[j] >= 'A' && sql[j] <= 'Z' || sql[j] >= '0' && sql[j] <= '9') {
		j++
	}
	return j
}

// parseGlobals reads pg_dumpall --globals-only SQL into Roles.
func parseGlobals(sql string) (*Roles, error) {
	stmts, err := tokenize(sql)
	if err != nil {
		return nil, fmt.Errorf("the roles' SQL: %w", err)
	}
	out := &Roles{}
	index := map[string]int{}
	role := func(name string) *Role {
		i, ok := index[name]
		if !ok {
			i = len(out.Roles)
			index[name] = i
			out.Roles = append(out.Roles, Role{Name: name, Inherit: true, ConnectionLimit: -1})
		}
		return &out.Roles[i]
	}
	for n, st := range stmts {
		p := &parser{toks: st}
		if err := p.statement(out, role); err != nil {
			return nil, fmt.Errorf("the roles' SQL, statement %d: %w", n+1, err)
		}
	}
	return out, nil
}

type parser struct {
	toks []token
	pos  int
}

func (p *parser) peek() token {
	if p.pos < len(p.toks) {
		return p.toks[p.pos]
	}
	return token{}
}

func (p *parser) keyword(words ...string) bool {
	for i, w := range words {
		if t := p.toks; p.pos+i >= len(t) || t[p.pos+i].kind != 'k' || t[p.pos+i].text != w {
			return false
		}
	}
	p.pos += len(words)
	return true
}

func (p *parser) name() (string, error) {
	t := p.peek()
	if t.kind != 'i' && t.kind != 'k' {
		return "", fmt.Errorf("a name expected, found %q", t.text)
	}
	p.pos++
	return t.text, nil
}

func (p *parser) str() (string, error) {
	t := p.peek()
	if t.kind != 's' {
		return "", fmt.Errorf("a string expected, found %q", t.text)
	}
	p.pos++
	return t.text, nil
}

func (p *parser) end() error {
	if p.pos != len(p.toks) {
		return fmt.Errorf("unexpected %q", p.peek().text)
	}
	return nil
}

func (p *parser) statement(out *Roles, role func(string) *Role) error {
	switch {
	case p.keyword("set"), p.keyword("comment", "on", "role"), p.keyword("security", "label"):
		return nil // session settings; comments and labels are not restored
	case p.keyword("create", "role"):
		name, err := p.name()
		if err != nil {
			return err
		}
		role(name)
		return p.end()
	case p.keyword("alter", "role"):
		name, err := p.name()
		if err != nil {
			return err
		}
		switch {
		case p.keyword("with"):
			return p.attributes(role(name))
		case p.keyword("set"):
			return p.setting(out, name)
		case p.keyword("in", "database"):
			return nil // restored with the database it names
		}
		return fmt.Errorf("ALTER ROLE %q: unexpected %q", name, p.peek().text)
	case p.keyword("grant"):
		granted, err := p.name()
		if err != nil {
			return err
		}
		if !p.keyword("to") {
			return errors.New("GRANT: TO expected")
		}
		member, err := p.name()
		if err != nil {
			return err
		}
		m := Membership{Role: granted, Member: member}
		if p.keyword("with") {
			for {
				switch {
				case p.keyword("admin", "option"), p.keyword("admin", "true"):
					m.Admin = true
				case p.keyword("admin", "false"):
				case p.keyword("inherit", "true"), p.keyword("inherit", "false"):
					v := p.toks[p.pos-1].text == "true"
					m.Inherit = &v
				case p.keyword("set", "true"), p.keyword("set", "false"):
					v := p.toks[p.pos-1].text == "true"
					m.Set = &v
				default:
					return fmt.Errorf("GRANT: unexpected %q", p.peek().text)
				}
				if p.peek() != (token{'p', ","}) {
					break
				}
				p.pos++
			}
		}
		if p.keyword("granted", "by") {
			if _, err := p.name(); err != nil {
				return err
			}
		}
		out.Members = append(out.Members, m)
		return p.end()
	}
	return fmt.Errorf("not a statement of roles: %q", p.peek().text)
}

func (p *parser) attributes(r *Role) error {
	flags := map[string]*bool{"superuser": &r.Superuser, "inherit": &r.Inherit, "createrole": &r.CreateRole, "createdb": &r.CreateDB,
		"login": &r.Login, "replication": &r.Replication, "bypassrls": &r.BypassRLS}
	for p.pos < len(p.toks) {
		t := p.peek()
		if t.kind != 'k' {
			return fmt.Errorf("ALTER ROLE %q: unexpected %q", r.Name, t.text)
		}
		if f, ok := flags[t.text]; ok {
			*f = true
			p.pos++
			continue
		}
		if f, ok := flags[strings.TrimPrefix(t.text, "no")]; ok && strings.HasPrefix(t.text, "no") {
			*f = false
			p.pos++
			continue
		}
		switch {
		case p.keyword("connection", "limit"):
			n, err := strconv.Atoi(p.peek().text)
			if p.peek().kind != 'n' || err != nil {
				return fmt.Errorf("ALTER ROLE %q: CONNECTION LIMIT takes a number", r.Name)
			}
			r.ConnectionLimit = n
			p.pos++
		case p.keyword("password", "null"):
			r.Password = nil
		case p.keyword("password"):
			s, err := p.str()
			if err != nil {
				return err
			}
			r.Password = &s
		case p.keyword("valid", "until"):
			s, err := p.str()
			if err != nil {
				return err
			}
			r.ValidUntil = &s
		default:
			return fmt.Errorf("ALTER ROLE %q: unexpected %q", r.Name, t.text)
		}
	}
	return nil
}

// setting reads "name TO value[, value…]" (or "name = …").
func (p *parser) setting(out *Roles, role string) error {
	name, err := p.name()
	if err != nil {
		return err
	}
	for p.peek() == (token{'p', "."}) { // a placeholder's name: prefix.name
		p.pos++
		part, err := p.name()
		if err != nil {
			return err
		}
		name += "." + part
	}
	if !p.keyword("to") {
		if t := p.peek(); t.kind == 'p' && t.text == "=" {
			p.pos++
		} else {
			return fmt.Errorf("ALTER ROLE %q SET %q: TO expected", role, name)
		}
	}
	var values []string
	for {
		t := p.peek()
		if t.kind != 's' && t.kind != 'i' && t.kind != 'k' && t.kind != 'n' {
			return fmt.Errorf("ALTER ROLE %q SET %q: a value expected", role, name)
		}
		values = append(values, t.text)
		p.pos++
		if p.peek() != (token{'p', ","}) {
			break
		}
		p.pos++
	}
	if err := p.end(); err != nil {
		return err
	}
	out.Settings = append(out.Settings, Setting{Role: role, Parsed: [][]string{append([]string{name}, values...)}})
	return nil
}
