// Command capl-dev runs the whole system on one host: `capl-dev up` starts a
// management plane (kube-apiserver and etcd kept in a state directory,
// kube-controller-manager and the provider's manager as supervised child
// processes, Cluster API's core and kubeadm controllers and webhooks) and
// creates a demo cluster of real VMs; `capl-dev down`
// deletes it all again. `make up` and `make down` run it.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client/apiutil"
	"sigs.k8s.io/yaml"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const usage = `capl-dev: the one-host management plane of cluster-api-provider-libvirt.

  capl-dev up     [flags]  start the plane (if not running) and the demo cluster
  capl-dev down   [flags]  delete the clusters, stop the plane, remove its VMs, volumes and networks
  capl-dev serve  [flags]  run the plane in the foreground (what up starts in the background)
  capl-dev render [flags]  print the demo cluster as YAML, for a management cluster of your own

Run "capl-dev <command> -h" for the flags of a command.
`

func main() {
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	var err error
	switch cmd, args := os.Args[1], os.Args[2:]; cmd {
	case "up":
		err = up(ctx, args)
	case "down":
		err = down(ctx, args)
	case "serve":
		err = serve(ctx, args)
	case "render":
		err = render(args)
	case "-h", "--help", "help":
		fmt.Print(usage)
	default:
		fmt.Fprintf(os.Stderr, "unknown command %q\n\n%s", cmd, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "capl-dev %s: %v\n", os.Args[1], err)
		os.Exit(1)
	}
}

// stringList is a repeatable flag.
type stringList []string

func (s *stringList) String() string     { return strings.Join(*s, " ") }
func (s *stringList) Set(v string) error { *s = append(*s, v); return nil }

func planeFlags(fs *flag.FlagSet, o *devplane.Options) {
	fs.StringVar(&o.StateDir, "state-dir", devplane.DefaultStateDir, "directory of the plane's etcd data, kubeconfig, pid files and logs")
	fs.StringVar(&o.LibvirtURI, "libvirt-uri", manager.DefaultLibvirtURI, "libvirt host the manager drives")
}

func managerFlags(fs *flag.FlagSet, o *devplane.Options) {
	fs.StringVar(&o.ManagerBinary, "manager", "bin/manager", "the provider's manager binary (make build)")
	fs.Var((*stringList)(&o.ManagerArgs), "manager-arg", "extra flag for the manager, e.g. --manager-arg=--v=4 (repeatable)")
}

// clusterFlags are the flags shaping the cluster `capl-dev up` makes.
type clusterFlags struct {
	namespace, name     string
	imageDir            string
	domainType, cpuMode string
	storagePool         string
	controlPlane        int
	workers             int
	// Kubernetes cluster only.
	kubernetesVersion, template, cni, kubeconfigOut string
	// standIn makes the stand-in demo (no Kubernetes) instead.
	standIn bool
}

func (f *clusterFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.namespace, "namespace", "default", "namespace of the cluster")
	fs.StringVar(&f.name, "name", "demo", "name of the cluster")
	fs.StringVar(&f.imageDir, "image-dir", "/var/cache/capi-libvirt/images",
		"directory of `make images node-image`, holding the node image, "+devplane.HAProxyImageFile+" and (stand-in) "+devplane.NodeImageFile)
	fs.StringVar(&f.domainType, "domain-type", "auto", "auto, kvm or qemu (TCG)")
	fs.StringVar(&f.cpuMode, "cpu-mode", "", "libvirt CPU mode; default host-passthrough for kvm, maximum for qemu")
	fs.StringVar(&f.storagePool, "storage-pool", "", "storage pool of the cluster's volumes, at /var/lib/libvirt/<name>; empty means the provider's default (capi-libvirt)")
	fs.IntVar(&f.controlPlane, "control-plane", 1, "control-plane machines")
	fs.IntVar(&f.workers, "workers", 1, "worker machines (MachineDeployment replicas)")
	fs.StringVar(&f.kubernetesVersion, "kubernetes-version", "v1.36.3", "Kubernetes version of the node image (make node-image)")
	fs.StringVar(&f.template, "template", "templates/cluster-template.yaml", "cluster template, rendered by clusterctl's variable rules")
	fs.StringVar(&f.cni, "cni", "templates/cni-flannel.yaml", "CNI manifest a ClusterResourceSet applies to the cluster")
	fs.StringVar(&f.kubeconfigOut, "kubeconfig-out", "", "where to write the workload cluster's kubeconfig (default <state-dir>/<name>.kubeconfig)")
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

