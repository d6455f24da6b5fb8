package release_test

import (
	"context"
	"io"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/distribution/distribution/v3/configuration"
	"github.com/distribution/distribution/v3/registry/handlers"
	_ "github.com/distribution/distribution/v3/registry/storage/driver/inmemory"
	"github.com/sirupsen/logrus"

	"github.com/chartpilot/chartpilot/internal/helm/helmtest"
	"github.com/chartpilot/chartpilot/internal/watches"
)

// TestOCISourceInstallsAndUpgrades: a chart in a real OCI registry
// (distribution, in memory, on loopback) is installed, and a version pushed
// later is rolled out.
func TestOCISourceInstallsAndUpgrades(t *testing.T) {
	e := newEnv(t)
	cfg := &configuration.Configuration{Storage: configuration.Storage{"inmemory": configuration.Parameters{}}}
	cfg.Log.Level = "error"
	cfg.Log.AccessLog.Disabled = true
	logrus.SetOutput(io.Discard) // the registry logs every request through logrus
	srv := httptest.NewServer(handlers.NewApp(context.Background(), cfg))
	t.Cleanup(srv.Close)
	base := "oci://" + strings.TrimPrefix(srv.URL, "http://") + "/charts"

	dir := t.TempDir()
	push := func(version string) {
		if err := helmtest.Push(filepath.Join("..", "..", "test", "charts", "webapp"), version, base+"/webapp", dir); err != nil {
			t.Fatal(err)
		}
	}
	push("0.3.0")
	startOperator(t, cluster.Config, []watches.Watch{webappWatch(t, func(w *watches.Watch) {
		w.Chart = ""
		w.Remote = &watches.RemoteChart{Repo: base, Name: "webapp", Version: "<1", PlainHTTP: true, Interval: time.Second}
	})}, withCache(t.TempDir()))
	e.create("oci", map[string]any{"message": "from a registry"}, nil, nil)
	e.waitVersion("oci", "0.3.0")
	push("1.0.0") // outside the watch's constraint
	push("0.3.1")
	e.waitVersion("oci", "0.3.1")
	if st := status(e.get("oci")); st.Chart == nil || st.Chart.AvailableUpgrade != "" {
		t.Errorf("status.chart = %+v: 1.0.0 is outside the watch's constraint and is no available upgrade", st.Chart)
	}
	if got := e.chartVersions("oci"); strings.Join(got, ",") != "0.3.0,0.3.1" {
		t.Errorf("history %v", got)
	}
}
