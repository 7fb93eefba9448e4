package cli

import (
	"fmt"
	"os"
	"path/filepath"

	"github.com/spf13/pflag"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/registry"
)

// managerFlags are the flags of the processes a starting plane runs.
func managerFlags(fs *pflag.FlagSet, o *plane.Options) {
	fs.StringVar(&o.ManagerBinary, "manager", "", "the provider's manager binary (make build); default: manager next to capl-dev")
	fs.StringVar(&o.Assets, "assets", "", "directory of kube-apiserver, etcd, kube-controller-manager and kubectl; default: next to capl-dev, then its k8s/<version>-linux-amd64 (bin/ of make envtest), $KUBEBUILDER_ASSETS first when set")
	// StringArray, not StringSlice: a manager flag may hold a comma.
	fs.StringArrayVar(&o.ManagerArgs, "manager-arg", nil, "extra flag for the manager, e.g. --manager-arg=--v=4 (repeatable)")
	fs.IntVar(&o.RegistryPort, "registry-port", registry.DefaultPort, "port of the plane's OCI registry on the host's addresses (the node image's containerd mirrors every registry through it); negative: none")
	fs.IntVar(&o.LibvirtTLSPort, "libvirt-tls-port", plane.DefaultLibvirtTLSPort, "port of the plane's libvirt endpoint on the host's addresses: TLS with the plane's client certificates (state directory's libvirt-tls/client), relayed to libvirtd's socket, for a manager running in a cluster the plane made; negative: none")
	fs.StringArrayVar(&o.RegistryLayouts, "registry-layout", nil, "OCI image layout directory whose images the plane pushes into its registry at start, e.g. dist/manager-image/oci of make image (repeatable)")
}

// clusterFlags are the flags shaping the cluster `capl-dev up` and
// `capl-dev create cluster` make.
type clusterFlags struct {
	namespace, name string
	imageDir        string
	// nodeImage is the node image file; empty means the one of
	// kubernetesVersion in imageDir.
	nodeImage           string
	domainType, cpuMode string
	storagePool         string
	controlPlane        int
	workers             int
	// Kubernetes cluster only.
	kubernetesVersion, template, cni, kubeconfigOut string
	// standIn makes the stand-in demo (no Kubernetes) instead.
	standIn bool
	// hostEtcd puts the cluster's etcd on the host (ClusterOptions.HostEtcd):
	// true, false, or auto (hostEtcdAuto).
	hostEtcd string
	// controlPlaneCPUs, when set, is each control-plane machine's vCPUs
	// (ClusterOptions.ControlPlaneCPUs).
	controlPlaneCPUs int
}

// bind adds the flags to fs; withName adds --name (up's; create cluster
// takes the name as its argument).
func (f *clusterFlags) bind(fs *pflag.FlagSet, withName bool) {
	fs.StringVarP(&f.namespace, "namespace", "n", "default", "namespace of the cluster")
	if withName {
		fs.StringVar(&f.name, "name", "demo", "name of the cluster")
	}
	fs.StringVar(&f.imageDir, "image-dir", plane.DefaultImageDir,
		"directory of the images of make images node-image: the node image, "+devplane.HAProxyImageFile+" and (stand-in) "+devplane.NodeImageFile)
	fs.StringVar(&f.nodeImage, "node-image", "", "the Kubernetes node image file; default capl-node-<kubernetes-version>.qcow2 in --image-dir")
	fs.StringVar(&f.domainType, "domain-type", "auto", "auto, kvm or qemu (TCG)")
	fs.StringVar(&f.cpuMode, "cpu-mode", "", "libvirt CPU mode; default host-passthrough for kvm, maximum for qemu")
	fs.StringVar(&f.storagePool, "storage-pool", "", "storage pool of the cluster's volumes, at /var/lib/libvirt/<name>; empty means the provider's default (capi-libvirt)")
	fs.IntVar(&f.controlPlane, "control-plane", 1, "control-plane machines")
	fs.IntVar(&f.workers, "workers", 1, "worker machines (MachineDeployment replicas)")
	fs.StringVar(&f.kubernetesVersion, "kubernetes-version", "v1.36.3", "Kubernetes version of the node image (make node-image)")
	fs.StringVar(&f.template, "template", shipped("templates/cluster-template.yaml"), "cluster template, rendered by clusterctl's variable rules")
	fs.StringVar(&f.cni, "cni", shipped("templates/cni-flannel.yaml"), "CNI manifest a ClusterResourceSet applies to the cluster")
	fs.StringVar(&f.kubeconfigOut, "kubeconfig-out", "", "where to write the workload cluster's kubeconfig (default <state-dir>/<name>.kubeconfig)")
	fs.StringVar(&f.hostEtcd, "host-etcd", hostEtcdAuto, "true: run the cluster's etcd on this host, served by the plane to the control-plane machines (kubeadm's external etcd), instead of a member in each of them, so that a control-plane rollout adds no etcd member (docs/tcg.md); false: a member in each; auto: true for a new cluster under TCG, whose stacked rollout does not complete on a 2-core host, false under KVM, and an existing cluster's etcd stays where it is")
	fs.Lookup("host-etcd").NoOptDefVal = "true"
	fs.IntVar(&f.controlPlaneCPUs, "control-plane-cpus", 0, "vCPUs of each control-plane machine; 0 keeps the template's (2); 1 also skips kubeadm's NumCPU preflight check")
	fs.BoolVar(&f.standIn, "stand-in", false, "make the stand-in demo instead: VMs running a stand-in API server, no Kubernetes (fast, for the provider's own tests)")
}

