package helm

import (
	"github.com/go-logr/logr"
	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/kube"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/rest"
)

// NewOffline builds a Client that runs Helm's actions without a cluster,
// for tests of the code that drives them: release records are read and
// written through cs (a fake clientset the test seeds and inspects), the
// objects of every action go to objects (one of Helm's kube/fake clients,
// which can fail on demand), the capabilities are Helm's defaults and the
// kinds client-go knows are mapped. Anything else that would need the API
// server (a dynamic client, discovery) is sent to a closed loopback port
// and fails at once.
func NewOffline(cs kubernetes.Interface, objects kube.Interface, log logr.Logger) *Client {
	c := &Client{
		config:  &rest.Config{Host: "http://127.0.0.1:1"},
		mapper:  staticMapper{schemeMapper()},
		log:     log,
		offline: &offline{objects: objects},
		caps:    chartutil.DefaultCapabilities.Copy(),
	}
	c.cs = cs
	c.csOnce.Do(func() {})
	return c
}

// offline is what a Client made by NewOffline uses instead of the cluster.
type offline struct {
	objects kube.Interface
}

// staticMapper is a fixed mapper, never reset.
type staticMapper struct{ meta.RESTMapper }

func (staticMapper) Reset() {}

// schemeMapper maps every kind of client-go's scheme, namespaced but for
// the kinds Kubernetes keeps cluster-wide.
func schemeMapper() meta.RESTMapper {
	clusterWide := map[string]bool{
		"Namespace": true, "Node": true, "PersistentVolume": true, "ClusterRole": true, "ClusterRoleBinding": true,
		"StorageClass": true, "PriorityClass": true, "CustomResourceDefinition": true, "APIService": true,
		"ValidatingWebhookConfiguration": true, "MutatingWebhookConfiguration": true, "CSIDriver": true, "CSINode": true,
		"VolumeAttachment": true, "IngressClass": true, "RuntimeClass": true, "CertificateSigningRequest": true,
	}
	m := meta.NewDefaultRESTMapper(scheme.Scheme.PrioritizedVersionsAllGroups())
	for gvk := range scheme.Scheme.AllKnownTypes() {
		if gvk.Version == "__internal" {
			continue
		}
		s := meta.RESTScopeNamespace
		if clusterWide[gvk.Kind] {
			s = meta.RESTScopeRoot
		}
		m.Add(gvk, s)
	}
	return m
}
