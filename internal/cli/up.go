package cli

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/spf13/cobra"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// defaultTimeout bounds the wait for a cluster's nodes: under TCG on a
// 2-core host a 1 + 1 cluster took up to 25 minutes.
const defaultTimeout = 60 * time.Minute

func (a *app) upCommand() *cobra.Command {
	var o plane.Options
	var cf clusterFlags
	var noCluster bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "up",
		Short: "Start the plane (unless it runs) and make the cluster --name (demo)",
		Long: `Checks the host (capl-dev doctor), starts the management plane in the
background unless it runs, and makes a kubeadm cluster from
templates/cluster-template.yaml (1 control plane + 1 worker by default), waiting
until every node is Ready. Run again, it converges: the plane is reused and the
cluster is applied server-side with the sizes given. make up runs it.`,
		Example: `  capl-dev up
  capl-dev up --control-plane=3 --workers=2
  capl-dev up --no-demo          # the plane only`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			o.StateDir, o.LibvirtURI, o.Log, o.ImageDir = a.stateDir, a.uri(), a.logf, cf.imageDir
			needs, choice, err := cf.needs(a.stateDir, &o, noCluster)
			if err != nil {
				return err
			}
			if err := a.preflight(ctx, needs); err != nil {
				return err
			}
			start := time.Now()
			p, err := a.startPlane(ctx, o)
			if err != nil {
				return err
			}
			kubectl := kubectlOf(o.Assets)
			a.logf("management plane ready in %s: API %s, manager %s", time.Since(start).Round(time.Second), p.Config.Host, p.Endpoints.ManagerHealthURL)
			if noCluster {
				a.printPlaneSteps(p, kubectl)
				return nil
			}
			a.logf("guests: %s (override with UP_ARGS=\"--domain-type=kvm|qemu --cpu-mode=...\")", choice.Reason)
			waitCtx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if needs.standIn != nil {
				return a.upStandIn(waitCtx, p, *needs.standIn, kubectl, start)
			}
			return a.makeCluster(waitCtx, p, cf.kubeconfigOut, kubectl, *needs.cluster, true, start)
		},
	}
	fs := cmd.Flags()
	managerFlags(fs, &o)
	cf.bind(fs, true)
	fs.BoolVar(&noCluster, "no-demo", false, "start the plane only")
	fs.DurationVar(&timeout, "timeout", defaultTimeout, "how long to wait for the cluster")
	return cmd
}

// preflight runs the doctor's checks before a command that starts
// things, printing what is not right; a failed check stops the command.
func (a *app) preflight(ctx context.Context, needs doctorNeeds) error {
	checks := a.runDoctor(ctx, needs)
	var notOK []check
	for _, c := range checks {
		if c.verdict != pass {
			notOK = append(notOK, c)
		}
	}
	if len(notOK) == 0 {
		a.logf("host checked: %d checks passed (capl-dev doctor shows them)", len(checks))
		return nil
	}
	a.logf("host checked: %d of %d checks passed:", len(checks)-len(notOK), len(checks))
	printChecks(a.out, notOK)
	return failed(checks)
}

// startPlane starts the plane of o (or attaches to the running one) and
// records how it was started, for `capl-dev start`.
func (a *app) startPlane(ctx context.Context, o plane.Options) (*plane.Plane, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	running := false
	if _, err := plane.Attach(o.StateDir); err == nil {
		running = true
	}
	p, err := plane.Start(ctx, o, self)
	if err != nil {
		return nil, err
	}
	if running {
		a.warnStale(p)
	} else if err := recordPlane(o); err != nil {
		return nil, err
	}
	return p, nil
}

