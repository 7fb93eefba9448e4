//go:build e2e

package e2e

import (
	"encoding/json"
	"path/filepath"
	"strings"
	"testing"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/client-go/util/retry"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
)

// clusterClassName is the upgrade scenario's Cluster of the ClusterClass
// libvirt, made once the kubeadm cluster is gone.
const clusterClassName = "cc"

// clusterClassPhasePrefix names its figures in the report, next to the
// kubeadm cluster's.
const clusterClassPhasePrefix = kubeadmPhasePrefix + "ClusterClass: "

// clusterClassUpgrade is the upgrade scenario's last phase, the upgrade of
// docs/upgrades.md's "ClusterClass clusters": the kubeadm cluster is
// deleted (two clusters' VMs do not fit a 2-core TCG host), then a Cluster
// of templates/clusterclass-libvirt.yaml with the kubeadm cluster's
// settings (TCGTuning) is made at the older version, and its
// spec.topology.version, image and coreDNSImageTag variables are changed
// in one update: Cluster API's topology controller must roll the control
// plane, then the MachineDeployment, to the newer version and node image,
// with the endpoint answering and nothing of a replaced machine left.
func (s *suite) clusterClassUpgrade(t *testing.T) {
	runInOrder(t, []phase{
		{"delete the kubeadm cluster", s.deleteKubeadm},
		{"ClusterClass nodes ready", s.clusterClassReady},
		{"ClusterClass upgrade", s.upgradeTopology},
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
	s.k8s.ready = false
}

// clusterClassOptions are the ClusterClass cluster's options: the kubeadm
// cluster's (the older version, TCGTuning) for the topology flavour.
func clusterClassOptions(t *testing.T) devplane.ClusterOptions {
	o := kubeadmOptions(t, 1)
	templates := filepath.Dir(o.Template)
	o.Name = clusterClassName
	o.Template = filepath.Join(templates, "cluster-template-topology.yaml")
	o.ClusterClass = filepath.Join(templates, "clusterclass-libvirt.yaml")
	return o
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

// upgradeTopology changes the Cluster's spec.topology.version and its
// image and coreDNSImageTag variables to the newer node image's in one
// update, as docs/upgrades.md says: the topology controller rotates the
// machine templates and moves the KubeadmControlPlane, and once the
// control plane is at the new version, the MachineDeployment. Each rollout
// is waited for, timed from its start (the workers' from the control
// plane's end, when the topology controller moves them) with the endpoint
// probed, and leak-checked as the kubeadm cluster's are; a Deployment
// guarded by a PodDisruptionBudget runs on the workers throughout.
func (s *suite) upgradeTopology(t *testing.T) {
	s.needReady(t)
	from := s.k8s.opts.KubernetesVersion
	version, img := s.upgradeTarget(t)
	coreDNS := upgradeCoreDNSTag(t)
	controlPlane := s.controlPlaneToReplace(t)
	workers := s.guardWorkers(t)
	stopProbe := s.probeEndpoint(s.kubeadmEndpoint(t))
	s.changeTopology(t, version, map[string]any{"image": map[string]any{"volume": map[string]any{"name": img.Volume}}, "coreDNSImageTag": coreDNS})
	start := time.Now()
	t.Logf("Cluster %s changed: version %s, image %s, coreDNSImageTag %s", s.cut.name, version, img.Volume, coreDNS)

	s.waitControlPlaneReplaced(t, controlPlane)
	s.recordRollout(t, "ClusterClass control plane "+from+" → "+version+" (topology version and image variable)", start, stopProbe())
	controlPlane.checkLeftovers(t, s)
	s.checkNodeVersions(t, version, true)

	// The workers' nodes and machines are checked once they are replaced
	// too: the topology controller started on them with the control plane
	// done, so one may be joining now.
	stopProbe, start = s.probeEndpoint(s.kubeadmEndpoint(t)), time.Now()
	s.waitWorkersReplaced(t, workers, "ClusterClass workers "+from+" → "+version+" (after the control plane, by the topology controller)", start, stopProbe)
	s.checkNodeVersions(t, version, false)
	if md := s.machineDeployment(t); md.Spec.Template.Spec.Version != version {
		t.Errorf("MachineDeployment %s at %s, want %s", md.Name, md.Spec.Template.Spec.Version, version)
	}
	s.checkCoreDNSImage(t, coreDNS)
	s.k8s.opts.KubernetesVersion = version
}

// changeTopology sets the Cluster's spec.topology.version and variables
// (added when the Cluster has none of that name) in one update.
func (s *suite) changeTopology(t *testing.T, version string, variables map[string]any) {
	t.Helper()
	// The topology controller updates the Cluster too: retry on conflict.
	must(t, retry.RetryOnConflict(retry.DefaultRetry, func() error {
		cl := &clusterv1.Cluster{}
		if err := s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: s.cut.name}, cl); err != nil {
			return err
		}
		cl.Spec.Topology.Version = version
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
