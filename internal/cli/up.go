package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func up(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("up", flag.ExitOnError)
	o := plane.Options{Log: logf}
	var cf clusterFlags
	planeFlags(fs, &o)
	managerFlags(fs, &o)
	cf.bind(fs)
	noCluster := fs.Bool("no-demo", false, "start the plane only")
	timeout := fs.Duration("timeout", 60*time.Minute, "how long to wait for the cluster")
	_ = fs.Parse(args)
	o.ImageDir = cf.imageDir
	choice, err := cf.choice()
	if err != nil {
		return err
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	start := time.Now()
	p, err := plane.Start(ctx, o, self)
	if err != nil {
		return err
	}
	logf("management plane ready in %s: API %s, manager %s", time.Since(start).Round(time.Second), p.Config.Host, p.Endpoints.ManagerHealthURL)
	if assets, err := plane.FindAssets(o.Assets); err == nil {
		kubectlPath = filepath.Join(assets, "kubectl")
	}
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
func upCluster(ctx context.Context, p *plane.Plane, o plane.Options, cf clusterFlags, co devplane.ClusterOptions, start time.Time) error {
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
		out = plane.WorkloadKubeconfig(p.StateDir, co.Name)
	}
	if err := os.WriteFile(out, kubeconfig, 0o600); err != nil {
		return err
	}
	printClusterSteps(p, co, out)
	return nil
}

// upStandIn makes the stand-in demo: VMs whose cloud-init runs a stand-in
// API server behind the HAProxy endpoint, without Kubernetes.
func upStandIn(ctx context.Context, p *plane.Plane, d devplane.DemoOptions, start time.Time) error {
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

// kubectlPath is the kubectl next to the plane's kube-apiserver, which the
// printed next steps name.
var kubectlPath = "kubectl"

func kubectl() string { return kubectlPath }

func printClusterSteps(p *plane.Plane, co devplane.ClusterOptions, kubeconfig string) {
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

func printPlaneSteps(p *plane.Plane) {
	fmt.Printf(`
The management plane runs in the background (state in %[1]s, logs serve.log and manager.log).

  export KUBECONFIG=%[2]s
  %[3]s get clusters,kubeadmcontrolplanes,machinedeployments,machines -A
  %[3]s get libvirtclusters,libvirtmachines -A -o wide
`, p.StateDir, p.Kubeconfig, kubectl())
}

func printDownStep(p *plane.Plane) {
	fmt.Printf(`
Tear it all down (clusters, plane, every VM, volume and network it made):

  make down%s
`, stateDirArg(p.StateDir))
}

func stateDirArg(dir string) string {
	if dir == plane.DefaultStateDir {
		return ""
	}
	return " STATE_DIR=" + dir
}