// makeCluster applies a Kubernetes cluster from the template,
// server-side, and with wait waits until every node is Ready and writes
// its kubeconfig to kubeconfigOut (default <state-dir>/NAME.kubeconfig);
// the printed next steps name kubectl. A cluster that exists already is
// applied as it is asked for now: its workers are not staged again (they
// exist), so replicas change the same way under KVM and TCG.
func (a *app) makeCluster(ctx context.Context, p *plane.Plane, kubeconfigOut, kubectl string, co devplane.ClusterOptions, wait bool, start time.Time) error {
	exists, err := devplane.ClusterExists(ctx, p.Client, co.Namespace, co.Name)
	if err != nil {
		return err
	}
	if exists {
		a.logf("cluster %s/%s exists: applying it again with a control plane of %d and %d workers", co.Namespace, co.Name, co.ControlPlane, co.Workers)
	}
	if co, err = devplane.PlaceEtcd(ctx, p.Client, co); err != nil {
		return err
	}
	co = stageWorkers(co, exists, wait)
	if err := devplane.RecordClusterScope(p.StateDir, co); err != nil {
		return err
	}
	host, err := a.dial(ctx)
	if err != nil {
		return err
	}
	a.logf("importing %s and the HAProxy image into the cluster's pool (once per image)", co.NodeImagePath())
	imgs, err := devplane.SeedImages(ctx, host, co)
	_ = host.Close()
	if err != nil {
		return err
	}
	a.logf("images in pool: node %s, load balancer %s", imgs.Node.Volume, imgs.LoadBalancer.Volume)
	if co.HostEtcd {
		a.logf("the cluster's etcd runs on this host, port %d, served by the plane", co.HostEtcdPort)
	}
	objs, err := devplane.RenderCluster(co, devplane.ClusterVariables(co, imgs))
	if err != nil {
		return err
	}
	cni, err := devplane.CNIObjects(co)
	if err != nil {
		return err
	}
	if err := devplane.ApplyClusterServerSide(ctx, p.Client, cni, objs); err != nil {
		return fmt.Errorf("%w (the plane's log: %s)", err, filepath.Join(p.StateDir, "serve.log"))
	}
	applied := time.Now()
	a.logf("cluster %s/%s applied from %s: KubeadmControlPlane of %d, MachineDeployment %s of %d, CNI by ClusterResourceSet",
		co.Namespace, co.Name, co.Template, co.ControlPlane, co.MachineDeploymentName(), co.Workers)
	if !wait {
		fmt.Fprintf(a.out, "\nThe cluster is being made; follow it with\n\n  capl-dev status %s%s%s\n", co.Name, namespaceArg(co.Namespace), stateDirArg(p.StateDir))
		return nil
	}
	hint := fmt.Sprintf("`capl-dev status %s%s%s` shows where it stands, `capl-dev logs%s` collects the logs", co.Name, namespaceArg(co.Namespace), stateDirArg(p.StateDir), stateDirArg(p.StateDir))
	status, err := devplane.WaitProvisioned(ctx, p.Client, co.Namespace, co.Name, func(s devplane.DemoStatus) { a.logf("%s", s) })
	if err != nil {
		return fmt.Errorf("%w; %s", err, hint)
	}
	a.logf("infrastructure provisioned %s after apply; endpoint %s", time.Since(applied).Round(time.Second), status.Endpoint)
	if co.StagedWorkers {
		a.logf("TCG: the %d workers (1 vCPU each) are created once the control plane's node is Ready", co.Workers)
		if err := devplane.WaitControlPlaneNode(ctx, p.Client, co.Namespace, co.Name, func(line string) { a.logf("%s", line) }); err != nil {
			return fmt.Errorf("%w; %s", err, hint)
		}
		a.logf("first control-plane node Ready %s after apply; scaling %s to %d", time.Since(applied).Round(time.Second), co.MachineDeploymentName(), co.Workers)
		if err := devplane.ScaleWorkers(ctx, p.Client, co, co.Workers); err != nil {
			return err
		}
	}
	nodes, kubeconfig, err := devplane.WaitNodes(ctx, p.Client, co.Namespace, co.Name, func(line string) { a.logf("%s", line) })
	if err != nil {
		return fmt.Errorf("%w; %s", err, hint)
	}
	a.logf("all %d nodes Ready %s after apply (%s since the command started)", len(nodes.Joined), time.Since(applied).Round(time.Second), time.Since(start).Round(time.Second))
	out := kubeconfigOut
	if out == "" {
		out = plane.WorkloadKubeconfig(p.StateDir, co.Name)
	}
	// Replaced whole, 0600 even when the file was there with another mode.
	if err := replaceFile(out, kubeconfig, -1, -1); err != nil {
		return err
	}
	a.printClusterSteps(ctx, p, co, out, kubectl)
	return nil
}

// stageWorkers decides whether the workers wait for the first
// control-plane node (ClusterOptions.StagedWorkers, TCG's): only for a new
// cluster, and only when this command waits to scale them. A cluster that
// exists has its workers (a MachineDeployment of 0 would scale them away),
// so a second run sets the replicas asked for under TCG as under KVM; and
// without the wait nobody would scale them up.
func stageWorkers(co devplane.ClusterOptions, exists, wait bool) devplane.ClusterOptions {
	if exists || !wait {
		co.StagedWorkers = false
	}
	return co
}

