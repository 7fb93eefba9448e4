package devplane

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"

	addonsv1 "sigs.k8s.io/cluster-api/api/addons/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
)

// repoFile is a path of the repository, from this package's directory.
func repoFile(parts ...string) string {
	return filepath.Join(append([]string{"..", ".."}, parts...)...)
}

// fakeImageDir is an image directory holding a node image of version and
// the HAProxy image, each a few bytes: rendering only names them.
func fakeImageDir(t *testing.T, version string) string {
	t.Helper()
	dir := t.TempDir()
	for file, content := range map[string]string{NodeImageFileFor(version): "node", HAProxyImageFile: "lb"} {
		if err := os.WriteFile(filepath.Join(dir, file), []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	return dir
}

// TestRenderCluster renders the real cluster template with `make up`'s
// variables: every variable is resolved, the images are the seeded
// volumes, and the Cluster carries the label the CNI's
// ClusterResourceSet selects.
func TestRenderCluster(t *testing.T) {
	dir := fakeImageDir(t, "v1.36.3")
	o := ClusterOptions{
		Namespace: "team-a", Name: "k8s", ControlPlane: 3, Workers: 2, KubernetesVersion: "v1.36.3",
		Template: repoFile("templates", "cluster-template.yaml"), CNI: repoFile("templates", "cni-flannel.yaml"),
		ImageDir: dir, DomainType: "qemu", StoragePool: "capl-team-a",
	}.TCGTuning()
	imgs, err := ImageVolumes(o)
	if err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte("node"))
	if want := naming.ImageVolumeName(hex.EncodeToString(sum[:])); imgs.Node.Volume != want || imgs.Node.SHA256 != hex.EncodeToString(sum[:]) {
		t.Errorf("node image %+v, want volume %s", imgs.Node, want)
	}
	objs, err := RenderCluster(o, ClusterVariables(o, imgs))
	if err != nil {
		t.Fatal(err)
	}
	kinds := map[string]*unstructured.Unstructured{}
	for _, u := range objs {
		kinds[u.GetKind()+"/"+u.GetName()] = u
		if u.GetNamespace() != "team-a" {
			t.Errorf("%s %s in namespace %q", u.GetKind(), u.GetName(), u.GetNamespace())
		}
	}
	cluster := kinds["Cluster/k8s"]
	if cluster == nil {
		t.Fatalf("no Cluster k8s among %d objects", len(objs))
	}
	if cluster.GetLabels()[CNILabel] != "flannel" {
		t.Errorf("Cluster labels %v lack %s=flannel", cluster.GetLabels(), CNILabel)
	}
	for name, want := range map[string]map[string]any{
		"LibvirtMachineTemplate/k8s-control-plane": {"volume": imgs.Node.Volume, "domainType": "qemu", "tcg": int64(NodeTCGCacheMiB)},
		"LibvirtMachineTemplate/k8s-md-0":          {"volume": imgs.Node.Volume, "domainType": "qemu", "tcg": int64(NodeTCGCacheMiB)},
	} {
		u := kinds[name]
		if u == nil {
			t.Fatalf("no %s", name)
		}
		vol, _, _ := unstructured.NestedString(u.Object, "spec", "template", "spec", "image", "volume", "name")
		dt, _, _ := unstructured.NestedString(u.Object, "spec", "template", "spec", "domainType")
		tcg, _, _ := unstructured.NestedInt64(u.Object, "spec", "template", "spec", "tcgTranslationCacheMiB")
		if vol != want["volume"] || dt != want["domainType"] || tcg != want["tcg"] {
			t.Errorf("%s: image volume %q, domainType %q, tcg cache %d; want %v", name, vol, dt, tcg, want)
		}
	}
	for name, path := range map[string][]string{
		"LibvirtMachineTemplate/k8s-control-plane": {"spec", "template", "spec"},
		"LibvirtMachineTemplate/k8s-md-0":          {"spec", "template", "spec"},
		"LibvirtCluster/k8s":                       {"spec", "loadBalancer"},
	} {
		mode, _, _ := unstructured.NestedString(kinds[name].Object, append(path, "cpuMode")...)
		model, _, _ := unstructured.NestedString(kinds[name].Object, append(path, "cpuModel")...)
		if mode != "custom" || model != TCGCPUModel {
			t.Errorf("%s: cpuMode %q, cpuModel %q; want TCG's custom %s", name, mode, model, TCGCPUModel)
		}
	}
	lb, _, _ := unstructured.NestedString(kinds["LibvirtCluster/k8s"].Object, "spec", "loadBalancer", "image", "volume", "name")
	pool, _, _ := unstructured.NestedString(kinds["LibvirtCluster/k8s"].Object, "spec", "storagePool", "path")
	if lb != imgs.LoadBalancer.Volume || pool != "/var/lib/libvirt/capl-team-a" {
		t.Errorf("LibvirtCluster: load balancer image %q, pool path %q", lb, pool)
	}
	replicas, _, _ := unstructured.NestedInt64(kinds["KubeadmControlPlane/k8s-control-plane"].Object, "spec", "replicas")
	workers, _, _ := unstructured.NestedInt64(kinds["MachineDeployment/k8s-md-0"].Object, "spec", "replicas")
	if replicas != 3 || workers != 0 {
		t.Errorf("control plane %d, workers %d; want 3 and 0 (TCG: workers are staged after the control plane)", replicas, workers)
	}
	surge, _, _ := unstructured.NestedInt64(kinds["MachineDeployment/k8s-md-0"].Object, "spec", "rollout", "strategy", "rollingUpdate", "maxSurge")
	unavailable, _, _ := unstructured.NestedInt64(kinds["MachineDeployment/k8s-md-0"].Object, "spec", "rollout", "strategy", "rollingUpdate", "maxUnavailable")
	if surge != 0 || unavailable != 1 {
		t.Errorf("workers roll out with maxSurge %d, maxUnavailable %d; want 0 and 1 (TCG: a worker is replaced, not doubled)", surge, unavailable)
	}
	cpus, _, _ := unstructured.NestedInt64(kinds["LibvirtMachineTemplate/k8s-md-0"].Object, "spec", "template", "spec", "cpus")
	if cpus != 1 {
		t.Errorf("TCG workers have %d vCPUs, want 1", cpus)
	}
	args, _, _ := unstructured.NestedSlice(kinds["KubeadmControlPlane/k8s-control-plane"].Object,
		"spec", "kubeadmConfigSpec", "clusterConfiguration", "controllerManager", "extraArgs")
	if fmt.Sprint(args) != "[map[name:leader-elect value:true] map[name:leader-elect-lease-duration value:180s] map[name:leader-elect-renew-deadline value:150s] map[name:node-monitor-grace-period value:2m]]" {
		t.Errorf("controller manager extraArgs %v, want TCG's leader election and node grace period", args)
	}
	if single := (ClusterOptions{ControlPlane: 1}).TCGTuning(); single.LeaderElect != "false" {
		t.Errorf("TCG tuning of one control-plane machine: leader election %q, want false", single.LeaderElect)
	}
	if hostEtcd := (ClusterOptions{ControlPlane: 1, HostEtcd: true}).TCGTuning(); hostEtcd.LeaderElect != "" {
		t.Errorf("TCG tuning of one control-plane machine with etcd on the host: leader election %q, want the template's (on)", hostEtcd.LeaderElect)
	}
	if one := (ClusterOptions{ControlPlane: 1, ControlPlaneCPUs: 1}).TCGTuning(); one.APIServerCPURequest != "400m" || one.EtcdCPURequest != "100m" {
		t.Errorf("TCG tuning of a 1-vCPU control plane requests %s for the API server and %s for etcd, want 400m and 100m (within the node's CPU)",
			one.APIServerCPURequest, one.EtcdCPURequest)
	}
	drain, _, _ := unstructured.NestedInt64(kinds["KubeadmControlPlane/k8s-control-plane"].Object,
		"spec", "machineTemplate", "spec", "deletion", "nodeDrainTimeoutSeconds")
	if drain != 300 {
		t.Errorf("control-plane machines drained for %d s at most, want TCG's 300", drain)
	}
	for kind, path := range map[string][]string{
		"KubeadmControlPlane/k8s-control-plane": {"spec", "machineTemplate", "spec", "deletion", "nodeDeletionTimeoutSeconds"},
		"MachineDeployment/k8s-md-0":            {"spec", "template", "spec", "deletion", "nodeDeletionTimeoutSeconds"},
	} {
		if timeout, _, _ := unstructured.NestedInt64(kinds[kind].Object, path...); timeout != 900 {
			t.Errorf("%s: its machines' Nodes deleted for %d s at most, want TCG's 900", kind, timeout)
		}
	}
	etcdArgs, _, _ := unstructured.NestedSlice(kinds["KubeadmControlPlane/k8s-control-plane"].Object,
		"spec", "kubeadmConfigSpec", "clusterConfiguration", "etcd", "local", "extraArgs")
	if fmt.Sprint(etcdArgs) != "[map[name:unsafe-no-fsync value:true] map[name:watch-progress-notify-interval value:60s] "+
		"map[name:heartbeat-interval value:500] map[name:election-timeout value:5000]]" {
		t.Errorf("etcd extraArgs %v, want TCG's unsafe-no-fsync, progress notifications and raft timing", etcdArgs)
	}
	if got := renderedFile(t, kinds["KubeadmControlPlane/k8s-control-plane"], []string{"spec", "kubeadmConfigSpec", "files"},
		"/etc/kubernetes/patches/corednsdeployment0+strategic.yaml"); got != "spec:\n  replicas: 1\n" {
		t.Errorf("CoreDNS patch %q, want TCG's 1 replica", got)
	}
	if got := renderedFile(t, kinds["KubeadmControlPlane/k8s-control-plane"], []string{"spec", "kubeadmConfigSpec", "files"},
		"/etc/kubernetes/patches/kube-apiserver0+strategic.yaml"); !strings.Contains(got, "readinessProbe:\n      periodSeconds: 10\n") {
		t.Errorf("API server probe patch %q, want TCG's 10 s readiness period", got)
	}
	files, _, _ := unstructured.NestedSlice(kinds["KubeadmControlPlane/k8s-control-plane"].Object, "spec", "kubeadmConfigSpec", "files")
	patches := 0
	for _, f := range files {
		path, content := fmt.Sprint(f.(map[string]any)["path"]), fmt.Sprint(f.(map[string]any)["content"])
		if !strings.HasPrefix(path, "/etc/kubernetes/patches/") || strings.HasPrefix(path, "/etc/kubernetes/patches/corednsdeployment") {
			continue
		}
		patches++
		for _, want := range []string{"failureThreshold: 60\n", "failureThreshold: 120\n", "timeoutSeconds: 60\n"} {
			if !strings.Contains(content, want) {
				t.Errorf("probe patch %s lacks TCG's %q", path, want)
			}
		}
	}
	if patches != 4 {
		t.Errorf("%d probe patches in the control plane's kubeadm config, want 4", patches)
	}
	for name, spec := range map[string][]string{
		"KubeadmControlPlane/k8s-control-plane": {"spec", "kubeadmConfigSpec"},
		"KubeadmConfigTemplate/k8s-md-0":        {"spec", "template", "spec"},
	} {
		post, _, _ := unstructured.NestedStringSlice(kinds[name].Object, append(spec, "postKubeadmCommands")...)
		script := renderedFile(t, kinds[name], append(spec, "files"), kubeadmRetryScript)
		// The shell's own $ survive clusterctl's variable substitution.
		if !strings.Contains(script, "for attempt in $(seq 5); do") || !strings.Contains(script, "retry $attempt of 5") {
			t.Errorf("%s: kubeadm retry script %q, want 5 attempts with the shell's variables intact", name, script)
		}
		if !slices.Equal(post, []string{kubeadmRetryScript}) {
			t.Errorf("%s: postKubeadmCommands %v, want the kubeadm retry", name, post)
		}
	}

	// CPU for the control plane first: on the host, its VM weighted 4:1
	// over the workers'; inside it, the API server and etcd over
	// system.slice.
	wantShares := map[string]int64{"k8s-control-plane": 4096, "k8s-md-0": 1024}
	for name, want := range wantShares {
		if shares, _, _ := unstructured.NestedInt64(kinds["LibvirtMachineTemplate/"+name].Object, "spec", "template", "spec", "cpuShares"); shares != want {
			t.Errorf("TCG %s: cpuShares %d, want %d", name, shares, want)
		}
	}
	for patch, want := range map[string]string{
		"/etc/kubernetes/patches/kube-apiserver0+strategic.yaml": "resources:\n      requests:\n        cpu: \"1\"\n",
		"/etc/kubernetes/patches/etcd0+strategic.yaml":           "resources:\n      requests:\n        cpu: \"300m\"\n",
	} {
		if got := renderedFile(t, kinds["KubeadmControlPlane/k8s-control-plane"], []string{"spec", "kubeadmConfigSpec", "files"}, patch); !strings.Contains(got, want) {
			t.Errorf("TCG %s %q, want %q", patch, got, want)
		}
	}
	pre, _, _ := unstructured.NestedStringSlice(kinds["KubeadmControlPlane/k8s-control-plane"].Object, "spec", "kubeadmConfigSpec", "preKubeadmCommands")
	if len(pre) == 0 || pre[0] != "systemctl set-property --runtime system.slice CPUWeight=25" {
		t.Errorf("TCG control plane's preKubeadmCommands %q, want system.slice weighted 25 first", pre)
	}

	o.ImageDir = t.TempDir()
	if _, err := ImageVolumes(o); err == nil || !strings.Contains(err.Error(), "make images node-image") {
		t.Errorf("missing images: error %v, want a hint to build them", err)
	}
}

// renderedFile is the content of the file at path among the files (a
// kubeadm config's, at filesPath) of a rendered object; "" when absent.
func renderedFile(t *testing.T, u *unstructured.Unstructured, filesPath []string, path string) string {
	t.Helper()
	if u == nil {
		t.Fatalf("no object holds %s", path)
	}
	files, _, _ := unstructured.NestedSlice(u.Object, filesPath...)
	for _, f := range files {
		if f := f.(map[string]any); f["path"] == path {
			return fmt.Sprint(f["content"])
		}
	}
	return ""
}

// kubeadmRetryScript is the template's retry of a failed `kubeadm init`
// or `kubeadm join`.
const kubeadmRetryScript = "/usr/local/sbin/capl-kubeadm-retry"

func TestRenderClusterNamesMissingVariables(t *testing.T) {
	o := ClusterOptions{Template: repoFile("templates", "cluster-template.yaml")}
	_, err := RenderCluster(o, map[string]string{"CLUSTER_NAME": "x"})
	if err == nil || !strings.Contains(err.Error(), "LIBVIRT_IMAGE_VOLUME") {
		t.Fatalf("error %v, want it to name the unset LIBVIRT_IMAGE_VOLUME", err)
	}
}

func TestCNIObjects(t *testing.T) {
	objs, err := CNIObjects(ClusterOptions{Namespace: "team-a", CNI: repoFile("templates", "cni-flannel.yaml")})
	if err != nil {
		t.Fatal(err)
	}
	cm, crs := objs[0].(*corev1.ConfigMap), objs[1].(*addonsv1.ClusterResourceSet)
	manifest := cm.Data["cni-flannel.yaml"]
	if !strings.Contains(manifest, "kind: DaemonSet") || !strings.Contains(manifest, "${FLANNEL_MTU}") {
		t.Errorf("the ConfigMap does not hold the manifest unchanged (its shell variables included)")
	}
	if crs.Spec.ClusterSelector.MatchLabels[CNILabel] != "flannel" || crs.Spec.Resources[0].Name != cm.Name || cm.Namespace != "team-a" || crs.Namespace != "team-a" {
		t.Errorf("ClusterResourceSet %+v does not apply ConfigMap %s/%s to clusters labelled %s=flannel", crs.Spec, cm.Namespace, cm.Name, CNILabel)
	}
}

func TestMachineNodeIssue(t *testing.T) {
	const id = "libvirt:///8f1c2d3e-0000-4000-8000-000000000001"
	ready := func(name, providerID string, status corev1.ConditionStatus) *corev1.Node {
		n := &corev1.Node{}
		n.Name, n.Spec.ProviderID = name, providerID
		n.Status.Conditions = []corev1.NodeCondition{{Type: corev1.NodeReady, Status: status}}
		return n
	}
	machine := func(providerID, nodeRef string) *clusterv1.Machine {
		m := &clusterv1.Machine{}
		m.Spec.ProviderID = providerID
		m.Status.NodeRef.Name = nodeRef
		return m
	}
	tests := []struct {
		name    string
		machine *clusterv1.Machine
		nodes   []*corev1.Node
		want    string
	}{
		{"joined", machine(id, "n1"), []*corev1.Node{ready("n1", id, corev1.ConditionTrue)}, ""},
		{"no providerID", machine("", ""), nil, "no providerID yet"},
		{"no node", machine(id, ""), nil, "no node yet"},
		{"node registered, nodeRef pending", machine(id, ""), []*corev1.Node{ready("n1", id, corev1.ConditionFalse)}, "node n1 registered, no nodeRef yet"},
		{"not ready", machine(id, "n1"), []*corev1.Node{ready("n1", id, corev1.ConditionFalse)}, "node n1 not Ready"},
		{"other providerID", machine(id, "n1"), []*corev1.Node{ready("n1", "libvirt:///other", corev1.ConditionTrue)}, `node n1 has providerID "libvirt:///other", the Machine "` + id + `"`},
		{"dangling nodeRef", machine(id, "gone"), nil, "nodeRef gone names no node"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			byName := map[string]*corev1.Node{}
			for _, n := range tt.nodes {
				byName[n.Name] = n
			}
			if got := machineNodeIssue(tt.machine, byName); got != tt.want {
				t.Errorf("got %q, want %q", got, tt.want)
			}
		})
	}
}

func TestNodesStatusDone(t *testing.T) {
	tests := []struct {
		name string
		s    NodesStatus
		want bool
	}{
		{"all joined, CNI on every node", NodesStatus{Machines: 2, Joined: []string{"a", "b"}, CNIPods: 2, CNIRunning: 2}, true},
		{"a machine waiting", NodesStatus{Machines: 2, Joined: []string{"a"}, Waiting: []string{"b: no node yet"}, CNIPods: 1, CNIRunning: 1}, false},
		{"CNI pod not running", NodesStatus{Machines: 2, Joined: []string{"a", "b"}, CNIPods: 2, CNIRunning: 1}, false},
		{"CNI not on every node yet", NodesStatus{Machines: 2, Joined: []string{"a", "b"}, CNIPods: 1, CNIRunning: 1}, false},
		{"no machines yet", NodesStatus{}, false},
	}
	for _, tt := range tests {
		if got := tt.s.Done(); got != tt.want {
			t.Errorf("%s: Done() = %v, want %v", tt.name, got, tt.want)
		}
	}
}
