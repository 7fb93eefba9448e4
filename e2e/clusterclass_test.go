//go:build e2e

package e2e

import (
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
)

// clusterClassName is the upgrade scenario's Cluster of the ClusterClass
// libvirt, made once the kubeadm cluster is gone.
const clusterClassName = "cc"

// clusterClassPhasePrefix names its figures in the report, next to the
// kubeadm cluster's.
const clusterClassPhasePrefix = kubeadmPhasePrefix + "ClusterClass: "

// clusterClassVariableChange is the upgrade scenario's last phase, day two
// of docs/upgrades.md's "ClusterClass clusters": the kubeadm cluster is
// deleted (two clusters' VMs do not fit a 2-core TCG host), then a Cluster
// of templates/clusterclass-libvirt.yaml with the kubeadm cluster's
// settings (TCGTuning) is made at the newer version, and its
// workerMemoryMiB variable is changed: Cluster API's topology controller
// must rotate the workers' machine template and the MachineDeployment
// replace its machine (maxSurge 0), with the endpoint answering and
// nothing of the replaced machine left. Its etcd is stacked (an etcd on
// the host is for plain templates), so its control plane is not rolled.
func (s *suite) clusterClassVariableChange(t *testing.T) {
	runInOrder(t, []phase{
		{"delete the kubeadm cluster", s.deleteKubeadm},
		{"ClusterClass nodes ready", s.clusterClassReady},
		{"ClusterClass workers' memory variable", s.changeWorkerMemory},
	})
}

// deleteKubeadm deletes the cluster under test and waits until it, its
// objects and everything of it in libvirt are gone, each of its machines
// (its domain, volumes and address reservations) checked on its own.
func (s *suite) deleteKubeadm(t *testing.T) {
	lms, err := s.clusterMachines(s.cut.name)
	must(t, err)
	network := s.clusterNetwork()
	start := time.Now()
	s.deleteCluster(t)
	s.rep.phaseSince(kubeadmPhasePrefix+"cluster "+s.cut.name+" deleted → every object and libvirt object gone", start)()
	for _, lm := range lms {
		if l := s.machineLeftovers(lm.Name, macSeed(&lm), network); len(l) > 0 {
			t.Errorf("the deleted cluster's machine %s left in libvirt: %s", lm.Name, strings.Join(l, ", "))
		}
	}
	if s.networkExists(t, network) {
		t.Errorf("the deleted cluster's network %s is still there", network)
	}
	if o := s.k8s.opts; o.HostEtcd {
		s.waitHostEtcdGone(t, o)
	}
	s.k8s.ready = false
}

// waitHostEtcdGone waits until the plane stopped the etcd it ran on the
// host for the deleted cluster of o and removed its data.
func (s *suite) waitHostEtcdGone(t *testing.T, o devplane.ClusterOptions) {
	t.Helper()
	dir := plane.HostEtcdDir(s.state, o.Namespace, o.Name)
	address := net.JoinHostPort("127.0.0.1", strconv.Itoa(o.HostEtcdPort))
	s.waitFor(t, "the deleted cluster's etcd on the host stopped and its data removed", 2*time.Minute, func() (bool, string) {
		if _, err := os.Stat(dir); !errors.Is(err, fs.ErrNotExist) {
			return false, dir + " is still there"
		}
		if conn, err := net.DialTimeout("tcp", address, time.Second); err == nil {
			_ = conn.Close()
			return false, "something still listens on " + address
		}
		return true, ""
	})
}

// clusterClassOptions are the ClusterClass cluster's options: the kubeadm
// cluster's (TCGTuning) for the topology flavour at the newer version,
// with a stacked etcd.
func clusterClassOptions(t *testing.T) devplane.ClusterOptions {
	o := kubeadmOptions(t, 1)
	templates := filepath.Dir(o.Template)
	o.Name = clusterClassName
	o.Template = filepath.Join(templates, "cluster-template-topology.yaml")
	o.ClusterClass = filepath.Join(templates, "clusterclass-libvirt.yaml")
	o.KubernetesVersion = nodeImageVersion(testlibvirt.NodeImage(t))
	return o.TCGEtcdOnHost(false)
}

// clusterClassReady creates the ClusterClass, its templates and the
// Cluster as `make up` would render them and waits until every node is
// Ready at the older version, with our providerIDs.
func (s *suite) clusterClassReady(t *testing.T) {
	o := clusterClassOptions(t)
	objs := s.renderCluster(t, o)
	for _, u := range objs {
		if u.GetKind() == "Cluster" {
			disableHealthChecks(t, u)
		}
	}
	s.cut = clusterUnderTest{name: o.Name, controlPlaneMachines: o.ControlPlane, workerMachines: o.Workers}
	s.applyCluster(t, objs)
	t.Logf("ClusterClass cluster %s applied (%d objects: the ClusterClass, its templates and the Cluster; Kubernetes %s)", o.Name, len(objs), o.KubernetesVersion)
	s.rep.passed(t, "ClusterClass: Cluster %s of ClusterClass libvirt (templates/cluster-template-topology.yaml with the kubeadm cluster's TCGTuning), "+
		"made once the kubeadm cluster was deleted, Kubernetes %s, 1 control plane + 1 worker, the class's health checks off.", o.Name, o.KubernetesVersion)
	s.clusterReady(t, "ClusterClass cluster", clusterClassPhasePrefix)
	s.k8s.ready = true
	s.checkKubeadmMachines(t)
	s.checkNodeVersions(t, o.KubernetesVersion, true)
	s.checkNodeVersions(t, o.KubernetesVersion, false)
}

