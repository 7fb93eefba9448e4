package templates_test

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// kubeadmRetry is the script every flavour's machines run after Cluster
// API's single `kubeadm init` or `kubeadm join`.
const kubeadmRetry = "/usr/local/sbin/capl-kubeadm-retry"

// checkKubeadmRetry checks that the kubeadm configurations of every
// flavour write the same retry of a failed init or join, with the shell's
// own variables intact and the default count, and run it last; control
// planes also run it first to keep the CA and keys Cluster API wrote,
// which the retry restores after `kubeadm reset` (and after removing a
// failed join's etcd member). A control-plane join that got to its etcd
// step resumes there, and an init that got to its wait for the API server
// resumes there, but for the last attempt.
func checkKubeadmRetry(t *testing.T, byKind map[string][]*unstructured.Unstructured) {
	t.Helper()
	specs := map[string][]string{
		"KubeadmControlPlane":         {"spec", "kubeadmConfigSpec"},
		"KubeadmControlPlaneTemplate": {"spec", "template", "spec", "kubeadmConfigSpec"},
		"KubeadmConfigTemplate":       {"spec", "template", "spec"},
	}
	scripts := map[string]string{}
	for kind, spec := range specs {
		for _, u := range byKind[kind] {
			script := renderedFile(t, u, spec, kubeadmRetry)
			scripts[kind+" "+u.GetName()] = script
			for _, want := range []string{"for attempt in $(seq 5); do", "retry $attempt of 5", `rm -rf "$kept" && cp -a /etc/kubernetes/pki "$kept"`,
				`cp -a "$kept" /etc/kubernetes/pki`, `if [ "$phase" = join ] && ! leave_etcd; then`, "/v3/cluster/member/remove",
				"phase=init config=/run/kubeadm/kubeadm.yaml", `kubeadm "$phase" --config "$config"`,
				`[ "$1" -lt 5 ]`, "--skip-phases preflight,control-plane-prepare,check-etcd,kubelet-start",
				"--skip-phases preflight,certs,kubeconfig,etcd,control-plane,kubelet-start"} {
				if !strings.Contains(script, want) {
					t.Errorf("%s %s: the kubeadm retry script lacks %q (the shell's variables must stay intact)", kind, u.GetName(), want)
				}
			}
			post, _, _ := unstructured.NestedStringSlice(u.Object, append(slices.Clone(spec), "postKubeadmCommands")...)
			if len(post) == 0 || post[len(post)-1] != kubeadmRetry {
				t.Errorf("%s %s: postKubeadmCommands %v, want the kubeadm retry last", kind, u.GetName(), post)
			}
			pre, _, _ := unstructured.NestedStringSlice(u.Object, append(slices.Clone(spec), "preKubeadmCommands")...)
			if keeps := slices.Contains(pre, kubeadmRetry+" keep"); keeps != (kind != "KubeadmConfigTemplate") {
				t.Errorf("%s %s: preKubeadmCommands %v: keeping the pki is for control planes only (keeps: %v)", kind, u.GetName(), pre, keeps)
			}
		}
	}
	if len(scripts) < 2 {
		t.Errorf("%d kubeadm configurations rendered, want the control plane's and the workers'", len(scripts))
	}
	var first string
	for name, script := range scripts {
		if first == "" {
			first = name
		} else if script != scripts[first] {
			t.Errorf("the kubeadm retry of %s differs from %s's", name, first)
		}
	}
}

// renderedFile is the content of the file at path among the files of the
// kubeadm config spec at spec in u; it fails t when there is none.
func renderedFile(t *testing.T, u *unstructured.Unstructured, spec []string, path string) string {
	t.Helper()
	files, _, _ := unstructured.NestedSlice(u.Object, append(slices.Clone(spec), "files")...)
	for _, f := range files {
		if f, ok := f.(map[string]any); ok && f["path"] == path {
			content, _ := f["content"].(string)
			return content
		}
	}
	t.Errorf("%s %s writes no %s", u.GetKind(), u.GetName(), path)
	return ""
}