// namespaceArg is the --namespace flag to repeat in a printed command.
func namespaceArg(ns string) string {
	if ns == "" || ns == "default" {
		return ""
	}
	return " --namespace=" + ns
}

// upStandIn makes the stand-in demo: VMs whose cloud-init runs a stand-in
// API server behind the HAProxy endpoint, without Kubernetes.
func (a *app) upStandIn(ctx context.Context, p *plane.Plane, d devplane.DemoOptions, kubectl string, start time.Time) error {
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
	a.logf("stand-in cluster %s/%s applied: %d control-plane machines, MachineDeployment %s-md-0 with %d workers, 1 vCPU / 512 MiB each",
		d.Namespace, d.Name, d.ControlPlane, d.Name, d.Workers)
	status, err := devplane.WaitProvisioned(ctx, p.Client, d.Namespace, d.Name, func(s devplane.DemoStatus) {
		a.logf("%s", s)
	})
	if err != nil {
		return err
	}
	a.logf("stand-in cluster provisioned in %s; waiting for https://%s/readyz (cloud-init starts the stand-in API servers)",
		time.Since(start).Round(time.Second), status.Endpoint)
	host, err := devplane.WaitEndpoint(ctx, status.Endpoint)
	if err != nil {
		return err
	}
	a.logf("control-plane endpoint answers (from %s) after %s", host, time.Since(start).Round(time.Second))
	a.printPlaneSteps(p, kubectl)
	fmt.Fprintf(a.out, `
Control-plane endpoint (HAProxy VM in front of the stand-in API servers):

  curl -k https://%s/readyz
`, status.Endpoint)
	a.printDownStep(p)
	return nil
}

// kubectlOf is the kubectl next to the plane's kube-apiserver, found as
// the plane finds its binaries (assets as --assets names them, "" for
// the default search), which the printed next steps name and run; plain
// kubectl, from PATH, when there is none.
func kubectlOf(assets string) string {
	if dir, err := plane.FindAssets(assets); err == nil {
		return filepath.Join(dir, "kubectl")
	}
	return "kubectl"
}

// nodesTimeout bounds the `kubectl get nodes` of the next steps: the
// nodes are Ready, so the API server answers at once, and a kubectl that
// hangs (an endpoint not reachable from here) must not keep the command,
// whose work is done, from ending.
const nodesTimeout = 30 * time.Second

// printClusterSteps prints the cluster's nodes and the commands to use
// it.
func (a *app) printClusterSteps(ctx context.Context, p *plane.Plane, co devplane.ClusterOptions, kubeconfig, kubectl string) {
	fmt.Fprintf(a.out, "\nWorkload cluster %s/%s (kubeconfig %s):\n\n", co.Namespace, co.Name, kubeconfig)
	ctx, cancel := context.WithTimeout(ctx, nodesTimeout)
	defer cancel()
	// --request-timeout ends kubectl's own retries before the context kills it.
	cmd := exec.CommandContext(ctx, kubectl, "--kubeconfig", kubeconfig, "--request-timeout=20s", "get", "nodes", "-o", "wide")
	cmd.Stdout, cmd.Stderr = a.out, a.err
	if err := cmd.Run(); err != nil {
		fmt.Fprintf(a.out, "(kubectl get nodes: %v)\n", err)
	}
	fmt.Fprintf(a.out, `
  %[1]s --kubeconfig %[2]s get nodes,pods -A -o wide
  capl-dev get kubeconfig %[3]s%[4]s --merge     # a context %[5]s in ~/.kube/config
`, kubectl, kubeconfig, co.Name, namespaceArg(co.Namespace)+stateDirArg(p.StateDir), contextName(co.Namespace, co.Name))
	a.printPlaneSteps(p, kubectl)
	a.printDownStep(p)
}

// printPlaneSteps prints where the plane keeps its state and how to
// reach it with kubectl.
func (a *app) printPlaneSteps(p *plane.Plane, kubectl string) {
	fmt.Fprintf(a.out, `
The management plane runs in the background (state in %[1]s, logs serve.log and manager.log).

  export KUBECONFIG=%[2]s
  %[3]s get clusters,kubeadmcontrolplanes,machinedeployments,machines -A
  capl-dev status%[4]s          # every cluster's objects, conditions and VMs
`, p.StateDir, p.Kubeconfig, kubectl, stateDirArg(p.StateDir))
}

// printDownStep prints how to remove it all.
func (a *app) printDownStep(p *plane.Plane) {
	fmt.Fprintf(a.out, `
Tear it all down (clusters, plane, every VM, volume and network it made):

  make down%s
`, makeStateDirArg(p.StateDir))
}
