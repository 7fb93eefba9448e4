package templates_test

import (
	"encoding/json"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/api/equality"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
)

// parityNamespace holds TestTopologyMatchesTemplate's objects.
const parityNamespace = "parity"

// renderedCluster is what the comparison of the two flavours looks at:
// the specs of the objects that make the machines, by role.
type renderedCluster map[string]map[string]any

// Roles of renderedCluster, with where each object keeps the spec compared.
var parityRoles = []struct {
	role string
	spec []string
}{
	{"LibvirtCluster", []string{"spec"}},
	{"KubeadmControlPlane", []string{"spec", "kubeadmConfigSpec"}},
	{"control-plane LibvirtMachineTemplate", []string{"spec", "template", "spec"}},
	{"worker LibvirtMachineTemplate", []string{"spec", "template", "spec"}},
	{"worker KubeadmConfigTemplate", []string{"spec", "template", "spec"}},
}

// TestTopologyMatchesTemplate renders cluster-template.yaml and the
// topology flavour (ClusterClass and Cluster) with the settings `make up`
// and the e2e suite use under TCG, plus CPU weights, as devplane renders
// them. The plain flavour's objects go through a server-side dry-run (the
// webhooks' defaults); the Cluster of the class goes to Cluster API's
// topology controller. The kubeadm configurations (clusterConfiguration's
// flags, kubeadm's timeouts and patches directory, files, commands), the
// machine templates and the LibvirtCluster must be the same. The same
// Cluster of a copy of the class without one of its patches must differ
// where that patch writes: each patch is what makes its part equal.
func TestTopologyMatchesTemplate(t *testing.T) {
	requireEnv(t)
	ns := namespace(t, parityNamespace)
	o := devplane.ClusterOptions{
		Namespace: ns, Name: "plain", ControlPlane: 1, Workers: 1, KubernetesVersion: "v1.33.1",
		Template: filepath.Join(root(), "templates", "cluster-template.yaml"), CNI: filepath.Join(root(), "templates", "cni-flannel.yaml"),
		DomainType: "qemu", StoragePool: "capl-parity",
	}.TCGTuning()
	o.ControlPlaneCPUShares, o.WorkerCPUShares = 4096, 1024
	// The profile's CPU model goes into the plain flavour only
	// (devplane.RenderCluster): the comparison is of the templates.
	o.CPUModel = ""
	imgs := devplane.ClusterImages{Node: devplane.ClusterImage{Volume: image}, LoadBalancer: devplane.ClusterImage{Volume: "capl-haproxy.qcow2"}}

	plainObjs, err := devplane.RenderCluster(o, devplane.ClusterVariables(o, imgs))
	must(t, err)
	plain := renderedCluster{}
	for _, u := range plainObjs {
		if err := c.Create(ctx(t), u, client.DryRunAll); err != nil {
			t.Fatalf("%s %s refused: %v", u.GetKind(), u.GetName(), err)
		}
		role := u.GetKind()
		switch {
		case u.GetKind() == "LibvirtMachineTemplate" && u.GetName() == o.MachineDeploymentName():
			role = "worker " + role
		case u.GetKind() == "LibvirtMachineTemplate":
			role = "control-plane " + role
		case u.GetKind() == "KubeadmConfigTemplate":
			role = "worker " + role
		}
		plain.add(t, role, u)
	}

	topo := o
	topo.Name = "topology"
	topo.Template = filepath.Join(root(), "templates", "cluster-template-topology.yaml")
	topo.ClusterClass = filepath.Join(root(), "templates", "clusterclass-libvirt.yaml")
	topoObjs, err := devplane.RenderCluster(topo, devplane.ClusterVariables(topo, imgs))
	must(t, err)
	var class, cluster *unstructured.Unstructured
	for _, u := range topoObjs {
		switch u.GetKind() {
		case "ClusterClass":
			class = u
		case "Cluster":
			cluster = u
		default:
			// The class's templates, which every copy of it below shares.
			must(t, c.Create(ctx(t), u))
		}
	}
	if len(plain) != len(parityRoles) || class == nil || cluster == nil {
		t.Fatalf("rendered %d of the %d roles of the plain flavour, ClusterClass %v, Cluster %v", len(plain), len(parityRoles), class != nil, cluster != nil)
	}
	// The comparison is of TCG's settings, not of the defaults.
	etcd, _, _ := unstructured.NestedSlice(plain["KubeadmControlPlane"], "clusterConfiguration", "etcd", "local", "extraArgs")
	if !slices.ContainsFunc(etcd, func(a any) bool { return toJSON(a) == `{"name":"unsafe-no-fsync","value":"true"}` }) {
		t.Fatalf("cluster-template.yaml rendered etcd flags %s, want TCG's", toJSON(etcd))
	}

	const coreDNSTag = "v1.12.1"
	tests := []struct {
		name string
		// without is the patch left out of the class; "" for none.
		without string
		// variable is one more topology variable of the Cluster.
		variable map[string]any
		// differences are the members that must then differ.
		differences []string
	}{
		{name: "all patches"},
		{name: "without kubeadmClusterConfiguration", without: "kubeadmClusterConfiguration", differences: []string{"KubeadmControlPlane.clusterConfiguration"}},
		{name: "without staticPodProbes", without: "staticPodProbes", differences: []string{"KubeadmControlPlane.files"}},
		{name: "without coreDNSReplicas", without: "coreDNSReplicas", differences: []string{"KubeadmControlPlane.files"}},
		{name: "without tcgTranslationCache", without: "tcgTranslationCache",
			differences: []string{"control-plane LibvirtMachineTemplate.tcgTranslationCacheMiB", "worker LibvirtMachineTemplate.tcgTranslationCacheMiB"}},
		{name: "without controlPlaneCPUShares", without: "controlPlaneCPUShares", differences: []string{"control-plane LibvirtMachineTemplate.cpuShares"}},
		{name: "without workerCPUShares", without: "workerCPUShares", differences: []string{"worker LibvirtMachineTemplate.cpuShares"}},
		// What the upgrade e2e sets with the version, which the plain
		// flavour's KubeadmControlPlane gets by a patch of its own.
		{name: "coreDNSImageTag", variable: map[string]any{"name": "coreDNSImageTag", "value": coreDNSTag},
			differences: []string{"KubeadmControlPlane.clusterConfiguration"}},
	}
	for i, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cl := cluster.DeepCopy()
			if tt.variable != nil {
				vars, _, _ := unstructured.NestedSlice(cl.Object, "spec", "topology", "variables")
				must(t, unstructured.SetNestedSlice(cl.Object, append(vars, tt.variable), "spec", "topology", "variables"))
			}
			got := topologyCluster(t, topo, fmt.Sprintf("case-%d", i), class, cl, tt.without)
			diff := plain.differences(got)
			if !slices.Equal(diff, tt.differences) {
				t.Errorf("the topology flavour differs from cluster-template.yaml in %v, want %v", diff, tt.differences)
				for _, d := range diff {
					role, member, _ := strings.Cut(d, ".")
					t.Logf("%s:\n  cluster-template.yaml: %s\n  topology:              %s", d, toJSON(plain[role][member]), toJSON(got[role][member]))
				}
			}
			if tt.variable == nil {
				return
			}
			// Only dns differs: the flags are the plain flavour's.
			cc := got["KubeadmControlPlane"]["clusterConfiguration"].(map[string]any)
			tag, _, _ := unstructured.NestedString(cc, "dns", "imageTag")
			delete(cc, "dns")
			if tag != coreDNSTag || !equality.Semantic.DeepEqual(cc, plain["KubeadmControlPlane"]["clusterConfiguration"]) {
				t.Errorf("clusterConfiguration with coreDNSImageTag %s: dns.imageTag %q, the rest %s", coreDNSTag, tag, toJSON(cc))
			}
		})
	}
}