// disableHealthChecks turns the class's MachineHealthChecks off in the
// rendered Cluster: under TCG a joining node stays NotReady (its CNI pod
// starting) longer than their 5 minutes, and a remediation in the middle
// of a rollout is not what this scenario tests. The kubeadm cluster has
// none either.
func disableHealthChecks(t *testing.T, cluster *unstructured.Unstructured) {
	must(t, unstructured.SetNestedField(cluster.Object, false, "spec", "topology", "controlPlane", "healthCheck", "enabled"))
	mds, _, err := unstructured.NestedSlice(cluster.Object, "spec", "topology", "workers", "machineDeployments")
	must(t, err)
	for _, md := range mds {
		md.(map[string]any)["healthCheck"] = map[string]any{"enabled": false}
	}
	must(t, unstructured.SetNestedSlice(cluster.Object, mds, "spec", "topology", "workers", "machineDeployments"))
}

// changeWorkerMemory raises the Cluster's workerMemoryMiB variable by
// 256 MiB and waits until the MachineDeployment replaced its worker, a
// Deployment guarded by a PodDisruptionBudget running meanwhile and the
// endpoint probed (as the kubeadm cluster's workers upgrade is); the new
// worker's LibvirtMachine must ask for the new memory and its Node report
// more than the old one did.
func (s *suite) changeWorkerMemory(t *testing.T) {
	s.needReady(t)
	before := s.workerNodeMemory(t)
	workers := s.guardWorkers(t)
	var memory int32
	for m, lm := range workers.old {
		if lm.Spec.MemoryMiB == 0 {
			t.Fatalf("the worker %s: LibvirtMachine %s has no memoryMiB from the class", m, lm.Name)
		}
		memory = lm.Spec.MemoryMiB + 256
	}
	stopProbe := s.probeEndpoint(s.kubeadmEndpoint(t))
	s.changeVariables(t, map[string]any{"workerMemoryMiB": memory})
	start := time.Now()
	t.Logf("Cluster %s changed: workerMemoryMiB %d", s.cut.name, memory)
	s.waitWorkersReplaced(t, workers, fmt.Sprintf("ClusterClass workers, workerMemoryMiB %d (by the topology controller)", memory), start, stopProbe)
	for _, m := range s.mdMachines(t) {
		machine := &clusterv1.Machine{}
		must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: m}, machine))
		if lm := s.lm(machine.Spec.InfrastructureRef.Name); lm == nil || lm.Spec.MemoryMiB != memory {
			t.Errorf("the new worker %s: LibvirtMachine %s does not ask for %d MiB", m, machine.Spec.InfrastructureRef.Name, memory)
		}
	}
	if after := s.workerNodeMemory(t); after.Cmp(before) <= 0 {
		t.Errorf("the new worker's node reports %s of memory, the old one %s: want more", after.String(), before.String())
	}
}

// workerNodeMemory is the memory capacity of the workload cluster's one
// worker node.
func (s *suite) workerNodeMemory(t *testing.T) resource.Quantity {
	t.Helper()
	nodes := &corev1.NodeList{}
	s.workloadCall(t, "listing nodes", func() error { return s.k8s.wc.List(s.ctx, nodes) })
	var workers []corev1.Node
	for _, n := range nodes.Items {
		if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; !cp {
			workers = append(workers, n)
		}
	}
	if len(workers) != 1 {
		t.Fatalf("want one worker node, have %d", len(workers))
	}
	return workers[0].Status.Capacity[corev1.ResourceMemory]
}

// changeVariables sets the Cluster's topology variables (added when the
// Cluster has none of that name) in one update.
func (s *suite) changeVariables(t *testing.T, variables map[string]any) {
	t.Helper()
	// The topology controller updates the Cluster too: retry on conflict.
	must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := &clusterv1.Cluster{}
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: s.cut.name}, cl); err != nil {
			return err
		}
		for name, value := range variables {
			raw, err := json.Marshal(value)
			if err != nil {
				return err
			}
			setVariable(&cl.Spec.Topology, clusterv1.ClusterVariable{Name: name, Value: apiextensionsv1.JSON{Raw: raw}})
		}
		return s.c.Update(s.ctx, cl)
	}))
}

// setVariable replaces the topology's variable of v's name with v, or adds
// it.
func setVariable(topology *clusterv1.Topology, v clusterv1.ClusterVariable) {
	for i := range topology.Variables {
		if topology.Variables[i].Name == v.Name {
			topology.Variables[i] = v
			return
		}
	}
	topology.Variables = append(topology.Variables, v)
}
