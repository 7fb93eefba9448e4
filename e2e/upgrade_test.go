//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
)

// envNodeImageFrom names the node image of the older Kubernetes version
// the upgrade scenario starts from; `make test-e2e-upgrade` sets it.
const envNodeImageFrom = "CAPL_TEST_NODE_IMAGE_FROM"

// envNodeVersions names the VERSIONS file of the newer node image's
// binaries (installed in the image as /etc/capl-node-versions); `make
// test-e2e-upgrade` sets it. The scenario takes the CoreDNS tag from it:
// KubeadmControlPlane keeps a cluster's CoreDNS image unless
// dns.imageTag names another, and the newer image holds only its own.
const envNodeVersions = "CAPL_TEST_NODE_VERSIONS"

// upgradeCoreDNSTag is the CoreDNS image tag of the newer node image.
func upgradeCoreDNSTag(t *testing.T) string {
	t.Helper()
	path := os.Getenv(envNodeVersions)
	if path == "" {
		t.Fatalf("%s is not set: run the upgrade scenario through `make test-e2e-upgrade`", envNodeVersions)
	}
	b, err := os.ReadFile(path)
	must(t, err)
	for line := range strings.Lines(string(b)) {
		if f := strings.Fields(line); len(f) == 2 && f[0] == "github.com/coredns/coredns" {
			return f[1]
		}
	}
	t.Fatalf("%s names no github.com/coredns/coredns version", path)
	return ""
}

// nodeImageFrom is the upgrade scenario's older node image.
func nodeImageFrom(t *testing.T) string {
	t.Helper()
	img := os.Getenv(envNodeImageFrom)
	if img == "" {
		t.Fatalf("%s is not set: run the upgrade scenario through `make test-e2e-upgrade`, which builds both node images", envNodeImageFrom)
	}
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("the older node image: %v (build it with `make node-images`)", err)
	}
	return img
}

// upgradeScenario is `make test-e2e-upgrade`'s, shaped like Cluster API's
// ClusterUpgradeConformanceSpec (without conformance) to fit a 2-core TCG
// host: the kubeadm cluster of the CI scenario at the older Kubernetes
// version, its etcd on the host (a stacked etcd's rollout does not
// complete there, docs/tcg.md); its control plane, then its workers
// (replaced, not doubled: maxSurge 0), moved to the newer version and node
// image by new machine templates; then, in place of the kubeadm cluster, a
// Cluster of the ClusterClass at the newer version whose workers roll out
// a changed variable (clusterClassVariableChange). The endpoint is probed
// throughout and every replaced machine must leave nothing in libvirt.
func (s *suite) upgradeScenario(t *testing.T) {
	s.createKubeadm(t, 1)
	t.Run("kubeadm nodes ready", s.kubeadmReady)
	if !s.k8s.ready {
		return
	}
	runInOrder(t, []phase{
		{"kubeadm control-plane upgrade", s.upgradeControlPlane},
		{"kubeadm workers upgrade", s.upgradeWorkers},
		{"kubeadm service across nodes after the upgrade", s.kubeadmService},
		{"ClusterClass variable change", s.clusterClassVariableChange},
	})
}

// phase is a named step of a scenario.
type phase struct {
	name string
	run  func(*testing.T)
}

// runInOrder runs each phase as a subtest until one fails: each works on
// what the one before left.
func runInOrder(t *testing.T, phases []phase) {
	for _, p := range phases {
		if !t.Run(p.name, p.run) {
			return
		}
	}
}

// upgradeTarget imports the newer node image into the cluster's pool and
// returns its version and volume.
func (s *suite) upgradeTarget(t *testing.T) (version string, img devplane.ClusterImage) {
	t.Helper()
	o := s.k8s.opts
	o.KubernetesVersion = nodeImageVersion(testlibvirt.NodeImage(t))
	if o.KubernetesVersion == s.k8s.opts.KubernetesVersion {
		t.Fatalf("the newer node image is the older one's version %s", o.KubernetesVersion)
	}
	imgs, err := devplane.SeedImages(s.ctx, s.host, o)
	must(t, err)
	return o.KubernetesVersion, imgs.Node
}

// copyMachineTemplate creates a LibvirtMachineTemplate like name with the
// node image volume, named after the version: templates are immutable, so
// a change is a new template, as Cluster API's contract asks.
func (s *suite) copyMachineTemplate(t *testing.T, name, version, volume string) string {
	t.Helper()
	old := &infrav1.LibvirtMachineTemplate{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: name}, old))
	tmpl := &infrav1.LibvirtMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: namespace,
		Name: strings.TrimSuffix(name, "-"+s.k8s.opts.KubernetesVersion) + "-" + strings.ReplaceAll(version, ".", "-")}}
	tmpl.Spec = *old.Spec.DeepCopy()
	tmpl.Spec.Template.Spec.Image.Volume = &infrav1.VolumeReference{Name: volume}
	must(t, s.c.Create(s.ctx, tmpl))
	return tmpl.Name
}