// topologyCluster creates a copy of class without the patch named without
// (none when empty) and a copy of cluster of it, both named name, and
// returns the specs of what the topology controller makes. o are the
// options cluster was rendered with.
func topologyCluster(t *testing.T, o devplane.ClusterOptions, name string, class, cluster *unstructured.Unstructured, without string) renderedCluster {
	t.Helper()
	cc := class.DeepCopy()
	cc.SetName(name)
	patches, _, _ := unstructured.NestedSlice(cc.Object, "spec", "patches")
	kept := slices.DeleteFunc(slices.Clone(patches), func(p any) bool { return p.(map[string]any)["name"] == without })
	if without != "" && len(kept) != len(patches)-1 {
		t.Fatalf("the ClusterClass has no patch %s", without)
	}
	must(t, unstructured.SetNestedSlice(cc.Object, kept, "spec", "patches"))
	must(t, c.Create(ctx(t), cc))
	eventually(t, "the ClusterClass "+cc.GetName()+" is reconciled", func() error {
		got := &clusterv1.ClusterClass{}
		if err := c.Get(ctx(t), client.ObjectKeyFromObject(cc), got); err != nil {
			return err
		}
		if got.Status.ObservedGeneration != got.Generation || len(got.Status.Variables) == 0 {
			return fmt.Errorf("observedGeneration %d of %d: %s", got.Status.ObservedGeneration, got.Generation, conditions(got.Status.Conditions))
		}
		return nil
	})

	cl := cluster.DeepCopy()
	cl.SetName(name)
	must(t, unstructured.SetNestedField(cl.Object, cc.GetName(), "spec", "topology", "classRef", "name"))
	must(t, c.Create(ctx(t), cl))
	o.Name = cl.GetName()
	got := renderedCluster{}
	kcp := &controlplanev1.KubeadmControlPlane{}
	eventually(t, "the topology controller creates the LibvirtCluster and the control plane", func() error {
		current := &clusterv1.Cluster{}
		if err := c.Get(ctx(t), client.ObjectKeyFromObject(cl), current); err != nil {
			return err
		}
		lc, err := devplane.LibvirtClusterOf(ctx(t), c, current)
		if err != nil {
			return err
		}
		if !current.Spec.ControlPlaneRef.IsDefined() {
			return fmt.Errorf("no controlPlaneRef: %s", conditions(current.Status.Conditions))
		}
		if err := c.Get(ctx(t), client.ObjectKey{Namespace: o.Namespace, Name: current.Spec.ControlPlaneRef.Name}, kcp); err != nil {
			return err
		}
		for role, obj := range map[string]client.Object{
			"LibvirtCluster":                       lc,
			"KubeadmControlPlane":                  kcp,
			"control-plane LibvirtMachineTemplate": &infrav1.LibvirtMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name}},
		} {
			if err := got.read(t, role, obj); err != nil {
				return err
			}
		}
		return nil
	})
	markControlPlaneProvisioned(t, kcp)
	eventually(t, "the topology controller creates the MachineDeployment", func() error {
		md, err := devplane.WorkerMachineDeployment(ctx(t), c, o)
		if err != nil {
			return err
		}
		if err := got.read(t, "worker LibvirtMachineTemplate",
			&infrav1.LibvirtMachineTemplate{ObjectMeta: metav1.ObjectMeta{Name: md.Spec.Template.Spec.InfrastructureRef.Name}}); err != nil {
			return err
		}
		return got.read(t, "worker KubeadmConfigTemplate",
			&bootstrapv1.KubeadmConfigTemplate{ObjectMeta: metav1.ObjectMeta{Name: md.Spec.Template.Spec.Bootstrap.ConfigRef.Name}})
	})
	return got
}

