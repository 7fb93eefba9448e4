package devplane

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/examples"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// Image files of `make images` the demo boots.
const (
	// NodeImageFile is the base image of the demo's machines.
	NodeImageFile = "capl-debian-12.qcow2"
	// HAProxyImageFile is the base image of the demo's load-balancer VM.
	HAProxyImageFile = "capl-debian-12-haproxy.qcow2"
)

// Guest size of every demo VM: small enough that five machines and the
// load balancer fit a laptop, enough for Debian and cloud-init.
const (
	demoCPUs      = 1
	demoMemoryMiB = 512
)

// DemoOptions shape the demo cluster.
type DemoOptions struct {
	// Namespace and Name of the Cluster (default, demo).
	Namespace, Name string
	// ControlPlane is the number of control-plane Machines; Workers the
	// MachineDeployment's replicas.
	ControlPlane, Workers int32
	// ImageDir holds NodeImageFile and HAProxyImageFile.
	ImageDir string
	// DomainType and CPUMode of every VM (see ChooseDomainType).
	DomainType, CPUMode string
	// TCGCacheMiB bounds QEMU's translation cache of qemu domains; 0 leaves it to QEMU.
	TCGCacheMiB int32
	// StoragePool is the LibvirtCluster's storage pool, created at
	// /var/lib/libvirt/<StoragePool>; empty means the provider's default
	// pool (capi-libvirt at /var/lib/libvirt/capi-libvirt).
	StoragePool string
}

// Names of the demo's objects, derived from the cluster name.
func controlPlaneSecretName(cluster string) string { return cluster + "-control-plane-bootstrap" }
func workerSecretName(cluster string) string       { return cluster + "-worker-bootstrap" }
func controlPlaneMachineName(cluster string, i int32) string {
	return fmt.Sprintf("%s-control-plane-%d", cluster, i)
}
func machineDeploymentName(cluster string) string { return cluster + "-md-0" }

// Demo renders the demo cluster: the bootstrap Secrets (user-data of
// examples/demo, format cloud-config), the Cluster and its LibvirtCluster
// (HAProxy load balancer booting HAProxyImageFile), ControlPlane
// control-plane Machines with their LibvirtMachines, and a
// LibvirtMachineTemplate with a MachineDeployment of Workers replicas. Every
// Machine takes its bootstrap Secret directly through
// spec.bootstrap.dataSecretName; no bootstrap or control-plane provider is
// involved. Images are file:// URLs with checksums computed from the files.
func Demo(o DemoOptions) ([]client.Object, error) {
	if o.Namespace == "" {
		o.Namespace = "default"
	}
	if o.Name == "" {
		o.Name = "demo"
	}
	if o.ControlPlane < 1 {
		return nil, fmt.Errorf("the demo needs at least one control-plane machine, got %d", o.ControlPlane)
	}
	if o.Workers < 0 {
		return nil, fmt.Errorf("negative worker count %d", o.Workers)
	}
	nodeImage, err := imageSource(o.ImageDir, NodeImageFile)
	if err != nil {
		return nil, err
	}
	lbImage, err := imageSource(o.ImageDir, HAProxyImageFile)
	if err != nil {
		return nil, err
	}
	hw := infrav1.VirtualHardware{
		CPUs:                   demoCPUs,
		MemoryMiB:              demoMemoryMiB,
		DomainType:             infrav1.DomainType(o.DomainType),
		CPUMode:                infrav1.CPUMode(o.CPUMode),
		TCGTranslationCacheMiB: o.TCGCacheMiB,
	}
	if hw.DomainType != infrav1.DomainTypeQEMU {
		hw.TCGTranslationCacheMiB = 0
	}
	ns, name := o.Namespace, o.Name
	clusterLabels := func() map[string]string { return map[string]string{clusterv1.ClusterNameLabel: name} }
	meta := func(n string) metav1.ObjectMeta {
		return metav1.ObjectMeta{Namespace: ns, Name: n, Labels: clusterLabels()}
	}
	infraRef := func(kind, n string) clusterv1.ContractVersionedObjectReference {
		return clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: kind, Name: n}
	}
	secret := func(n string, userData []byte) *corev1.Secret {
		return &corev1.Secret{
			ObjectMeta: meta(n),
			Type:       clusterv1.ClusterSecretType,
			Data:       map[string][]byte{"value": userData, "format": []byte("cloud-config")},
		}
	}

	objs := []client.Object{
		secret(controlPlaneSecretName(name), examples.APIServerUserData),
		secret(workerSecretName(name), examples.WorkerUserData),
		&clusterv1.Cluster{
			ObjectMeta: meta(name),
			Spec:       clusterv1.ClusterSpec{InfrastructureRef: infraRef("LibvirtCluster", name)},
		},
	}
	lc := &infrav1.LibvirtCluster{ObjectMeta: meta(name)}
	lc.Spec.LoadBalancer = infrav1.LoadBalancer{Type: infrav1.LoadBalancerHAProxy, Image: &lbImage, VirtualHardware: hw}
	if o.StoragePool != "" {
		lc.Spec.StoragePool = infrav1.StoragePool{Name: o.StoragePool, Path: filepath.Join("/var/lib/libvirt", o.StoragePool)}
	}
	objs = append(objs, lc)

	for i := range o.ControlPlane {
		n := controlPlaneMachineName(name, i)
		m := &clusterv1.Machine{ObjectMeta: meta(n)}
		m.Labels[clusterv1.MachineControlPlaneLabel] = ""
		m.Spec.ClusterName = name
		m.Spec.Bootstrap.DataSecretName = ptr.To(controlPlaneSecretName(name))
		m.Spec.InfrastructureRef = infraRef("LibvirtMachine", n)
		lm := &infrav1.LibvirtMachine{ObjectMeta: meta(n)}
		lm.Spec.Image = nodeImage
		lm.Spec.VirtualHardware = hw
		objs = append(objs, m, lm)
	}

	mdName := machineDeploymentName(name)
	tmpl := &infrav1.LibvirtMachineTemplate{ObjectMeta: meta(mdName)}
	tmpl.Spec.Template.Spec.Image = nodeImage
	tmpl.Spec.Template.Spec.VirtualHardware = hw
	// Selector, template labels and rollout strategy come from Cluster
	// API's MachineDeployment defaulting webhook, which the plane serves.
	md := &clusterv1.MachineDeployment{ObjectMeta: meta(mdName)}
	md.Spec.ClusterName = name
	md.Spec.Replicas = ptr.To(o.Workers)
	md.Spec.Template.Spec.ClusterName = name
	md.Spec.Template.Spec.Bootstrap.DataSecretName = ptr.To(workerSecretName(name))
	md.Spec.Template.Spec.InfrastructureRef = infraRef("LibvirtMachineTemplate", mdName)
	// Scaling down removes the newest machines first: the oldest have
	// been up longest and are the likeliest to be in use.
	md.Spec.Deletion.Order = clusterv1.NewestMachineSetDeletionOrder
	objs = append(objs, tmpl, md)
	return objs, nil
}

