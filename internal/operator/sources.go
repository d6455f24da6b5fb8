package operator

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/chartpilot/chartpilot/internal/policy"
	"github.com/chartpilot/chartpilot/internal/source"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// newSource makes the chart source of a watch. Credentials are read from
// their Secret for every refresh and download, so rotation needs no restart.
func newSource(w watches.Watch, cacheDir string, limits source.Options, reader client.Reader) (source.Source, error) {
	if w.Remote == nil {
		return source.NewLocal(w.Chart)
	}
	rc := w.Remote
	if cacheDir == "" {
		base, err := os.UserCacheDir()
		if err != nil {
			base = os.TempDir()
		}
		cacheDir = filepath.Join(base, "chartpilot", "charts")
	}
	opts := source.Options{
		CacheDir:     filepath.Join(cacheDir, source.CacheKey(rc.Repo, rc.Name)),
		Interval:     rc.Interval,
		PlainHTTP:    rc.PlainHTTP,
		AllowedHosts: rc.AllowedHosts,

		MaxIndexSize:   limits.MaxIndexSize,
		MaxArchiveSize: limits.MaxArchiveSize,
	}
	if ref := rc.SecretRef; ref != nil {
		opts.Credentials = func(ctx context.Context) (source.Credentials, error) {
			s := &corev1.Secret{}
			if err := reader.Get(ctx, types.NamespacedName{Namespace: ref.Namespace, Name: ref.Name}, s); err != nil {
				return source.Credentials{}, fmt.Errorf("reading Secret %s/%s named in chart.secretRef: %w", ref.Namespace, ref.Name, err)
			}
			cr := source.Credentials{Username: string(s.Data["username"]), Password: string(s.Data["password"]), CAData: s.Data["ca.crt"]}
			if (cr.Username == "") != (cr.Password == "") {
				return cr, errors.New("Secret " + ref.Namespace + "/" + ref.Name + " named in chart.secretRef must hold both keys username and password, or neither")
			}
			return cr, nil
		}
	}
	if rc.OCI() {
		return source.NewOCI(rc.Repo, rc.Name, opts)
	}
	return source.NewRepo(rc.Repo, rc.Name, opts)
}

// newestOf names the chart of a watch and the newest version its
// constraint allows among those known (for policies and admission, which
// judge a resource before its own version is chosen).
func newestOf(w watches.Watch, src source.Source) func() (string, string) {
	return func() (string, string) {
		versions, _ := src.Versions()
		pol := policy.Policy{Chart: src.Name()}
		if w.Remote != nil {
			pol.Watch = w.Remote.Version
		}
		c, err := policy.Choose(versions, pol)
		if err != nil {
			return src.Name(), ""
		}
		return src.Name(), c.Version
	}
}
