package agentargs

import (
	"flag"
	"strconv"
)

// MajorUpgrade is the command line of `chartpilot major-upgrade`: Args
// writes it (the major upgrade Job), Register parses it (the agent).
type MajorUpgrade struct {
	// Bin holds the new major's binaries; ClientBin psql, pg_dump and
	// pg_restore when they are elsewhere.
	Bin, ClientBin string
	// Data is the new data directory (it must not exist); WorkDir holds
	// the dump and the new server's socket.
	Data, WorkDir string
	// Port is the new server's, on its socket only.
	Port int
	// MarkMoved marks the data as moved from the primary, for the
	// instance managers.
	MarkMoved bool
	// Report also gets the report (a Job's /dev/termination-log).
	Report string
}

// DefaultMajorUpgradePort is the new server's port while it is filled.
const DefaultMajorUpgradePort = 5433

// Args is m as the agent's arguments, after `chartpilot major-upgrade`.
func (m MajorUpgrade) Args() []string {
	var out []string
	add := func(flag, v string) {
		if v != "" {
			out = append(out, flag, v)
		}
	}
	add("--bin", m.Bin)
	add("--client-bin", m.ClientBin)
	add("--data", m.Data)
	add("--work-dir", m.WorkDir)
	if m.Port != 0 && m.Port != DefaultMajorUpgradePort {
		out = append(out, "--port", strconv.Itoa(m.Port))
	}
	add("--report", m.Report)
	if m.MarkMoved {
		out = append(out, "--mark-moved")
	}
	return out
}

// Register makes fs parse the flags of `chartpilot major-upgrade` into m.
func (m *MajorUpgrade) Register(fs *flag.FlagSet) {
	fs.StringVar(&m.Bin, "bin", "", "the new major's binaries: initdb, postgres, psql, pg_dump, pg_restore (required)")
	fs.StringVar(&m.ClientBin, "client-bin", "", "psql, pg_dump and pg_restore, when not in --bin")
	fs.StringVar(&m.Data, "data", "", "the new data directory; it must not exist (required)")
	fs.StringVar(&m.WorkDir, "work-dir", "", "directory for the dump and the new server's socket, removed at the end (required; beside the new data, on the same volume)")
	fs.IntVar(&m.Port, "port", DefaultMajorUpgradePort, "port of the new server while it is filled (no TCP listener: a socket in --work-dir)")
	fs.BoolVar(&m.MarkMoved, "mark-moved", false, "on success, mark the data as moved from the primary (instance managers: the member with it leads)")
	fs.StringVar(&m.Report, "report", "", "also write the report to this file (a Job's /dev/termination-log)")
}
