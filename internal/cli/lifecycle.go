package cli

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/spf13/cobra"
	"k8s.io/klog/v2"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func (a *app) downCommand() *cobra.Command {
	var all bool
	cmd := &cobra.Command{
		Use:   "down",
		Short: "Delete the clusters, stop the plane, remove its VMs, volumes and networks",
		Long: `Deletes every Cluster API Cluster of the plane and waits for the provider to
remove their VMs (up to 10 minutes), stops the plane, sweeps libvirt for what is
left of the plane's namespaces and removes the state directory. It also works
when the plane is not running. make down runs it.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o := plane.Options{StateDir: a.stateDir, LibvirtURI: a.uri(), Log: a.logf, SweepAll: all}
			start := time.Now()
			rep, err := plane.Down(cmd.Context(), o)
			for _, l := range []struct {
				what  string
				names []string
			}{{"domains", rep.Domains}, {"volumes", rep.Volumes}, {"networks", rep.Networks}, {"storage pools", rep.Pools}} {
				if len(l.names) > 0 {
					a.logf("removed %s: %s", l.what, strings.Join(l.names, ", "))
				}
			}
			for _, k := range rep.Kept {
				a.logf("kept %s", k)
			}
			if rep.Empty() && err == nil {
				a.logf("no libvirt object of the plane was left to remove")
			}
			if err != nil {
				return err
			}
			a.logf("down in %s; %s removed", time.Since(start).Round(time.Second), o.StateDir)
			return nil
		},
	}
	cmd.Flags().BoolVar(&all, "all", false, "remove every provider-owned domain, network and volume on the host, not only the plane's")
	return cmd
}

func (a *app) serveCommand() *cobra.Command {
	var o plane.Options
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the plane in the foreground (what up and start run in the background)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			o.StateDir, o.LibvirtURI = a.stateDir, a.uri()
			// controller-runtime logs of the in-process Cluster API
			// controllers go to serve.log.
			ctrl.SetLogger(klog.Background())
			return plane.Serve(cmd.Context(), o)
		},
	}
	managerFlags(cmd.Flags(), &o)
	imageDirFlag(cmd.Flags(), &o)
	return cmd
}

// vmShutdownTimeout is how long a guest gets to power off before stop
// destroys it; a TCG control plane flushing etcd and stopping its
// containers takes a minute or more.
const vmShutdownTimeout = 3 * time.Minute

func (a *app) stopCommand() *cobra.Command {
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "stop",
		Short: "Stop the plane and shut down every VM of its clusters; start brings them back",
		Long: `Stops the management plane (its etcd data and keys stay), then asks every VM of
its clusters to power off, all at once (each destroyed after
--shutdown-timeout). Nothing is deleted: capl-dev start starts the same VMs
(same domains, UUIDs, MACs and addresses) and the plane. A stop that did not
finish (libvirtd did not answer, a VM did not power off) can be run again: it
shuts down the VMs still running.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			p, err := a.attach()
			if errors.Is(err, plane.ErrNotRunning) {
				if rec, rerr := readRecord(a.stateDir); rerr == nil && len(rec.Stopped) > 0 {
					return a.finishStop(ctx, rec.Stopped, timeout)
				}
			}
			if err != nil {
				return err
			}
			domains, err := planeDomains(ctx, p.Client)
			if err != nil {
				return err
			}
			if len(domains) == 0 {
				a.logf("stopping the management plane")
				if err := p.Stop(ctx); err != nil {
					return err
				}
				a.logf("stopped the plane; its clusters have no VM")
				return nil
			}
			// libvirt before anything stops: a libvirtd that does not
			// answer leaves the plane and its VMs running as they were.
			host, err := a.dial(ctx)
			if err != nil {
				return err
			}
			defer host.Close()
			// Recorded first: once the plane is stopped, nothing else
			// knows which VMs are its clusters', and start and a second
			// stop read them from here.
			if err := updateRecord(a.stateDir, func(r *record) { r.Stopped = domains }); err != nil {
				return err
			}
			// The plane before the VMs: its manager starts a provisioned
			// domain that stops.
			a.logf("stopping the management plane")
			if err := p.Stop(ctx); err != nil {
				return err
			}
			return a.shutdownVMs(ctx, host, domains, timeout)
		},
	}
	cmd.Flags().DurationVar(&timeout, "shutdown-timeout", vmShutdownTimeout, "how long each guest gets to power off before it is destroyed")
	return cmd
}

