package plane

import (
	"embed"
	"fmt"
	"io/fs"
	"maps"
	"path"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/yaml"
)

// manifests holds every CRD and webhook configuration the plane installs,
// copied by `make generate` (hack/plane-manifests.sh) from config/ and from
// the Cluster API module go.mod pins, so that the plane needs neither the
// checkout nor the module cache at run time.
//
//go:embed manifests
var manifests embed.FS

// Where each provider's manifests lie in manifests.
const (
	providerManifests              = "manifests/provider"
	clusterAPICoreManifests        = "manifests/cluster-api/core"
	kubeadmControlPlaneManifests   = "manifests/cluster-api/kubeadm-control-plane"
	kubeadmBootstrapManifests      = "manifests/cluster-api/kubeadm-bootstrap"
	crdsDir, webhookConfigurations = "crds", "webhooks.yaml"
)

// crdsIn reads every CRD of dir's crds/ directory.
func crdsIn(dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	files, err := fs.Glob(manifests, path.Join(dir, crdsDir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("no CRDs embedded in %s: run make generate", dir)
	}
	crds := make([]*apiextensionsv1.CustomResourceDefinition, 0, len(files))
	for _, f := range files {
		crd, err := readCRD(f)
		if err != nil {
			return nil, err
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

// labelledCRDs reads the CRDs the kustomization in dir's crds/ lists as
// resources and adds the labels of its labels[].pairs, as kustomize would:
// the topology controller looks the kubeadm providers' contract labels up.
func labelledCRDs(dir string) ([]*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := manifests.ReadFile(path.Join(dir, crdsDir, "kustomization.yaml"))
	if err != nil {
		return nil, err
	}
	var k struct {
		Labels    []struct{ Pairs map[string]string }
		Resources []string
	}
	if err := yaml.Unmarshal(data, &k); err != nil {
		return nil, fmt.Errorf("reading %s: %w", dir, err)
	}
	var crds []*apiextensionsv1.CustomResourceDefinition
	for _, r := range k.Resources {
		crd, err := readCRD(path.Join(dir, crdsDir, r))
		if err != nil {
			return nil, err
		}
		if crd.Labels == nil {
			crd.Labels = map[string]string{}
		}
		for _, l := range k.Labels {
			maps.Copy(crd.Labels, l.Pairs)
		}
		crds = append(crds, crd)
	}
	return crds, nil
}

func readCRD(file string) (*apiextensionsv1.CustomResourceDefinition, error) {
	data, err := manifests.ReadFile(file)
	if err != nil {
		return nil, err
	}
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.Unmarshal(data, crd); err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	return crd, nil
}

// webhookConfigurationsIn reads the webhook configurations of dir.
func webhookConfigurationsIn(dir string) ([]*unstructured.Unstructured, error) {
	file := path.Join(dir, webhookConfigurations)
	data, err := manifests.ReadFile(file)
	if err != nil {
		return nil, err
	}
	objs, err := DecodeYAML(data)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", file, err)
	}
	return objs, nil
}
