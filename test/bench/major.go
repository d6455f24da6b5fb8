package main

import (
	"context"
	"fmt"
	"path/filepath"
	"syscall"

	"github.com/chartpilot/chartpilot/internal/agent/majorupgrade"
	"github.com/chartpilot/chartpilot/internal/testing/testpg"
)

type majorRow struct {
	dbMB float64
	res  majorupgrade.Result
}

// runMajorBench fills a PostgreSQL 15 database of about mb MiB and moves it
// to PostgreSQL 17 (bin/postgresql/17, from make tools) the way a major
// upgrade does: writes stopped, a full dump, initdb of the new major,
// restore, every table's rows and checksum compared.
func runMajorBench(root string, mb int) (majorRow, error) {
	t := &benchT{}
	defer t.done()
	pg := testpg.Start(t)
	logf("major upgrade: filling a database of about %d MiB", mb)
	dbMB := fillBig(t, pg, mb)
	work := pg.TempDir(t)
	logf("major upgrade: 15 → 17 of %.0f MiB", dbMB)
	res, err := majorupgrade.Run(context.Background(), majorupgrade.Plan{
		ClientBin: testpg.Bin(t), NewBin: filepath.Join(root, "bin", "postgresql", "17", "bin"),
		OldHost: pg.Dir, OldPort: pg.Port,
		NewData: filepath.Join(work, "data-17"), WorkDir: work, NewPort: testpg.FreePort(t),
		User: "postgres", Credential: &syscall.Credential{Uid: uint32(pg.UID), Gid: uint32(pg.GID)},
		Log: func(step, _ string) { logf("major upgrade: %s", step) },
	})
	return majorRow{dbMB: dbMB, res: res}, err
}

func printMajor(r *majorRow) {
	if r == nil {
		return
	}
	fmt.Printf("\nMajor upgrade — PostgreSQL 15 (Debian) to 17 (npm's embedded-postgres) by dump and restore into a new data directory, every table's rows and checksum compared\n\n")
	fmt.Println("| database (MiB) | tables | rows | total (s) | MiB/s |")
	fmt.Println("|---:|---:|---:|---:|---:|")
	fmt.Printf("| %.0f | %d | %d | %.1f | %.0f |\n", r.dbMB, r.res.Tables, r.res.Rows, r.res.Took.Seconds(), r.dbMB/r.res.Took.Seconds())
}