// clusterOptions are the Kubernetes cluster's options. The template sets
// no CPU mode: the provider's default per domain type applies.
func (f *clusterFlags) clusterOptions(c devplane.DomainChoice) devplane.ClusterOptions {
	o := devplane.ClusterOptions{
		Namespace: f.namespace, Name: f.name, ImageDir: f.imageDir, StoragePool: f.storagePool,
		ControlPlane: int32(f.controlPlane), Workers: int32(f.workers),
		KubernetesVersion: f.kubernetesVersion, Template: f.template, CNI: f.cni,
		DomainType: c.DomainType,
	}
	if c.DomainType == string(infrav1.DomainTypeQEMU) {
		o = o.TCGTuning()
	}
	return o
}

func logf(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func up(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	o := devplane.Options{Log: logf}
	var cf clusterFlags
	planeFlags(fs, &o)
	managerFlags(fs, &o)
	cf.bind(fs)
	noCluster := fs.Bool("no-demo", false, "start the plane only")
	timeout := fs.Duration("timeout", 60*time.Minute, "how long to wait for the cluster")
	_ = fs.Parse(args)
	choice, err := cf.choice()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	start := time.Now()
	p, err := devplane.Start(ctx, o, self)
	if err != nil {
		return err
	}
	logf("management plane ready in %s: API %s, manager %s", time.Since(start).Round(time.Second), p.Config.Host, p.Endpoints.ManagerHealthURL)
	if *noCluster {
		printPlaneSteps(p)
		return nil
	}
	logf("guests: %s (override with UP_ARGS=\"--domain-type=kvm|qemu --cpu-mode=...\")", choice.Reason)
	waitCtx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()
	if cf.standIn {
		return upStandIn(waitCtx, p, cf.demoOptions(choice), start)
	}
	return upCluster(waitCtx, p, o, cf, cf.clusterOptions(choice), start)
}

// upCluster makes a Kubernetes cluster from the template and waits until
// every node is Ready.
func upCluster(ctx context.Context, p *devplane.Plane, o devplane.Options, cf clusterFlags, co devplane.ClusterOptions, start time.Time) error {
	if err := devplane.RecordClusterScope(p.StateDir, co); err != nil {
		return err
	}
	host, err := virt.Dial(ctx, o.LibvirtURI)
	if err != nil {
		return err
	}
	imgs, err := devplane.SeedImages(ctx, host, co)
	_ = host.Close()
	if err != nil {
		return err
	}
	logf("images in pool: node %s, load balancer %s", imgs.Node.Volume, imgs.LoadBalancer.Volume)
	objs, err := devplane.RenderCluster(co, devplane.ClusterVariables(co, imgs))
	if err != nil {
		return err
	}
	cni, err := devplane.CNIObjects(co)
	if err != nil {
		return err
	}
	if err := devplane.ApplyCluster(ctx, p.Client, cni, objs); err != nil {
		return err
	}
	applied := time.Now()
	logf("cluster %s/%s applied from %s: KubeadmControlPlane of %d, MachineDeployment %s of %d, CNI by ClusterResourceSet",
		co.Namespace, co.Name, co.Template, co.ControlPlane, co.MachineDeploymentName(), co.Workers)
	status, err := devplane.WaitProvisioned(ctx, p.Client, co.Namespace, co.Name, func(s devplane.DemoStatus) { logf("%s", s) })
	if err != nil {
		return err
	}
	logf("infrastructure provisioned %s after apply; endpoint %s", time.Since(applied).Round(time.Second), status.Endpoint)
	if co.StagedWorkers {
		logf("TCG: the %d workers (1 vCPU each) are created once the control plane's node is Ready", co.Workers)
		if err := devplane.WaitControlPlaneNode(ctx, p.Client, co.Namespace, co.Name, func(line string) { logf("%s", line) }); err != nil {
			return err
		}
		logf("first control-plane node Ready %s after apply; scaling %s to %d", time.Since(applied).Round(time.Second), co.MachineDeploymentName(), co.Workers)
		if err := devplane.ScaleWorkers(ctx, p.Client, co, co.Workers); err != nil {
			return err
		}
	}
	nodes, kubeconfig, err := devplane.WaitNodes(ctx, p.Client, co.Namespace, co.Name, func(line string) { logf("%s", line) })
	if err != nil {
		return err
	}
	logf("all %d nodes Ready %s after apply (%s since up started)", len(nodes.Joined), time.Since(applied).Round(time.Second), time.Since(start).Round(time.Second))
	out := cf.kubeconfigOut
	if out == "" {
		out = filepath.Join(p.StateDir, co.Name+".kubeconfig")
	}
	if err := os.WriteFile(out, kubeconfig, 0o600); err != nil {
		return err
	}
	printClusterSteps(p, co, out)
	return nil
}

// upStandIn makes the stand-in demo: VMs whose cloud-init runs a stand-in
// API server behind the HAProxy endpoint, without Kubernetes.
func upStandIn(ctx context.Context, p *devplane.Plane, d devplane.DemoOptions, start time.Time) error {
	objs, err := devplane.Demo(d)
	if err != nil {
		return err
	}
	if err := devplane.RecordDemoScope(p.StateDir, d); err != nil {
		return err
	}
	if err := devplane.ApplyDemo(ctx, p.Client, objs); err != nil {
		return err
	}
	logf("stand-in cluster %s/%s applied: %d control-plane machines, MachineDeployment %s-md-0 with %d workers, 1 vCPU / 512 MiB each",
		d.Namespace, d.Name, d.ControlPlane, d.Name, d.Workers)
	status, err := devplane.WaitProvisioned(ctx, p.Client, d.Namespace, d.Name, func(s devplane.DemoStatus) {
		logf("%s", s)
	})
	if err != nil {
		return err
	}
	logf("stand-in cluster provisioned in %s; waiting for https://%s/readyz (cloud-init starts the stand-in API servers)",
		time.Since(start).Round(time.Second), status.Endpoint)
	host, err := devplane.WaitEndpoint(ctx, status.Endpoint)
	if err != nil {
		return err
	}
	logf("control-plane endpoint answers (from %s) after %s", host, time.Since(start).Round(time.Second))
	printPlaneSteps(p)
	fmt.Printf(`
Control-plane endpoint (HAProxy VM in front of the stand-in API servers):

  curl -k https://%s/readyz
`, status.Endpoint)
	printDownStep(p)
	return nil
}

// kubectl is the kubectl of hack/envtest.sh when make runs us, else the one on PATH.
func kubectl() string {
	if assets := os.Getenv("KUBEBUILDER_ASSETS"); assets != "" {
		return filepath.Join(assets, "kubectl")
	}
	return "kubectl"
}

func printClusterSteps(p *devplane.Plane, co devplane.ClusterOptions, kubeconfig string) {
	fmt.Printf("\nWorkload cluster %s/%s (kubeconfig %s):\n\n", co.Namespace, co.Name, kubeconfig)
	cmd := exec.Command(kubectl(), "--kubeconfig", kubeconfig, "get", "nodes", "-o", "wide")
	cmd.Stdout, cmd.Stderr = os.Stdout, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Printf("(kubectl get nodes: %v)\n", err)
	}
	fmt.Printf(`
  %[1]s --kubeconfig %[2]s get nodes,pods -A -o wide
`, kubectl(), kubeconfig)
	printPlaneSteps(p)
	printDownStep(p)
}