// choice resolves the accelerator.
func (f *clusterFlags) choice() (devplane.DomainChoice, error) {
	return devplane.ChooseDomainType(f.domainType, f.cpuMode)
}

// demoOptions are the stand-in demo's options.
func (f *clusterFlags) demoOptions(c devplane.DomainChoice) devplane.DemoOptions {
	return devplane.DemoOptions{
		Namespace: f.namespace, Name: f.name, ImageDir: f.imageDir, StoragePool: f.storagePool,
		ControlPlane: int32(f.controlPlane), Workers: int32(f.workers),
		DomainType: c.DomainType, CPUMode: c.CPUMode, TCGCacheMiB: c.TCGCacheMiB,
	}
}

// hostEtcdAuto is --host-etcd's default: the cluster's etcd on the host
// under TCG (a stacked control-plane rollout starved a 2-core host,
// docs/tcg.md), in its control-plane machines under KVM, and an existing
// cluster's where it is (devplane.PlaceEtcd).
const hostEtcdAuto = "auto"

// clusterOptions are the Kubernetes cluster's options. The template sets
// no CPU mode: the provider's default per domain type applies, but for the
// TCG profile's plainer model (devplane.TCGCPUModel); --cpu-mode shapes the
// stand-in cluster only.
//
// A relative --node-image is made absolute here, the one place up,
// create cluster, doctor and render take it from: libvirt imports the
// image from its path and allows its directory as an import source, and
// libvirtd does not run in capl-dev's working directory.
func (f *clusterFlags) clusterOptions(c devplane.DomainChoice) (devplane.ClusterOptions, error) {
	nodeImage := f.nodeImage
	if nodeImage != "" {
		abs, err := filepath.Abs(nodeImage)
		if err != nil {
			return devplane.ClusterOptions{}, fmt.Errorf("--node-image %s: %w", nodeImage, err)
		}
		nodeImage = abs
	}
	tcg := c.DomainType == string(infrav1.DomainTypeQEMU)
	o := devplane.ClusterOptions{
		Namespace: f.namespace, Name: f.name, ImageDir: f.imageDir, StoragePool: f.storagePool,
		ControlPlane: int32(f.controlPlane), Workers: int32(f.workers),
		KubernetesVersion: f.kubernetesVersion, Template: f.template, CNI: f.cni,
		NodeImage: nodeImage, DomainType: c.DomainType,
		ControlPlaneCPUs: int32(f.controlPlaneCPUs),
	}
	switch f.hostEtcd {
	case "true":
		o.HostEtcd = true
	case "false":
	case hostEtcdAuto:
		o.HostEtcd, o.EtcdFollowsCluster = tcg, true
	default:
		return o, fmt.Errorf("--host-etcd %q: want true, false or %s", f.hostEtcd, hostEtcdAuto)
	}
	if tcg {
		o = o.TCGTuning()
	}
	return o, nil
}

// needs is what up and doctor check the host for: the plane's binaries
// unless a plane runs in stateDir (o is how it would start), and, unless
// noCluster, the cluster or stand-in cluster of f. The accelerator
// choice is returned for the cluster's options; it is the zero choice
// with noCluster, when no guest is made.
func (f *clusterFlags) needs(stateDir string, o *plane.Options, noCluster bool) (doctorNeeds, devplane.DomainChoice, error) {
	needs := doctorNeeds{domainType: f.domainType, cpuMode: f.cpuMode}
	if _, err := plane.Attach(stateDir); err != nil {
		needs.plane = o
	}
	if noCluster {
		return needs, devplane.DomainChoice{}, nil
	}
	choice, err := f.choice()
	if err != nil {
		return needs, choice, err
	}
	if f.standIn {
		d := f.demoOptions(choice)
		needs.standIn = &d
		return needs, choice, nil
	}
	co, err := f.clusterOptions(choice)
	if err != nil {
		return needs, choice, err
	}
	needs.cluster = &co
	return needs, choice, nil
}

// imageDirFlag is the --image-dir of the commands that run the plane
// (serve, start): the directory the manager may import file:// images
// from.
func imageDirFlag(fs *pflag.FlagSet, o *plane.Options) {
	fs.StringVar(&o.ImageDir, "image-dir", plane.DefaultImageDir, "directory the manager may import file:// images from")
}

// shipped is rel in the directory of the capl-dev binary when it is there
// (a `make dist` directory), or in the directory above it (a checkout's
// bin/capl-dev, run from anywhere), else rel itself (relative to the
// working directory).
func shipped(rel string) string {
	exe, err := os.Executable()
	if err != nil {
		return rel
	}
	for _, dir := range []string{filepath.Dir(exe), filepath.Dir(filepath.Dir(exe))} {
		if p := filepath.Join(dir, rel); fileExists(p) {
			return p
		}
	}
	return rel
}

// fileExists tells whether path names something that can be stat'ed.
func fileExists(path string) bool {
	_, err := os.Stat(path)
	return err == nil
}