// markControlPlaneProvisioned reports kcp's version and replicas in its
// status, as the KubeadmControlPlane controller (which needs a workload
// cluster) would once its first Machine exists: Cluster API's topology
// controller creates MachineDeployments only then.
func markControlPlaneProvisioned(t *testing.T, kcp *controlplanev1.KubeadmControlPlane) {
	t.Helper()
	kcp.Status.Version = kcp.Spec.Version
	kcp.Status.Replicas = kcp.Spec.Replicas
	if err := c.Status().Update(ctx(t), kcp); err != nil {
		t.Fatal(err)
	}
}

// add keeps the spec of u for role.
func (r renderedCluster) add(t *testing.T, role string, u *unstructured.Unstructured) {
	t.Helper()
	for _, pr := range parityRoles {
		if pr.role != role {
			continue
		}
		spec, found, err := unstructured.NestedMap(u.Object, pr.spec...)
		if err != nil || !found {
			t.Fatalf("%s %s has no %s: %v", u.GetKind(), u.GetName(), strings.Join(pr.spec, "."), err)
		}
		r[role] = spec
		return
	}
}

// differences names each member ("role.member") of the specs of r and
// other that differs, sorted.
func (r renderedCluster) differences(other renderedCluster) []string {
	var out []string
	for _, pr := range parityRoles {
		a, b := r[pr.role], other[pr.role]
		members := map[string]bool{}
		for k := range a {
			members[k] = true
		}
		for k := range b {
			members[k] = true
		}
		for k := range members {
			if !equality.Semantic.DeepEqual(a[k], b[k]) {
				out = append(out, pr.role+"."+k)
			}
		}
	}
	slices.Sort(out)
	return out
}

// read reads the object named as obj in the parity namespace, as the API
// server serves it (not through its Go type, as the plain flavour's
// dry-runs are read), and keeps its spec for role.
func (r renderedCluster) read(t *testing.T, role string, obj client.Object) error {
	t.Helper()
	gvk, err := apiutil.GVKForObject(obj, c.Scheme())
	if err != nil {
		return err
	}
	u := &unstructured.Unstructured{}
	u.SetGroupVersionKind(gvk)
	if err := c.Get(ctx(t), client.ObjectKey{Namespace: parityNamespace, Name: obj.GetName()}, u); err != nil {
		return err
	}
	r.add(t, role, u)
	return nil
}

func toJSON(v any) string {
	js, _ := json.Marshal(v)
	return string(js)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
