package e2e

import (
	"os"
	"path/filepath"
	"strings"
	"sync"

	"k8s.io/client-go/rest"

	"github.com/chartpilot/chartpilot/internal/rbac"
	"github.com/chartpilot/chartpilot/internal/watches"
)

var (
	managerOnce sync.Once
	managerCfg  *rest.Config
	managerErr  error
)

// managerConfig is a client config of ServiceAccount chartpilot-system/manager,
// bound to the ClusterRole that `chartpilot rbac` derives from watches.yaml
// (with impersonation of the tests' "deployer"): the end-to-end tests run
// the operator under the least privilege it declares, not as cluster-admin.
func managerConfig(ws []watches.Watch) (*rest.Config, error) {
	managerOnce.Do(func() { managerCfg, managerErr = makeManagerConfig(ws) })
	return managerCfg, managerErr
}

func makeManagerConfig(ws []watches.Watch) (*rest.Config, error) {
	var crds [][]byte
	err := filepath.WalkDir(filepath.Join("..", "..", "config", "crd"), func(path string, d os.DirEntry, err error) error {
		if err != nil || d.IsDir() || !strings.HasSuffix(path, ".yaml") {
			return err
		}
		b, err := os.ReadFile(path)
		crds = append(crds, b)
		return err
	})
	if err != nil {
		return nil, err
	}
	b, err := os.ReadFile(crdPaths[2])
	if err != nil {
		return nil, err
	}
	crds = append(crds, b)
	plurals, err := rbac.Plurals(crds...)
	if err != nil {
		return nil, err
	}
	rules, err := rbac.Rules(rbac.Options{Watches: ws, Impersonate: []string{"deployer"}, KubeVersion: "v1.37.2", Plurals: plurals})
	if err != nil {
		return nil, err
	}
	return cluster.ServiceAccountConfig("chartpilot-system", "manager", rules)
}