func printPlaneSteps(p *devplane.Plane) {
	fmt.Printf(`
The management plane runs in the background (state in %[1]s, logs serve.log and manager.log).

  export KUBECONFIG=%[2]s
  %[3]s get clusters,kubeadmcontrolplanes,machinedeployments,machines -A
  %[3]s get libvirtclusters,libvirtmachines -A -o wide
`, p.StateDir, p.Kubeconfig, kubectl())
}

func printDownStep(p *devplane.Plane) {
	fmt.Printf(`
Tear it all down (clusters, plane, every VM, volume and network it made):

  make down%s
`, stateDirArg(p.StateDir))
}

func stateDirArg(dir string) string {
	if dir == devplane.DefaultStateDir {
		return ""
	}
	return " STATE_DIR=" + dir
}

func down(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("down", flag.ExitOnError)
	o := devplane.Options{Log: logf}
	planeFlags(fs, &o)
	fs.BoolVar(&o.SweepAll, "all", false, "remove every provider-owned domain, network and volume on the host, not only the plane's")
	_ = fs.Parse(args)
	start := time.Now()
	rep, err := devplane.Down(ctx, o)
	for _, l := range []struct {
		what  string
		names []string
	}{{"domains", rep.Domains}, {"volumes", rep.Volumes}, {"networks", rep.Networks}, {"storage pools", rep.Pools}} {
		if len(l.names) > 0 {
			logf("removed %s: %s", l.what, strings.Join(l.names, ", "))
		}
	}
	for _, k := range rep.Kept {
		logf("kept %s", k)
	}
	if rep.Empty() && err == nil {
		logf("no libvirt object of the plane was left to remove")
	}
	if err != nil {
		return err
	}
	logf("down in %s; %s removed", time.Since(start).Round(time.Second), o.StateDir)
	return nil
}

