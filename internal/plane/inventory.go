package plane

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"
	clusterctlconfig "sigs.k8s.io/cluster-api/cmd/clusterctl/config"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// ProviderVersion is the version of this provider the plane records in
// its clusterctl inventory: the release `make release-manifests` packages
// (RELEASE_VERSION), so that a plane and a cluster initialised with
// `clusterctl init --infrastructure libvirt` agree on it and `clusterctl
// move` between them passes its version check.
const ProviderVersion = "v0.1.0"

// inventoryProvider is one entry of the clusterctl inventory: a provider,
// the namespace `clusterctl init` would install it into, and the API
// groups of its CRDs.
type inventoryProvider struct {
	name      string
	kind      clusterctlv1.ProviderType
	namespace string
	groups    []string
}

// planeProviders are the providers the plane runs: Cluster API's core,
// kubeadm bootstrap and kubeadm control-plane (in the serve process) and
// this provider (the manager child), in their release manifests'
// namespaces.
var planeProviders = []inventoryProvider{
	{name: "cluster-api", kind: clusterctlv1.CoreProviderType, namespace: "capi-system",
		groups: []string{clusterv1.GroupVersion.Group, "addons.cluster.x-k8s.io", "ipam.cluster.x-k8s.io", "runtime.cluster.x-k8s.io"}},
	{name: "kubeadm", kind: clusterctlv1.BootstrapProviderType, namespace: "capi-kubeadm-bootstrap-system",
		groups: []string{"bootstrap.cluster.x-k8s.io"}},
	{name: "kubeadm", kind: clusterctlv1.ControlPlaneProviderType, namespace: "capi-kubeadm-control-plane-system",
		groups: []string{"controlplane.cluster.x-k8s.io"}},
	{name: "libvirt", kind: clusterctlv1.InfrastructureProviderType, namespace: "capl-system",
		groups: []string{infrav1.GroupVersion.Group}},
}

// installInventory makes the plane a management cluster clusterctl
// recognises, as `clusterctl init` leaves one: its inventory CRD
// (providers.clusterctl.cluster.x-k8s.io), a Provider object per provider
// the plane runs, and the labels clusterctl puts on every CRD it
// installs (clusterctl.cluster.x-k8s.io and cluster.x-k8s.io/provider).
// `clusterctl move` discovers the kinds to move by the first label and
// refuses a target that lacks the source's providers; `clusterctl
// describe` and `upgrade plan` read the inventory. Idempotent: a plane
// restarted on its etcd data finds everything in place.
func installInventory(ctx context.Context, c client.Client, capiVersion string) error {
	if err := installInventoryCRD(ctx, c); err != nil {
		return err
	}
	crds := &apiextensionsv1.CustomResourceDefinitionList{}
	if err := c.List(ctx, crds); err != nil {
		return err
	}
	for i := range crds.Items {
		crd := &crds.Items[i]
		p, ok := providerOfGroup(crd.Spec.Group)
		if !ok {
			continue
		}
		if err := labelCRD(ctx, c, crd, p.manifestLabel()); err != nil {
			return err
		}
	}
	for _, p := range planeProviders {
		version := capiVersion
		if p.kind == clusterctlv1.InfrastructureProviderType {
			version = ProviderVersion
		}
		if err := ensureProvider(ctx, c, p, version); err != nil {
			return err
		}
	}
	return nil
}

// manifestLabel is the provider's cluster.x-k8s.io/provider value, e.g.
// control-plane-kubeadm.
func (p inventoryProvider) manifestLabel() string {
	return clusterctlv1.ManifestLabel(p.name, p.kind)
}

// providerOfGroup is the plane's provider serving an API group.
func providerOfGroup(group string) (inventoryProvider, bool) {
	for _, p := range planeProviders {
		for _, g := range p.groups {
			if g == group {
				return p, true
			}
		}
	}
	return inventoryProvider{}, false
}