// finishStop is stop once the plane is stopped: the VMs an earlier stop
// recorded are shut down if libvirt says any still runs (that stop did not
// reach libvirtd, or a VM did not power off), else they are already
// stopped.
func (a *app) finishStop(ctx context.Context, domains []string, timeout time.Duration) error {
	host, err := a.dial(ctx)
	if err != nil {
		return fmt.Errorf("the plane is stopped, its VMs not known to be: %w", err)
	}
	defer host.Close()
	running, err := notShutOff(ctx, host, domains)
	if err != nil {
		return err
	}
	if len(running) == 0 {
		a.logf("already stopped: the plane and %d VMs (capl-dev start%s starts them)", len(domains), stateDirArg(a.stateDir))
		return nil
	}
	a.logf("the plane is stopped; %d of its %d VMs still run", len(running), len(domains))
	return a.shutdownVMs(ctx, host, running, timeout)
}

// notShutOff are the domains libvirt does not report shut off; a domain
// that no longer exists has nothing to stop.
func notShutOff(ctx context.Context, host *virt.Client, domains []string) ([]string, error) {
	var running []string
	for _, d := range domains {
		info, err := host.DomainInfo(ctx, d)
		switch {
		case virt.IsNotFound(err):
			// Deleted since the stop: nothing to shut down.
		case err != nil:
			return nil, fmt.Errorf("state of %s: %w", d, err)
		case info.State != "shutoff":
			running = append(running, d)
		}
	}
	return running, nil
}

// shutdownVMs shuts the domains down, all at once as a host's shutdown
// does: a guest does not need another to power off, and one tier after
// the other would take the sum of their shutdowns.
func (a *app) shutdownVMs(ctx context.Context, host *virt.Client, domains []string, timeout time.Duration) error {
	a.logf("shutting down %d VMs: %s", len(domains), strings.Join(domains, ", "))
	if err := shutdownAll(ctx, host, domains, timeout, a.logf); err != nil {
		return fmt.Errorf("%w; `capl-dev stop%s` again shuts down those still running", err, stateDirArg(a.stateDir))
	}
	a.logf("stopped: the plane and its clusters' VMs; `capl-dev start%s` brings them back", stateDirArg(a.stateDir))
	return nil
}

// shutdownAll shuts the domains down in parallel.
func shutdownAll(ctx context.Context, host *virt.Client, domains []string, timeout time.Duration, logf func(string, ...any)) error {
	var wg sync.WaitGroup
	errs := make([]error, len(domains))
	for i, d := range domains {
		wg.Add(1)
		go func() {
			defer wg.Done()
			start := time.Now()
			if err := host.ShutdownDomain(ctx, d, timeout); err != nil {
				errs[i] = fmt.Errorf("shutting down %s: %w", d, err)
				return
			}
			logf("%s shut off after %s", d, time.Since(start).Round(time.Second))
		}()
	}
	wg.Wait()
	return errors.Join(errs...)
}

// planeDomains lists the domains of the plane's clusters in start order:
// load balancers, control-plane machines, workers.
func planeDomains(ctx context.Context, c client.Client) ([]string, error) {
	var lcs infrav1.LibvirtClusterList
	if err := c.List(ctx, &lcs); err != nil {
		return nil, err
	}
	var lbs, cps, workers []string
	for _, lc := range lcs.Items {
		if lb := lc.Status.LoadBalancer; lb != nil && lb.Domain != nil && lb.Domain.Name != "" {
			lbs = append(lbs, lb.Domain.Name)
		}
	}
	var lms infrav1.LibvirtMachineList
	if err := c.List(ctx, &lms); err != nil {
		return nil, err
	}
	for _, lm := range lms.Items {
		if lm.Status.Domain == nil || lm.Status.Domain.Name == "" {
			continue
		}
		if _, ok := lm.Labels[clusterv1.MachineControlPlaneLabel]; ok {
			cps = append(cps, lm.Status.Domain.Name)
		} else {
			workers = append(workers, lm.Status.Domain.Name)
		}
	}
	for _, l := range [][]string{lbs, cps, workers} {
		slices.Sort(l)
	}
	return slices.Concat(lbs, cps, workers), nil
}

