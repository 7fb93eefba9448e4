package devplane

import (
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"testing"

	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
)

// TestRenderTopologyCluster renders the ClusterClass and the topology
// Cluster with `make up`'s variables: the class and its templates come
// first, in the cluster's namespace; the Cluster carries the CNI label and
// the same settings as the plain template's variables, TCG's included.
func TestRenderTopologyCluster(t *testing.T) {
	dir := fakeImageDir(t, "v1.35.4")
	base := ClusterOptions{
		Namespace: "team-a", Name: "cc", ControlPlane: 1, Workers: 1, KubernetesVersion: "v1.35.4",
		Template: repoFile("templates", "cluster-template-topology.yaml"), ClusterClass: repoFile("templates", "clusterclass-libvirt.yaml"),
		CNI: repoFile("templates", "cni-flannel.yaml"), ImageDir: dir, DomainType: "kvm", StoragePool: "capl-team-a",
	}
	qemu := base
	qemu.DomainType = "qemu"
	tcg := qemu.TCGTuning()
	qemu.ControlPlane = 3
	tcg3 := qemu.TCGTuning()
	upstream := `{"etcd": {"unsafeNoFsync": false, "progressNotifyInterval": "5s", "heartbeatIntervalMS": 100, "electionTimeoutMS": 1000},
		"leaderElection": {"enabled": true, "leaseDuration": "15s", "renewDeadline": "10s"}, "nodeMonitorGracePeriod": "50s",
		"probes": {"timeoutSeconds": 15, "livenessFailureThreshold": 8, "startupFailureThreshold": 24, "apiServerReadinessPeriodSeconds": 1},
		"coreDNSReplicas": 2, "cpu": {"apiServerRequest": "250m", "etcdRequest": "100m", "systemWeight": 100}}`
	tcgTuning := func(leaderElect bool) string {
		return fmt.Sprintf(`{"etcd": {"unsafeNoFsync": true, "progressNotifyInterval": "60s", "heartbeatIntervalMS": 500, "electionTimeoutMS": 5000},
		"leaderElection": {"enabled": %v, "leaseDuration": "180s", "renewDeadline": "150s"}, "nodeMonitorGracePeriod": "2m",
		"probes": {"timeoutSeconds": 60, "livenessFailureThreshold": 60, "startupFailureThreshold": 120, "apiServerReadinessPeriodSeconds": 10},
		"coreDNSReplicas": 1, "cpu": {"apiServerRequest": "1", "etcdRequest": "300m", "systemWeight": 25}}`, leaderElect)
	}
	tests := []struct {
		name         string
		o            ClusterOptions
		controlPlane int64
		workers      int64
		// nodeDeletion is each machine's nodeDeletionTimeoutSeconds.
		nodeDeletion int64
		// variables are the topology variables expected, as JSON.
		variables map[string]string
	}{{
		name: "defaults", o: base, controlPlane: 1, workers: 1, nodeDeletion: 10,
		variables: map[string]string{
			"domainType": `"kvm"`, "tcgTranslationCacheMiB": "1024", "workerCPUs": "2", "controlPlaneCPUShares": "0",
			"workerCPUShares": "0", "controlPlaneTuning": upstream,
			"storagePool": `{"name": "capl-team-a", "path": "/var/lib/libvirt/capl-team-a"}`,
		},
	}, {
		name: "TCG, one control-plane machine", o: tcg, controlPlane: 1, workers: 0, nodeDeletion: 900,
		variables: map[string]string{
			"domainType": `"qemu"`, "tcgTranslationCacheMiB": "1024", "workerCPUs": "1", "controlPlaneTuning": tcgTuning(false),
			"controlPlaneCPUShares": "4096", "workerCPUShares": "1024",
		},
	}, {
		name: "TCG, three control-plane machines", o: tcg3, controlPlane: 3, workers: 0, nodeDeletion: 900,
		variables: map[string]string{"controlPlaneTuning": tcgTuning(true)},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			imgs, err := ImageVolumes(tt.o)
			if err != nil {
				t.Fatal(err)
			}
			objs, err := RenderCluster(tt.o, ClusterVariables(tt.o, imgs))
			if err != nil {
				t.Fatal(err)
			}
			var kinds []string
			for _, u := range objs {
				kinds = append(kinds, u.GetKind())
				if u.GetNamespace() != "team-a" {
					t.Errorf("%s %s in namespace %q", u.GetKind(), u.GetName(), u.GetNamespace())
				}
			}
			// The class before the Cluster naming it.
			want := []string{"ClusterClass", "LibvirtClusterTemplate", "KubeadmControlPlaneTemplate", "LibvirtMachineTemplate",
				"LibvirtMachineTemplate", "KubeadmConfigTemplate", "Cluster"}
			if !slices.Equal(kinds, want) {
				t.Fatalf("rendered %v, want %v", kinds, want)
			}
			cluster := objs[len(objs)-1]
			if cluster.GetLabels()[CNILabel] != "flannel" {
				t.Errorf("Cluster labels %v lack %s=flannel", cluster.GetLabels(), CNILabel)
			}
			if class, _, _ := unstructured.NestedString(cluster.Object, "spec", "topology", "classRef", "name"); class != objs[0].GetName() {
				t.Errorf("Cluster of class %q, rendered class %q", class, objs[0].GetName())
			}
			cp, _, _ := unstructured.NestedInt64(cluster.Object, "spec", "topology", "controlPlane", "replicas")
			mds, _, _ := unstructured.NestedSlice(cluster.Object, "spec", "topology", "workers", "machineDeployments")
			if len(mds) != 1 || mds[0].(map[string]any)["name"] != TopologyWorkers || mds[0].(map[string]any)["replicas"] != tt.workers || cp != tt.controlPlane {
				t.Errorf("topology control plane %d, workers %v; want %d and %s of %d", cp, mds, tt.controlPlane, TopologyWorkers, tt.workers)
			}
			cpDeletion, _, _ := unstructured.NestedInt64(cluster.Object, "spec", "topology", "controlPlane", "deletion", "nodeDeletionTimeoutSeconds")
			mdDeletion, _, _ := unstructured.NestedInt64(mds[0].(map[string]any), "deletion", "nodeDeletionTimeoutSeconds")
			if cpDeletion != tt.nodeDeletion || mdDeletion != tt.nodeDeletion {
				t.Errorf("Nodes of removed machines deleted for %d s (control plane) and %d s (workers) at most, want %d", cpDeletion, mdDeletion, tt.nodeDeletion)
			}
			vars := topologyVariables(t, cluster)
			tt.variables["image"] = fmt.Sprintf(`{"volume": {"name": %q}}`, imgs.Node.Volume)
			tt.variables["loadBalancerImageVolume"] = fmt.Sprintf("%q", imgs.LoadBalancer.Volume)
			for name, js := range tt.variables {
				var want any
				if err := json.Unmarshal([]byte(js), &want); err != nil {
					t.Fatalf("%s: %v", name, err)
				}
				if !reflect.DeepEqual(vars[name], want) {
					t.Errorf("variable %s = %v, want %v", name, vars[name], want)
				}
			}
			// The TCG profile's CPU model stays out of the class's
			// templates (RenderCluster).
			classHardware := map[string][]string{
				"LibvirtMachineTemplate": {"spec", "template", "spec"},
				"LibvirtClusterTemplate": {"spec", "template", "spec", "loadBalancer"},
			}
			for _, u := range objs {
				path, ok := classHardware[u.GetKind()]
				if !ok {
					continue
				}
				model, _, _ := unstructured.NestedString(u.Object, append(path, "cpuModel")...)
				mode, _, _ := unstructured.NestedString(u.Object, append(path, "cpuMode")...)
				if model != "" || mode != "" {
					t.Errorf("%s %s: cpuMode %q, cpuModel %q; want neither (the domain type's default)", u.GetKind(), u.GetName(), mode, model)
				}
			}
			// The class is rendered with the same variables: its kubeadm retry
			// keeps the shell's own $ and takes the default count.
			script := renderedFile(t, objs[2], []string{"spec", "template", "spec", "kubeadmConfigSpec", "files"}, kubeadmRetryScript)
			if !strings.Contains(script, "for attempt in $(seq 5); do") {
				t.Errorf("the class's kubeadm retry script %q, want 5 attempts with the shell's variables intact", script)
			}
		})
	}
}