// installInventoryCRD creates clusterctl's Provider CRD from the manifest
// clusterctl itself embeds, labelled as clusterctl labels it.
func installInventoryCRD(ctx context.Context, c client.Client) error {
	crd := &apiextensionsv1.CustomResourceDefinition{}
	if err := yaml.NewYAMLOrJSONDecoder(bytes.NewReader(clusterctlconfig.ClusterctlAPIManifest), 4096).Decode(crd); err != nil {
		return fmt.Errorf("reading clusterctl's inventory CRD: %w", err)
	}
	crd.Labels = map[string]string{
		clusterctlv1.ClusterctlLabel:     "",
		clusterctlv1.ClusterctlCoreLabel: clusterctlv1.ClusterctlCoreLabelInventoryValue,
	}
	if err := c.Create(ctx, crd); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating clusterctl's inventory CRD: %w", err)
	}
	return waitCRDEstablished(ctx, c, crd.Name)
}

// waitCRDEstablished waits until the API server serves the CRD.
func waitCRDEstablished(ctx context.Context, c client.Client, name string) error {
	for {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		if err := c.Get(ctx, client.ObjectKey{Name: name}, crd); err != nil {
			return err
		}
		for _, cond := range crd.Status.Conditions {
			if cond.Type == apiextensionsv1.Established && cond.Status == apiextensionsv1.ConditionTrue {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("waiting for CRD %s to be established: %w", name, ctx.Err())
		case <-time.After(pollInterval):
		}
	}
}

// labelCRD adds clusterctl's labels to a CRD that lacks them.
func labelCRD(ctx context.Context, c client.Client, crd *apiextensionsv1.CustomResourceDefinition, provider string) error {
	_, hasClusterctl := crd.Labels[clusterctlv1.ClusterctlLabel]
	if hasClusterctl && crd.Labels[clusterv1.ProviderNameLabel] == provider {
		return nil
	}
	patch := client.MergeFrom(crd.DeepCopy())
	if crd.Labels == nil {
		crd.Labels = map[string]string{}
	}
	crd.Labels[clusterctlv1.ClusterctlLabel] = ""
	crd.Labels[clusterv1.ProviderNameLabel] = provider
	if err := c.Patch(ctx, crd, patch); err != nil {
		return fmt.Errorf("labelling CRD %s for clusterctl: %w", crd.Name, err)
	}
	return nil
}

// ensureProvider creates the provider's namespace and inventory entry, or
// sets the entry's version to the one running.
func ensureProvider(ctx context.Context, c client.Client, p inventoryProvider, version string) error {
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: p.namespace}}
	if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("creating namespace %s: %w", p.namespace, err)
	}
	want := &clusterctlv1.Provider{
		ObjectMeta: metav1.ObjectMeta{
			Namespace: p.namespace,
			Name:      p.manifestLabel(),
			Labels: map[string]string{
				clusterctlv1.ClusterctlLabel:     "",
				clusterctlv1.ClusterctlCoreLabel: clusterctlv1.ClusterctlCoreLabelInventoryValue,
				clusterv1.ProviderNameLabel:      p.manifestLabel(),
			},
		},
		ProviderName: p.name,
		Type:         string(p.kind),
		Version:      version,
	}
	got := &clusterctlv1.Provider{}
	err := c.Get(ctx, client.ObjectKeyFromObject(want), got)
	switch {
	case apierrors.IsNotFound(err):
		return c.Create(ctx, want)
	case err != nil:
		return err
	case got.Version == version:
		return nil
	}
	patch := client.MergeFrom(got.DeepCopy())
	got.Version = version
	return c.Patch(ctx, got, patch)
}

// clusterAPIVersion is the Cluster API release this binary was built with,
// from its module information: the in-process controllers are that
// release's code.
func clusterAPIVersion() (string, error) {
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "", errors.New("no module information in this binary")
	}
	for _, dep := range info.Deps {
		if dep.Path == "sigs.k8s.io/cluster-api" {
			if dep.Replace != nil && strings.HasPrefix(dep.Replace.Version, "v") {
				return dep.Replace.Version, nil
			}
			return dep.Version, nil
		}
	}
	return "", errors.New("this binary was not built with sigs.k8s.io/cluster-api")
}