// topologyVariant creates a copy of cluster named name with variables
// added and returns it with the LibvirtCluster the topology controller
// makes for it.
func topologyVariant(t *testing.T, cluster *unstructured.Unstructured, name string, variables ...any) (*unstructured.Unstructured, *infrav1.LibvirtCluster) {
	t.Helper()
	variant := cluster.DeepCopy()
	variant.SetName(name)
	variant.SetResourceVersion("")
	vars, _, _ := unstructured.NestedSlice(variant.Object, "spec", "topology", "variables")
	_ = unstructured.SetNestedSlice(variant.Object, append(vars, variables...), "spec", "topology", "variables")
	if err := c.Create(ctx(t), variant); err != nil {
		t.Fatal(err)
	}
	lc := &infrav1.LibvirtCluster{}
	eventually(t, "the LibvirtCluster of "+name+" is created", func() error {
		cl := &clusterv1.Cluster{}
		if err := c.Get(ctx(t), client.ObjectKeyFromObject(variant), cl); err != nil {
			return err
		}
		if !cl.Spec.InfrastructureRef.IsDefined() {
			return fmt.Errorf("no infrastructureRef: %s", conditions(cl.Status.Conditions))
		}
		return c.Get(ctx(t), client.ObjectKey{Namespace: cluster.GetNamespace(), Name: cl.Spec.InfrastructureRef.Name}, lc)
	})
	return variant, lc
}

func checkMachineTemplate(t *testing.T, mt *infrav1.LibvirtMachineTemplate, cpus, memoryMiB int32) {
	t.Helper()
	s := mt.Spec.Template.Spec
	if s.CPUs != cpus || s.MemoryMiB != memoryMiB || s.DiskSizeGiB != 20 || s.DomainType != infrav1.DomainTypeQEMU ||
		s.CPUMode != infrav1.CPUModeMaximum || s.Image.Volume == nil || s.Image.Volume.Name != image {
		t.Errorf("LibvirtMachineTemplate %s spec %+v", mt.Name, s)
	}
}

func patchVariable(t *testing.T, cluster *unstructured.Unstructured, name, value string) {
	t.Helper()
	// Cluster API's controllers update the Cluster too: retry on conflict.
	if err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := &clusterv1.Cluster{}
		if err := c.Get(ctx(t), client.ObjectKeyFromObject(cluster), cl); err != nil {
			return err
		}
		for i := range cl.Spec.Topology.Variables {
			if cl.Spec.Topology.Variables[i].Name == name {
				cl.Spec.Topology.Variables[i].Value.Raw = []byte(value)
			}
		}
		return c.Update(ctx(t), cl)
	}); err != nil {
		t.Fatal(err)
	}
}

// topologyReconciled waits for the Cluster's TopologyReconciled condition
// to be True for its current generation.
func topologyReconciled(t *testing.T, cluster *unstructured.Unstructured) {
	t.Helper()
	eventually(t, "TopologyReconciled", func() error {
		cl := &clusterv1.Cluster{}
		if err := c.Get(ctx(t), client.ObjectKeyFromObject(cluster), cl); err != nil {
			return err
		}
		for _, cond := range cl.Status.Conditions {
			if cond.Type == clusterv1.ClusterTopologyReconciledCondition && cond.Status == metav1.ConditionTrue && cond.ObservedGeneration == cl.Generation {
				return nil
			}
		}
		return fmt.Errorf("%s", conditions(cl.Status.Conditions))
	})
}

func conditions(cs []metav1.Condition) string {
	var b strings.Builder
	for _, c := range cs {
		fmt.Fprintf(&b, "%s=%s (%s: %s); ", c.Type, c.Status, c.Reason, c.Message)
	}
	return b.String()
}

// eventually polls f until it succeeds; it fails t after two minutes, a
// bound on a hang, not a performance requirement.
func eventually(t *testing.T, what string, f func() error) {
	t.Helper()
	deadline := time.Now().Add(2 * time.Minute)
	for {
		err := f()
		if err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s: %v", what, err)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

func namespace(t *testing.T, name string) string {
	t.Helper()
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: name}}
	if err := c.Create(ctx(t), ns); err != nil {
		t.Fatal(err)
	}
	return name
}

func expect(t *testing.T, u *unstructured.Unstructured, want any, path ...string) {
	t.Helper()
	got, found, err := unstructured.NestedFieldNoCopy(u.Object, path...)
	if err != nil || !found || !equalJSON(got, want) {
		t.Errorf("%s %s: %s = %v (found %v), want %v", u.GetKind(), u.GetName(), strings.Join(path, "."), got, found, want)
	}
}

func equalJSON(a, b any) bool { return fmt.Sprint(a) == fmt.Sprint(b) }