// topologyVariables are the topology variables of a rendered Cluster, by
// name, their values as encoding/json decodes them.
func topologyVariables(t *testing.T, cluster *unstructured.Unstructured) map[string]any {
	t.Helper()
	list, _, _ := unstructured.NestedSlice(cluster.Object, "spec", "topology", "variables")
	out := map[string]any{}
	for _, v := range list {
		v := v.(map[string]any)
		js, err := json.Marshal(v["value"])
		if err != nil {
			t.Fatal(err)
		}
		var value any
		if err := json.Unmarshal(js, &value); err != nil {
			t.Fatal(err)
		}
		out[fmt.Sprint(v["name"])] = value
	}
	return out
}

// TestImageVolumesNodeImage: the node image is ImageDir's file of the
// Kubernetes version unless NodeImage names another (capl-dev
// --node-image); the HAProxy image always comes from ImageDir.
func TestImageVolumesNodeImage(t *testing.T) {
	dir, other := t.TempDir(), t.TempDir()
	files := map[string]string{
		filepath.Join(dir, NodeImageFileFor("v1.36.3")): "node of the version",
		filepath.Join(dir, HAProxyImageFile):            "lb",
		filepath.Join(other, "my-node.qcow2"):           "my node",
	}
	for path, content := range files {
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	for _, tc := range []struct {
		name, nodeImage, wantPath string
	}{
		{"of the version", "", filepath.Join(dir, NodeImageFileFor("v1.36.3"))},
		{"named", filepath.Join(other, "my-node.qcow2"), filepath.Join(other, "my-node.qcow2")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := ClusterOptions{KubernetesVersion: "v1.36.3", ImageDir: dir, NodeImage: tc.nodeImage}
			imgs, err := ImageVolumes(o)
			if err != nil {
				t.Fatal(err)
			}
			sum := sha256.Sum256([]byte(files[tc.wantPath]))
			if imgs.Node.Path != tc.wantPath || imgs.Node.SHA256 != hex.EncodeToString(sum[:]) {
				t.Errorf("node image %+v, want %s with the sha256 of %q", imgs.Node, tc.wantPath, files[tc.wantPath])
			}
			if imgs.LoadBalancer.Path != filepath.Join(dir, HAProxyImageFile) {
				t.Errorf("load balancer image %s, want ImageDir's", imgs.LoadBalancer.Path)
			}
		})
	}
}