func serve(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("serve", flag.ExitOnError)
	var o devplane.Options
	planeFlags(fs, &o)
	managerFlags(fs, &o)
	_ = fs.Parse(args)
	// controller-runtime logs of the in-process Cluster API controllers go
	// to serve.log.
	ctrl.SetLogger(klog.Background())
	return devplane.Serve(ctx, o)
}

func render(args []string) error {
	fs := flag.NewFlagSet("render", flag.ExitOnError)
	var cf clusterFlags
	cf.bind(fs)
	_ = fs.Parse(args)
	choice, err := cf.choice()
	if err != nil {
		return err
	}
	var objs []runtime.Object
	if cf.standIn {
		demo, err := devplane.Demo(cf.demoOptions(choice))
		if err != nil {
			return err
		}
		for _, o := range demo {
			objs = append(objs, o)
		}
	} else {
		co := cf.clusterOptions(choice)
		imgs, err := devplane.ImageVolumes(co)
		if err != nil {
			return err
		}
		cluster, err := devplane.RenderCluster(co, devplane.ClusterVariables(co, imgs))
		if err != nil {
			return err
		}
		cni, err := devplane.CNIObjects(co)
		if err != nil {
			return err
		}
		for _, o := range cni {
			objs = append(objs, o)
		}
		for _, o := range cluster {
			objs = append(objs, o)
		}
	}
	scheme, err := devplane.Scheme()
	if err != nil {
		return err
	}
	for _, obj := range objs {
		// Readable user-data: stringData instead of base64.
		if s, ok := obj.(*corev1.Secret); ok {
			s.StringData = map[string]string{}
			for k, v := range s.Data {
				s.StringData[k] = string(v)
			}
			s.Data = nil
		}
		if err := printYAML(scheme, obj); err != nil {
			return err
		}
	}
	return nil
}

func printYAML(scheme *runtime.Scheme, obj runtime.Object) error {
	gvk, err := apiutil.GVKForObject(obj, scheme)
	if err != nil {
		return err
	}
	obj.GetObjectKind().SetGroupVersionKind(gvk)
	data, err := yaml.Marshal(obj)
	if err != nil {
		return errors.Join(fmt.Errorf("rendering %s", gvk.Kind), err)
	}
	fmt.Printf("---\n%s", data)
	return nil
}
