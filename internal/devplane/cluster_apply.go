package devplane

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	addonsv1 "sigs.k8s.io/cluster-api/api/addons/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// CNIObjects are a ConfigMap holding the CNI manifest at o.CNI and a
// ClusterResourceSet applying it once to every cluster of the namespace
// labelled CNILabel=flannel. The manifest stays out of the cluster template
// because its shell script is full of "$", which clusterctl's variable
// substitution would take for variables.
func CNIObjects(o ClusterOptions) ([]client.Object, error) {
	manifest, err := os.ReadFile(o.CNI)
	if err != nil {
		return nil, err
	}
	name := "cni-flannel"
	cm := &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: name},
		Data:       map[string]string{filepath.Base(o.CNI): string(manifest)},
	}
	crs := &addonsv1.ClusterResourceSet{
		ObjectMeta: metav1.ObjectMeta{Namespace: o.Namespace, Name: name},
		Spec: addonsv1.ClusterResourceSetSpec{
			ClusterSelector: metav1.LabelSelector{MatchLabels: map[string]string{CNILabel: "flannel"}},
			Resources:       []addonsv1.ResourceRef{{Kind: "ConfigMap", Name: name}},
			Strategy:        string(addonsv1.ClusterResourceSetStrategyApplyOnce),
		},
	}
	return []client.Object{cm, crs}, nil
}

// ApplyCluster creates the namespace, the CNI objects and the rendered
// cluster, leaving objects that exist as they are.
func ApplyCluster(ctx context.Context, c client.Client, cni []client.Object, cluster []*unstructured.Unstructured) error {
	objs := append([]client.Object{}, cni...)
	for _, u := range cluster {
		objs = append(objs, u)
	}
	return ApplyDemo(ctx, c, objs)
}

// FieldManager is the field manager of what ApplyClusterServerSide applies.
const FieldManager = "capl-dev"

// ApplyClusterServerSide applies the namespace, the CNI objects and the
// rendered cluster server-side as FieldManager, taking over fields other
// managers set: a second run with other replicas or variables converges
// the objects to them (a `kubectl scale` in between is undone), where
// ApplyCluster leaves existing objects as they are. What the webhooks
// refuse to change (a LibvirtMachineTemplate's spec, a cluster's network)
// fails with their message.
func ApplyClusterServerSide(ctx context.Context, c client.Client, cni []client.Object, cluster []*unstructured.Unstructured) error {
	var objs []*unstructured.Unstructured
	namespaces := map[string]bool{}
	for _, obj := range cni {
		u, err := toUnstructured(c, obj)
		if err != nil {
			return err
		}
		objs = append(objs, u)
	}
	objs = append(objs, cluster...)
	for _, u := range objs {
		if ns := u.GetNamespace(); ns != "" && !namespaces[ns] {
			namespaces[ns] = true
			n := &unstructured.Unstructured{}
			n.SetAPIVersion("v1")
			n.SetKind("Namespace")
			n.SetName(ns)
			if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(n), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
				return fmt.Errorf("applying namespace %s: %w", ns, err)
			}
		}
	}
	for _, u := range objs {
		u = u.DeepCopy()
		// Apply configurations carry no server-set fields.
		unstructured.RemoveNestedField(u.Object, "status")
		unstructured.RemoveNestedField(u.Object, "metadata", "creationTimestamp")
		u.SetResourceVersion("")
		u.SetManagedFields(nil)
		if err := c.Apply(ctx, client.ApplyConfigurationFromUnstructured(u), client.FieldOwner(FieldManager), client.ForceOwnership); err != nil {
			return fmt.Errorf("applying %s %s/%s: %w", u.GetKind(), u.GetNamespace(), u.GetName(), err)
		}
	}
	return nil
}

// toUnstructured converts a typed object with its kind from c's scheme.
func toUnstructured(c client.Client, obj client.Object) (*unstructured.Unstructured, error) {
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return nil, err
	}
	m, err := runtime.DefaultUnstructuredConverter.ToUnstructured(obj)
	if err != nil {
		return nil, err
	}
	u := &unstructured.Unstructured{Object: m}
	u.SetGroupVersionKind(gvk)
	return u, nil
}

// ClusterExists tells whether cluster namespace/name exists, so that a
// second run applies it as it is (no workers staged behind the control
// plane: they exist already, and a staged MachineDeployment of 0 would
// scale them away).
func ClusterExists(ctx context.Context, c client.Client, namespace, name string) (bool, error) {
	err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &clusterv1.Cluster{})
	if apierrors.IsNotFound(err) {
		return false, nil
	}
	return err == nil, err
}