func (a *app) startCommand() *cobra.Command {
	var o plane.Options
	var restart, wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "start",
		Short: "Start the VMs stop shut down and the plane; --restart restarts a running plane",
		Long: `Starts the VMs capl-dev stop shut down (load balancers, control planes, then
workers) and the management plane, with the binaries and flags it was started
with (recorded in the state directory; flags given here replace them), and,
when it started VMs, waits until every cluster's nodes are Ready again. With --restart a running
plane is stopped and started (a new build of capl-dev or the manager takes
over; the VMs keep running).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx := cmd.Context()
			rec, err := readRecord(a.stateDir)
			if err != nil && !errors.Is(err, os.ErrNotExist) {
				return err
			}
			fs := cmd.Flags()
			o.StateDir, o.LibvirtURI, o.Log = a.stateDir, a.uri(), a.logf
			if !fs.Changed("manager") {
				o.ManagerBinary = rec.ManagerBinary
			}
			if !fs.Changed("assets") {
				o.Assets = rec.Assets
			}
			if !fs.Changed("manager-arg") {
				o.ManagerArgs = rec.ManagerArgs
			}
			if !fs.Changed("image-dir") && rec.ImageDir != "" {
				o.ImageDir = rec.ImageDir
			}
			if p, err := plane.Attach(a.stateDir); err == nil {
				if !restart {
					a.logf("the management plane runs already (pid %d)", p.Endpoints.ServePID)
				} else {
					a.logf("restarting the management plane (pid %d); the VMs keep running", p.Endpoints.ServePID)
					if err := p.Stop(ctx); err != nil {
						return err
					}
				}
			}
			started := 0
			if len(rec.Stopped) > 0 {
				host, err := a.dial(ctx)
				if err != nil {
					return err
				}
				for _, d := range rec.Stopped {
					err := host.StartDomain(ctx, d)
					switch {
					case virt.IsNotFound(err):
						// Its machine was deleted while the plane ran
						// before the stop; nothing to start.
						a.logf("%s no longer exists; not started", d)
					case err != nil:
						_ = host.Close()
						return fmt.Errorf("starting %s: %w", d, err)
					default:
						a.logf("started %s", d)
						started++
					}
				}
				_ = host.Close()
			}
			start := time.Now()
			self, err := os.Executable()
			if err != nil {
				return err
			}
			p, err := plane.Start(ctx, o, self)
			if err != nil {
				return err
			}
			if err := recordPlane(o); err != nil {
				return err
			}
			if err := updateRecord(a.stateDir, func(r *record) { r.Stopped = nil }); err != nil {
				return err
			}
			a.logf("management plane ready in %s: API %s", time.Since(start).Round(time.Second), p.Config.Host)
			// Only VMs that were down have nodes to wait for; a restart of
			// the plane leaves the VMs running.
			if !wait || started == 0 {
				return nil
			}
			waitCtx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return a.waitClusters(waitCtx, p)
		},
	}
	fs := cmd.Flags()
	managerFlags(fs, &o)
	imageDirFlag(fs, &o)
	fs.BoolVar(&restart, "restart", false, "stop and start a running plane (its VMs keep running)")
	fs.BoolVar(&wait, "wait", true, "wait until every cluster's nodes are Ready, when VMs were started")
	fs.DurationVar(&timeout, "timeout", defaultTimeout, "how long to wait for the nodes")
	return cmd
}

// waitClusters waits until the nodes of every Kubernetes cluster of the
// plane are Ready (the stand-in cluster has none to wait for).
func (a *app) waitClusters(ctx context.Context, p *plane.Plane) error {
	var clusters clusterv1.ClusterList
	if err := p.Client.List(ctx, &clusters); err != nil {
		return err
	}
	for _, cl := range clusters.Items {
		if !cl.Spec.ControlPlaneRef.IsDefined() {
			continue
		}
		start := time.Now()
		nodes, _, err := devplane.WaitNodes(ctx, p.Client, cl.Namespace, cl.Name, func(line string) { a.logf("%s/%s: %s", cl.Namespace, cl.Name, line) })
		if err != nil {
			return fmt.Errorf("%w; `capl-dev status %s%s%s` shows where it stands", err, cl.Name, namespaceArg(cl.Namespace), stateDirArg(a.stateDir))
		}
		a.logf("cluster %s/%s: %d nodes Ready after %s", cl.Namespace, cl.Name, len(nodes.Joined), time.Since(start).Round(time.Second))
	}
	return nil
}