// imageSource is a file:// image of dir with its sha256 checksum.
func imageSource(dir, file string) (infrav1.ImageSource, error) {
	if dir == "" {
		return infrav1.ImageSource{}, errors.New("no image directory: pass the directory of `make images` (/var/cache/capi-libvirt/images)")
	}
	path, err := filepath.Abs(filepath.Join(dir, file))
	if err != nil {
		return infrav1.ImageSource{}, err
	}
	sum, err := fileSHA256(path)
	if err != nil {
		return infrav1.ImageSource{}, fmt.Errorf("demo image: %w (build it with `make images`)", err)
	}
	return infrav1.ImageSource{URL: "file://" + path, Checksum: "sha256:" + sum}, nil
}

// ApplyDemo creates the objects (and their namespaces), leaving those that
// exist as they are, so that a second `capl-dev up` neither fails nor
// undoes a user's edits.
func ApplyDemo(ctx context.Context, c client.Client, objs []client.Object) error {
	for _, obj := range objs {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: obj.GetNamespace()}}
		if err := c.Create(ctx, ns); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating namespace %s: %w", ns.Name, err)
		}
	}
	for _, obj := range objs {
		if err := c.Create(ctx, obj); err != nil && !apierrors.IsAlreadyExists(err) {
			return fmt.Errorf("creating %T %s/%s: %w", obj, obj.GetNamespace(), obj.GetName(), err)
		}
	}
	return nil
}

// DomainChoice is the accelerator ChooseDomainType picked, and why.
type DomainChoice struct {
	// DomainType, CPUMode and TCGCacheMiB go into DemoOptions.
	DomainType, CPUMode string
	TCGCacheMiB         int32
	// Reason explains the choice in a sentence.
	Reason string
}

// DefaultTCGCacheMiB bounds QEMU's translation cache under TCG: QEMU's own
// default, sized from guest memory, costs several hundred MiB per VM.
const DefaultTCGCacheMiB = 128