// upgradeControlPlane moves the KubeadmControlPlane to the newer version,
// a machine template of the newer node image and the newer image's CoreDNS
// in one change; its machine must be replaced with the endpoint answering,
// and CoreDNS moved.
func (s *suite) upgradeControlPlane(t *testing.T) {
	version, img := s.upgradeTarget(t)
	coreDNS := upgradeCoreDNSTag(t)
	kcp := s.kubeadmControlPlane(t)
	tmpl := s.copyMachineTemplate(t, kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name, version, img.Volume)
	s.replaceControlPlane(t, "control plane "+s.k8s.opts.KubernetesVersion+" → "+version, func(kcp *controlplanev1.KubeadmControlPlane) {
		kcp.Spec.Version = version
		kcp.Spec.MachineTemplate.Spec.InfrastructureRef.Name = tmpl
		kcp.Spec.KubeadmConfigSpec.ClusterConfiguration.DNS.ImageTag = coreDNS
	})
	s.checkNodeVersions(t, version, true)
	s.checkCoreDNSImage(t, coreDNS)
}

// checkCoreDNSImage waits until KubeadmControlPlane moved the CoreDNS
// Deployment to tag.
func (s *suite) checkCoreDNSImage(t *testing.T, tag string) {
	t.Helper()
	dep := &appsv1.Deployment{}
	s.waitWorkload(t, "CoreDNS moved to "+tag, 10*time.Minute, func() (bool, string) {
		if err := s.k8s.wc.Get(s.ctx, client.ObjectKey{Namespace: "kube-system", Name: "coredns"}, dep); err != nil {
			return false, err.Error()
		}
		for _, c := range dep.Spec.Template.Spec.Containers {
			if !strings.HasSuffix(c.Image, ":"+tag) {
				return false, "image " + c.Image
			}
		}
		return true, ""
	})
}

// upgradeWorkers moves the MachineDeployment to the newer version and a
// machine template of the newer node image while a Deployment with a
// PodDisruptionBudget runs on the workers: the drain must honour it.
func (s *suite) upgradeWorkers(t *testing.T) {
	version, img := s.upgradeTarget(t)
	md := s.machineDeployment(t)
	tmpl := s.copyMachineTemplate(t, md.Spec.Template.Spec.InfrastructureRef.Name, version, img.Volume)
	s.replaceWorkers(t, "workers "+s.k8s.opts.KubernetesVersion+" → "+version, func(md *clusterv1.MachineDeployment) {
		md.Spec.Template.Spec.Version = version
		md.Spec.Template.Spec.InfrastructureRef.Name = tmpl
	})
	s.checkNodeVersions(t, version, false)
	// The cluster is at the newer version from here on (the Service check
	// runs the newer kube-proxy image, which only the new nodes hold).
	s.k8s.opts.KubernetesVersion = version
}

// kubeadmControlPlane reads the cluster under test's KubeadmControlPlane.
func (s *suite) kubeadmControlPlane(t *testing.T) *controlplanev1.KubeadmControlPlane {
	t.Helper()
	kcp := &controlplanev1.KubeadmControlPlane{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: s.cut.controlPlane}, kcp))
	return kcp
}

// machineDeployment reads the cluster under test's MachineDeployment of
// workers.
func (s *suite) machineDeployment(t *testing.T) *clusterv1.MachineDeployment {
	t.Helper()
	md := &clusterv1.MachineDeployment{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: s.cut.workers}, md))
	return md
}

// cniImage is the image of the CNI's pods: every node holds it, those of
// either node image and those not joined yet, since the CNI's DaemonSet
// runs on each, and nothing can be pulled. Its Debian base has a shell.
// (Each node image holds only its own Kubernetes version's pause image,
// v1.35.4's 3.10.1 and v1.36.3's 3.10.2: a pause pod evicted from an old
// worker could not start on its replacement, and the PodDisruptionBudget
// would hold the drain of the second pod forever.)
func (s *suite) cniImage(t *testing.T) string {
	t.Helper()
	pods := &corev1.PodList{}
	s.workloadCall(t, "listing the CNI's pods", func() error {
		return s.k8s.wc.List(s.ctx, pods, client.InNamespace(devplane.CNINamespace), devplane.CNIPodLabels)
	})
	for _, p := range pods.Items {
		if len(p.Spec.Containers) > 0 {
			return p.Spec.Containers[0].Image
		}
	}
	t.Fatalf("no CNI pod in namespace %s", devplane.CNINamespace)
	return ""
}

// checkNodeVersions checks that every control-plane node (controlPlane) or
// worker node reports kubelet version.
func (s *suite) checkNodeVersions(t *testing.T, version string, controlPlane bool) {
	t.Helper()
	nodes := &corev1.NodeList{}
	s.workloadCall(t, "listing nodes", func() error { return s.k8s.wc.List(s.ctx, nodes) })
	for _, n := range nodes.Items {
		if _, cp := n.Labels["node-role.kubernetes.io/control-plane"]; cp != controlPlane {
			continue
		}
		if got := n.Status.NodeInfo.KubeletVersion; got != version {
			t.Errorf("node %s: kubelet %s, want %s", n.Name, got, version)
		}
		if !strings.HasPrefix(n.Spec.ProviderID, infrav1.ProviderIDPrefix) {
			t.Errorf("node %s: providerID %q is not ours", n.Name, n.Spec.ProviderID)
		}
	}
}

// conditionsLine is the status, reason and message of each named
// condition, on one line.
func conditionsLine(conditions []metav1.Condition, types ...string) string {
	parts := make([]string, 0, len(types))
	for _, typ := range types {
		c := meta.FindStatusCondition(conditions, typ)
		if c == nil {
			parts = append(parts, typ+" absent")
			continue
		}
		parts = append(parts, fmt.Sprintf("%s %s %s: %s", typ, c.Status, c.Reason, strings.Join(strings.Fields(c.Message), " ")))
	}
	return strings.Join(parts, "; ")
}
