// Command bundle writes chartpilot's OLM bundle (see internal/bundle) from
// config/ into bundle/.
//
//	go run ./hack/bundle -version 0.1.0 -image ghcr.io/chartpilot/chartpilot:v0.1.0 [-created UNIX-SECONDS] [-out bundle]
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"time"

	"github.com/chartpilot/chartpilot/internal/bundle"
)

func main() {
	o := bundle.Options{Root: "."}
	flag.StringVar(&o.Version, "version", "0.1.0", "the operator's version (semver)")
	flag.StringVar(&o.Image, "image", "", "the operator's image (default ghcr.io/chartpilot/chartpilot:v<version>)")
	created := flag.String("created", os.Getenv("SOURCE_DATE_EPOCH"), "the CSV's createdAt in Unix seconds (default $SOURCE_DATE_EPOCH, else the epoch)")
	out := flag.String("out", "bundle", "directory written (its manifests/ and metadata/ are replaced)")
	flag.Parse()
	if o.Image == "" {
		o.Image = "ghcr.io/chartpilot/chartpilot:v" + o.Version
	}
	o.CreatedAt = time.Unix(0, 0)
	if *created != "" {
		secs, err := strconv.ParseInt(*created, 10, 64)
		if err != nil {
			fmt.Fprintf(os.Stderr, "bundle: -created %q: Unix seconds\n", *created)
			os.Exit(1)
		}
		o.CreatedAt = time.Unix(secs, 0)
	}
	if err := bundle.Write(o, *out); err != nil {
		fmt.Fprintln(os.Stderr, "bundle:", err)
		os.Exit(1)
	}
	fmt.Printf("bundle %s (%s) written to %s\n", o.Version, bundle.Capability, *out)
}