// ChooseDomainType resolves "auto" (see chooseAccelerator): kvm with
// host-passthrough when /dev/kvm opens read-write and the CPU offers
// hardware virtualisation (vmx or svm in /proc/cpuinfo, also under nested
// virtualisation), otherwise qemu (TCG) with CPU mode maximum and a
// DefaultTCGCacheMiB translation cache. "kvm" and "qemu" are taken as given
// with the matching CPU mode unless cpuMode is set.
func ChooseDomainType(domainType, cpuMode string) (DomainChoice, error) {
	kvm := DomainChoice{DomainType: string(infrav1.DomainTypeKVM), CPUMode: string(infrav1.CPUModeHostPassthrough)}
	tcg := DomainChoice{DomainType: string(infrav1.DomainTypeQEMU), CPUMode: string(infrav1.CPUModeMaximum), TCGCacheMiB: DefaultTCGCacheMiB}
	var c DomainChoice
	switch domainType {
	case "kvm":
		c, c.Reason = kvm, "kvm as requested"
	case "qemu":
		c, c.Reason = tcg, "qemu (TCG) as requested"
	case "", "auto":
		c = autoDomainType(kvm, tcg)
	default:
		return DomainChoice{}, fmt.Errorf("unknown domain type %q: use auto, kvm or qemu", domainType)
	}
	if cpuMode != "" {
		c.CPUMode = cpuMode
	}
	return c, nil
}

func autoDomainType(kvm, tcg DomainChoice) DomainChoice {
	var probe kvmProbe
	f, err := os.OpenFile("/dev/kvm", os.O_RDWR, 0)
	if err == nil {
		_ = f.Close()
	}
	probe.openErr = err
	cpuinfo, err := os.ReadFile("/proc/cpuinfo")
	if err != nil {
		probe.cpuinfoErr = err
	}
	probe.cpuinfo = string(cpuinfo)
	return chooseAccelerator(probe, kvm, tcg)
}

// kvmProbe is what the auto choice learnt about the host.
type kvmProbe struct {
	// openErr is the error of opening /dev/kvm read-write.
	openErr error
	// cpuinfo is /proc/cpuinfo, unless reading it failed with cpuinfoErr.
	cpuinfo    string
	cpuinfoErr error
}

// chooseAccelerator decides between kvm and tcg. KVM needs /dev/kvm and a
// CPU with hardware virtualisation: a /dev/kvm without vmx or svm is a
// paravirtual KVM (kvm_pvm) that interprets a stock guest kernel
// instruction by instruction, about 100× slower than TCG. A host that is
// itself a VM ("hypervisor" flag) but offers vmx or svm runs nested KVM
// well (CI runners, cloud and Proxmox guests).
func chooseAccelerator(p kvmProbe, kvm, tcg DomainChoice) DomainChoice {
	if p.openErr != nil {
		tcg.Reason = fmt.Sprintf("qemu (TCG, slow): /dev/kvm is not usable (%v)", p.openErr)
		return tcg
	}
	if p.cpuinfoErr != nil {
		tcg.Reason = fmt.Sprintf("qemu (TCG, slow): cannot tell whether the CPU offers hardware virtualisation (%v)", p.cpuinfoErr)
		return tcg
	}
	ext := ""
	switch {
	case hasCPUFlag(p.cpuinfo, "vmx"):
		ext = "vmx (Intel VT-x)"
	case hasCPUFlag(p.cpuinfo, "svm"):
		ext = "svm (AMD-V)"
	default:
		tcg.Reason = "qemu (TCG): /dev/kvm opens but the CPU offers neither vmx nor svm, so this KVM is paravirtual or emulated " +
			"(e.g. kvm_pvm) and would interpret a stock guest kernel far slower than TCG runs it"
		return tcg
	}
	where := "this host"
	if hasCPUFlag(p.cpuinfo, "hypervisor") {
		where = "this virtual machine (nested virtualisation)"
	}
	kvm.Reason = fmt.Sprintf("kvm: /dev/kvm opens and the CPU of %s offers %s", where, ext)
	return kvm
}

// hasCPUFlag tells whether a "flags" line of cpuinfo lists flag.
func hasCPUFlag(cpuinfo, flag string) bool {
	for _, line := range strings.Split(cpuinfo, "\n") {
		k, v, ok := strings.Cut(line, ":")
		if ok && strings.TrimSpace(k) == "flags" {
			for _, f := range strings.Fields(v) {
				if f == flag {
					return true
				}
			}
		}
	}
	return false
}

// RecordDemoScope adds the demo's namespace and storage pool to the
// plane's scope.json, so that Down removes its libvirt objects even when
// the plane is no longer running.
func RecordDemoScope(stateDir string, d DemoOptions) error {
	pool := d.StoragePool
	if pool == "" {
		pool = infrav1.DefaultStoragePoolName
	}
	ns := d.Namespace
	if ns == "" {
		ns = "default"
	}
	return plane.RecordScope(stateDir, []string{ns}, []string{pool})
}
