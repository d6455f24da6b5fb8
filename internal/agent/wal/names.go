package wal

import (
	"bufio"
	"fmt"
	"regexp"
	"strconv"
	"strings"
)

// DefaultSegmentSize is PostgreSQL's default wal_segment_size.
const DefaultSegmentSize = 16 << 20

// Segment is one WAL segment file: a timeline and the segment's number
// (the LSN divided by the segment size).
type Segment struct {
	TLI uint32
	No  uint64
}

// segmentsPerID is how many segments one 4 GiB "log" of a name holds.
func segmentsPerID(segSize int64) uint64 { return 0x100000000 / uint64(segSize) }

// Name is the segment's file name, 24 upper-case hex digits.
func (s Segment) Name(segSize int64) string {
	per := segmentsPerID(segSize)
	return fmt.Sprintf("%08X%08X%08X", s.TLI, s.No/per, s.No%per)
}

var (
	segmentName = regexp.MustCompile(`^[0-9A-F]{24}$`)
	historyName = regexp.MustCompile(`^[0-9A-F]{8}\.history$`)
	partialName = regexp.MustCompile(`^[0-9A-F]{24}\.partial$`)
	backupName  = regexp.MustCompile(`^[0-9A-F]{24}\.[0-9A-F]{8}\.backup$`)
)

// ParseSegment reads a segment's file name.
func ParseSegment(name string, segSize int64) (Segment, error) {
	if !segmentName.MatchString(name) {
		return Segment{}, fmt.Errorf("%q is not a WAL segment's name (24 hexadecimal digits)", name)
	}
	tli, _ := strconv.ParseUint(name[0:8], 16, 32)
	log, _ := strconv.ParseUint(name[8:16], 16, 32)
	seg, _ := strconv.ParseUint(name[16:24], 16, 32)
	per := segmentsPerID(segSize)
	if seg >= per {
		return Segment{}, fmt.Errorf("%q is not a WAL segment's name for %d-byte segments", name, segSize)
	}
	return Segment{TLI: uint32(tli), No: log*per + seg}, nil
}

// ValidName reports whether name is a file archive_command is given: a
// segment, a timeline history file, a partial segment or a backup history
// file. Nothing else is pushed or fetched (a name is a key in the store).
func ValidName(name string) bool {
	return segmentName.MatchString(name) || historyName.MatchString(name) ||
		partialName.MatchString(name) || backupName.MatchString(name)
}

// IsHistory reports whether name is a timeline history file's.
func IsHistory(name string) bool { return historyName.MatchString(name) }

// HistoryName is the name of timeline tli's history file.
func HistoryName(tli uint32) string { return fmt.Sprintf("%08X.history", tli) }

// ParseLSN reads an LSN as PostgreSQL prints it ("16/B374D848").
func ParseLSN(s string) (uint64, error) {
	hi, lo, ok := strings.Cut(strings.TrimSpace(s), "/")
	h, err1 := strconv.ParseUint(hi, 16, 32)
	l, err2 := strconv.ParseUint(lo, 16, 32)
	if !ok || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("%q is not an LSN (such as 0/3000028)", s)
	}
	return h<<32 | l, nil
}

// FormatLSN prints an LSN as PostgreSQL does.
func FormatLSN(lsn uint64) string { return fmt.Sprintf("%X/%X", lsn>>32, uint32(lsn)) }

// Switch is one line of a timeline history file: timeline TLI ended at
// LSN, where its child began.
type Switch struct {
	TLI uint32
	LSN uint64
}

// ParseHistory reads a timeline history file: one switch a line, "parent
// TLI, tab, switch point, tab, reason", oldest first; # starts a comment.
func ParseHistory(data string) ([]Switch, error) {
	var out []Switch
	sc := bufio.NewScanner(strings.NewReader(data))
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) < 2 {
			return nil, fmt.Errorf("line %d: not \"timeline switchpoint reason\"", n)
		}
		tli, err := strconv.ParseUint(f[0], 10, 32)
		if err != nil {
			return nil, fmt.Errorf("line %d: timeline %q is not a number", n, f[0])
		}
		lsn, err := ParseLSN(f[1])
		if err != nil {
			return nil, fmt.Errorf("line %d: %w", n, err)
		}
		if len(out) > 0 && (uint32(tli) <= out[len(out)-1].TLI || lsn < out[len(out)-1].LSN) {
			return nil, fmt.Errorf("line %d: timelines and switch points must increase", n)
		}
		out = append(out, Switch{TLI: uint32(tli), LSN: lsn})
	}
	return out, sc.Err()
}

// Expected lists the segments a recovery from start replays, in order,
// to reach the end of timeline target whose history is hist (nil for the
// first timeline): each ancestor's segments up to the one holding its
// switch point, which is read from the child, then target's from there up
// to and including last (the newest segment of target there is; a last
// before the switch is nothing more). start's timeline must be target or
// one of its ancestors.
func Expected(start Segment, target uint32, hist []Switch, last uint64, segSize int64) ([]Segment, error) {
	if start.TLI == target {
		hist = nil
	} else {
		i := 0
		for i < len(hist) && hist[i].TLI != start.TLI {
			i++
		}
		if i == len(hist) {
			return nil, fmt.Errorf("timeline %d is not an ancestor of timeline %d", start.TLI, target)
		}
		hist = hist[i:]
	}
	var out []Segment
	cur := start.No
	for _, sw := range hist {
		end := sw.LSN / uint64(segSize)
		if end < cur {
			return nil, fmt.Errorf("timeline %d ended at %s, before the recovery's start (segment %s)", sw.TLI, FormatLSN(sw.LSN), start.Name(segSize))
		}
		for ; cur < end; cur++ {
			out = append(out, Segment{TLI: sw.TLI, No: cur})
		}
	}
	for ; cur <= last; cur++ {
		out = append(out, Segment{TLI: target, No: cur})
	}
	return out, nil
}
