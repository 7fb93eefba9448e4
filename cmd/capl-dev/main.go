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

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
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

// demoFlags are the flags shaping the demo cluster.
type demoFlags struct {
	opts                devplane.DemoOptions
	domainType, cpuMode string
	controlPlane        int
	workers             int
}

func (f *demoFlags) bind(fs *flag.FlagSet) {
	fs.StringVar(&f.opts.Namespace, "namespace", "default", "namespace of the demo cluster")
	fs.StringVar(&f.opts.Name, "name", "demo", "name of the demo cluster")
	fs.StringVar(&f.opts.ImageDir, "image-dir", "/var/cache/capi-libvirt/images",
		"directory of `make images` holding "+devplane.NodeImageFile+" and "+devplane.HAProxyImageFile)
	fs.StringVar(&f.domainType, "domain-type", "auto", "auto, kvm or qemu (TCG)")
	fs.StringVar(&f.cpuMode, "cpu-mode", "", "libvirt CPU mode; default host-passthrough for kvm, maximum for qemu")
	fs.StringVar(&f.opts.StoragePool, "storage-pool", "", "storage pool of the demo's volumes, created at /var/lib/libvirt/<name>; empty means the provider's default (capi-libvirt)")
	fs.IntVar(&f.controlPlane, "control-plane", 3, "control-plane machines")
	fs.IntVar(&f.workers, "workers", 2, "worker machines (MachineDeployment replicas)")
}

// options resolves the parsed flags, choosing the domain type.
func (f *demoFlags) options() (devplane.DemoOptions, devplane.DomainChoice, error) {
	d := f.opts
	d.ControlPlane, d.Workers = int32(f.controlPlane), int32(f.workers)
	choice, err := devplane.ChooseDomainType(f.domainType, f.cpuMode)
	if err != nil {
		return d, choice, err
	}
	d.DomainType, d.CPUMode, d.TCGCacheMiB = choice.DomainType, choice.CPUMode, choice.TCGCacheMiB
	return d, choice, nil
}

func logf(format string, args ...any) {
	fmt.Printf("%s  %s\n", time.Now().Format("15:04:05"), fmt.Sprintf(format, args...))
}

func up(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	o := devplane.Options{Log: logf}
	var df demoFlags
	planeFlags(fs, &o)
	managerFlags(fs, &o)
	df.bind(fs)
	noDemo := fs.Bool("no-demo", false, "start the plane only")
	timeout := fs.Duration("timeout", 30*time.Minute, "how long to wait for the demo cluster to be provisioned")
	_ = fs.Parse(args)
	d, choice, err := df.options()
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
	var status devplane.DemoStatus
	if !*noDemo {
		logf("guests: %s (override with UP_ARGS=\"--domain-type=kvm|qemu --cpu-mode=...\")", choice.Reason)
		objs, err := devplane.Demo(d)
		if err != nil {
			return err
		}
		if err := devplane.RecordDemoScope(o.StateDir, d); err != nil {
			return err
		}
		if err := devplane.ApplyDemo(ctx, p.Client, objs); err != nil {
			return err
		}
		logf("demo cluster %s/%s applied: %d control-plane machines, MachineDeployment %s-md-0 with %d workers, 1 vCPU / 512 MiB each",
			d.Namespace, d.Name, d.ControlPlane, d.Name, d.Workers)
		waitCtx, cancel := context.WithTimeout(ctx, *timeout)
		defer cancel()
		status, err = devplane.WaitProvisioned(waitCtx, p.Client, d.Namespace, d.Name, func(s devplane.DemoStatus) {
			logf("%s", s)
		})
		if err != nil {
			return err
		}
		logf("demo cluster provisioned in %s; waiting for https://%s/readyz (cloud-init starts the stand-in API servers)",
			time.Since(start).Round(time.Second), status.Endpoint)
		host, err := devplane.WaitEndpoint(waitCtx, status.Endpoint)
		if err != nil {
			return err
		}
		logf("control-plane endpoint answers (from %s) after %s", host, time.Since(start).Round(time.Second))
	}
	printNextSteps(p, d, status, *noDemo)
	return nil
}

func printNextSteps(p *devplane.Plane, d devplane.DemoOptions, s devplane.DemoStatus, noDemo bool) {
	kubectl := "kubectl"
	if assets := os.Getenv("KUBEBUILDER_ASSETS"); assets != "" {
		kubectl = filepath.Join(assets, "kubectl")
	}
	fmt.Printf(`
The management plane runs in the background (state in %[1]s, logs serve.log and manager.log).

  export KUBECONFIG=%[2]s
  %[3]s get clusters,machinedeployments,machines -A
  %[3]s get libvirtclusters,libvirtmachines -A -o wide
  %[3]s describe libvirtcluster -n %[4]s %[5]s
`, p.StateDir, p.Kubeconfig, kubectl, d.Namespace, d.Name)
	if !noDemo && s.Endpoint != "" {
		fmt.Printf(`
Control-plane endpoint (HAProxy VM in front of the control-plane machines' stand-in API servers):

  curl -k https://%s/readyz
`, s.Endpoint)
	}
	fmt.Printf(`
Tear it all down (clusters, plane, every VM, volume and network it made):

  sudo make down%s
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
	var df demoFlags
	df.bind(fs)
	_ = fs.Parse(args)
	d, _, err := df.options()
	if err != nil {
		return err
	}
	objs, err := devplane.Demo(d)
	if err != nil {
		return err
	}
	scheme, err := manager.NewScheme()
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
