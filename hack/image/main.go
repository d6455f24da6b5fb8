// Command image builds chartpilot's OCI image index (see internal/image),
// writes it as an OCI layout and, with -push, pushes it.
//
//	go run ./hack/image -out bin/image/oci -binary linux/amd64=bin/image/linux-amd64/chartpilot \
//	    -binary linux/arm64=bin/image/linux-arm64/chartpilot \
//	    -manager linux/amd64=bin/image/linux-amd64/chartpilot-manager -manager linux/arm64=bin/image/linux-arm64/chartpilot-manager -version v0.1.0 -revision $(git rev-parse HEAD) \
//	    [-created UNIX-SECONDS] [-push registry.example.com/chartpilot:v0.1.0]
//
// Pushing authenticates with $IMAGE_USERNAME and $IMAGE_PASSWORD when set.
package main

import (
	"flag"
	"fmt"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/authn"
	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/chartpilot/chartpilot/internal/image"
)

type binaries map[string]string

func (b binaries) String() string { return fmt.Sprint(map[string]string(b)) }

func (b binaries) Set(s string) error {
	p, path, ok := strings.Cut(s, "=")
	if !ok || p == "" || path == "" {
		return fmt.Errorf("%q: write PLATFORM=PATH, e.g. linux/amd64=bin/image/linux-amd64/chartpilot", s)
	}
	b[p] = path
	return nil
}

func main() {
	bins, managers := binaries{}, binaries{}
	o := image.Options{}
	flag.Var(bins, "binary", "PLATFORM=PATH of a static chartpilot binary (repeat per platform)")
	flag.Var(managers, "manager", "PLATFORM=PATH of a static chartpilot-manager binary (-tags manager), the entrypoint (repeat per platform)")
	flag.StringVar(&o.Root, "root", ".", "the repository (watches.yaml, charts/)")
	flag.StringVar(&o.Version, "version", "dev", "org.opencontainers.image.version")
	flag.StringVar(&o.Revision, "revision", "", "org.opencontainers.image.revision (a commit)")
	flag.StringVar(&o.Source, "source", "https://github.com/chartpilot/chartpilot", "org.opencontainers.image.source")
	created := flag.String("created", os.Getenv("SOURCE_DATE_EPOCH"), "the image's time in Unix seconds (default $SOURCE_DATE_EPOCH, else the epoch)")
	out := flag.String("out", "bin/image/oci", "OCI layout directory written")
	push := flag.String("push", "", "push the index to this reference (registry/repository:tag)")
	flag.Parse()
	o.Binaries, o.Managers = bins, managers
	if *created != "" {
		secs, err := strconv.ParseInt(*created, 10, 64)
		if err != nil {
			fail(fmt.Errorf("-created %q: Unix seconds: %w", *created, err))
		}
		o.Created = time.Unix(secs, 0)
	}
	idx, err := image.Build(o)
	if err != nil {
		fail(err)
	}
	if err := os.RemoveAll(*out); err != nil {
		fail(err)
	}
	p, err := layout.Write(*out, empty.Index)
	if err != nil {
		fail(err)
	}
	if err := p.AppendIndex(idx); err != nil {
		fail(err)
	}
	digest, err := idx.Digest()
	if err != nil {
		fail(err)
	}
	fmt.Printf("%s written to %s\n", digest, *out)
	if *push != "" {
		ref, err := name.ParseReference(*push)
		if err != nil {
			fail(fmt.Errorf("-push %q: %w", *push, err))
		}
		// Credentials from the environment (none: anonymous), so that no
		// Docker configuration is needed.
		var auth authn.Authenticator = authn.Anonymous
		if u := os.Getenv("IMAGE_USERNAME"); u != "" {
			auth = authn.FromConfig(authn.AuthConfig{Username: u, Password: os.Getenv("IMAGE_PASSWORD")})
		}
		if err := remote.WriteIndex(ref, idx, remote.WithAuth(auth)); err != nil {
			fail(fmt.Errorf("pushing %s: %w", ref, err))
		}
		fmt.Printf("pushed %s@%s\n", ref.Context(), digest)
	}
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "image:", err)
	os.Exit(1)
}
