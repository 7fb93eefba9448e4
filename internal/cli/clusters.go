package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/duration"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/kubeconfig"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

func (a *app) createCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "create",
		Short: "Create a cluster on the running plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{errors.New("name what to create: capl-dev create cluster NAME")}
		},
	}
	cmd.AddCommand(a.createClusterCommand())
	return cmd
}

func (a *app) createClusterCommand() *cobra.Command {
	var cf clusterFlags
	var wait bool
	var timeout time.Duration
	cmd := &cobra.Command{
		Use:   "cluster NAME",
		Short: "Create (or converge) a kubeadm cluster of VMs on the running plane",
		Long: `Makes a kubeadm cluster from templates/cluster-template.yaml on the running
plane, next to the clusters it has: its own libvirt network and HAProxy VM,
a KubeadmControlPlane of --control-plane and a MachineDeployment of --workers
machines booting the node image. Waits until every node is Ready and writes
the kubeconfig to <state-dir>/NAME.kubeconfig. Run again with other sizes, it
applies the cluster server-side and the replicas follow.`,
		Example: `  capl-dev create cluster web
  capl-dev create cluster big --control-plane=3 --workers=2
  capl-dev create cluster old --kubernetes-version=v1.35.4
  capl-dev create cluster mine --node-image=/srv/images/my-node.qcow2`,
		Args: cobra.ExactArgs(1),
		ValidArgsFunction: func(*cobra.Command, []string, string) ([]string, cobra.ShellCompDirective) {
			return nil, cobra.ShellCompDirectiveNoFileComp
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			cf.name = args[0]
			p, err := a.attach()
			if err != nil {
				return err
			}
			choice, err := cf.choice()
			if err != nil {
				return err
			}
			co, err := cf.clusterOptions(choice)
			if err != nil {
				return err
			}
			if err := a.preflight(ctx, doctorNeeds{cluster: &co, domainType: cf.domainType, cpuMode: cf.cpuMode}); err != nil {
				return err
			}
			// The kubectl of the assets the plane was started with; without
			// a record, where up would look.
			rec, _ := readRecord(a.stateDir)
			a.logf("guests: %s", choice.Reason)
			waitCtx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			return a.makeCluster(waitCtx, p, cf.kubeconfigOut, kubectlOf(rec.Assets), co, wait, time.Now())
		},
	}
	fs := cmd.Flags()
	cf.bind(fs, false)
	_ = fs.MarkHidden("stand-in") // up's; the stand-in cluster is one per plane
	fs.BoolVar(&wait, "wait", true, "wait until every node is Ready")
	fs.DurationVar(&timeout, "timeout", defaultTimeout, "how long to wait for the nodes")
	return cmd
}

func (a *app) deleteCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "delete",
		Short: "Delete a cluster of the plane",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{errors.New("name what to delete: capl-dev delete cluster NAME")}
		},
	}
	var namespace string
	var timeout time.Duration
	var kubeconfigPath string
	del := &cobra.Command{
		Use:   "cluster NAME",
		Short: "Delete a cluster: its machines, VMs, network and load balancer",
		Long: `Deletes the Cluster API Cluster NAME; Cluster API deletes its machines and the
provider their VMs, volumes, network and HAProxy VM. Waits until the Cluster is
gone, then removes its kubeconfig from the state directory and its context
capl-NAME from the file get kubeconfig --merge writes (--kubeconfig, else the
first file of $KUBECONFIG, else ~/.kube/config). Other clusters and the plane
keep running.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			name := args[0]
			p, err := a.attach()
			if err != nil {
				return err
			}
			cl := &clusterv1.Cluster{}
			if err := p.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, cl); err != nil {
				if apierrors.IsNotFound(err) {
					return noSuchCluster(namespace, name)
				}
				return err
			}
			start := time.Now()
			if err := p.Client.Delete(ctx, cl); err != nil && !apierrors.IsNotFound(err) {
				return err
			}
			a.logf("deleting cluster %s/%s", namespace, name)
			waitCtx, cancel := context.WithTimeout(ctx, timeout)
			defer cancel()
			if err := a.waitClusterGone(waitCtx, p.Client, namespace, name); err != nil {
				return fmt.Errorf("%w; `capl-dev status %s%s%s` shows what remains, the provider's log is %s",
					err, name, namespaceArg(namespace), stateDirArg(a.stateDir), filepath.Join(a.stateDir, "manager.log"))
			}
			_ = os.Remove(plane.WorkloadKubeconfig(a.stateDir, name))
			a.logf("cluster %s/%s deleted in %s", namespace, name, time.Since(start).Round(time.Second))
			if err := a.removeContext(kubeconfigPath, contextName(namespace, name)); err != nil {
				return fmt.Errorf("cluster %s/%s is deleted, but %w", namespace, name, err)
			}
			return nil
		},
	}
	del.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the cluster")
	del.Flags().DurationVar(&timeout, "timeout", 10*time.Minute, "how long to wait for the cluster to be gone")
	del.Flags().StringVar(&kubeconfigPath, "kubeconfig", "", "the kubeconfig to remove the cluster's context from; default the first file of $KUBECONFIG, else ~/.kube/config of the invoking user (SUDO_USER under sudo)")
	cmd.AddCommand(del)
	return cmd
}

// removeContext removes the context ctxName from the kubeconfig a merge
// writes (kubeconfigTarget of path) and says so when it was there.
func (a *app) removeContext(path, ctxName string) error {
	target, err := kubeconfigTarget(path)
	if err != nil {
		return fmt.Errorf("its context %s was not removed: %w", ctxName, err)
	}
	removed, err := removeKubeconfigContext(target.path, ctxName)
	if err != nil {
		return fmt.Errorf("its context %s was not removed from %s: %w", ctxName, target.path, err)
	}
	if removed {
		a.logf("removed context %s from %s", ctxName, target.path)
	}
	return nil
}

// noSuchCluster is the error of a cluster the plane does not have.
func noSuchCluster(namespace, name string) error {
	return fmt.Errorf("no cluster %s/%s on the plane (capl-dev get clusters lists them)", namespace, name)
}

// waitClusterGone waits for the Cluster to disappear, printing what of it
// is left whenever that changes.
func (a *app) waitClusterGone(ctx context.Context, c client.Client, namespace, name string) error {
	last := ""
	for {
		err := c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &clusterv1.Cluster{})
		if apierrors.IsNotFound(err) {
			return nil
		}
		line := ""
		if err != nil {
			line = err.Error()
		} else {
			var lms infrav1.LibvirtMachineList
			if err := c.List(ctx, &lms, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: name}); err == nil {
				line = fmt.Sprintf("%d LibvirtMachines left", len(lms.Items))
				if len(lms.Items) == 0 {
					line = "machines gone; the network and load balancer go last"
				}
			}
		}
		if line != last {
			a.logf("%s", line)
			last = line
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("cluster %s/%s not deleted: %w (last: %s)", namespace, name, ctx.Err(), last)
		case <-time.After(2 * time.Second):
		}
	}
}

func (a *app) getCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "get",
		Short: "Get clusters, their nodes, or a cluster's kubeconfig",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			return usageError{errors.New("name what to get: clusters, nodes, or kubeconfig NAME")}
		},
	}
	var clustersOutput outputFormat
	clusters := &cobra.Command{
		Use:     "clusters",
		Aliases: []string{"cluster"},
		Short:   "List the clusters of the plane",
		Long: `Lists the plane's clusters: phase, control-plane and worker machines ready of
those desired, the control-plane endpoint, the Available condition and age;
with -o json or -o yaml the same as {"clusters": [...]}, each with its
creation time instead of its age.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			p, err := a.attach()
			if err != nil {
				return err
			}
			return listClusters(cmd.Context(), p.Client, a.out, clustersOutput)
		},
	}
	addOutputFlag(clusters, &clustersOutput)
	var namespace, kubeconfigPath string
	var merge bool
	kc := &cobra.Command{
		Use:   "kubeconfig NAME",
		Short: "Print a cluster's admin kubeconfig, or --merge it into ~/.kube/config",
		Long: `Prints the admin kubeconfig of cluster NAME (the Secret NAME-kubeconfig that
the control-plane provider wrote). With --merge it is merged into a kubeconfig
file as the context capl-NAME (capl-NAMESPACE-NAME outside the default
namespace), which becomes the current context, as kind does. The file is
--kubeconfig, else the first file of $KUBECONFIG, else ~/.kube/config; under
sudo ~/.kube/config is the invoking user's (SUDO_USER), and a file or ~/.kube
the merge creates is theirs; an existing file keeps its owner. The file is
replaced whole (written beside it and renamed), 0600; a symbolic link in its
place is refused.`,
		Args:              cobra.ExactArgs(1),
		ValidArgsFunction: a.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			name := args[0]
			p, err := a.attach()
			if err != nil {
				return err
			}
			data, err := kubeconfig.FromSecret(ctx, p.Client, client.ObjectKey{Namespace: namespace, Name: name})
			if apierrors.IsNotFound(err) {
				exists := p.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, &clusterv1.Cluster{}) == nil
				if !exists {
					return noSuchCluster(namespace, name)
				}
				return fmt.Errorf("cluster %s/%s has no kubeconfig yet: its control plane is not initialised (capl-dev status %s%s shows where it stands)", namespace, name, name, namespaceArg(namespace))
			}
			if err != nil {
				return err
			}
			if !merge {
				_, err := a.out.Write(data)
				return err
			}
			target, err := kubeconfigTarget(kubeconfigPath)
			if err != nil {
				return err
			}
			ctxName := contextName(namespace, name)
			if err := mergeKubeconfig(target, data, ctxName); err != nil {
				return err
			}
			fmt.Fprintf(a.out, "Merged cluster %s/%s into %s as context %s (now current):\n\n  kubectl --context %s get nodes\n", namespace, name, target.path, ctxName, ctxName)
			return nil
		},
	}
	kc.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of the cluster")
	kc.Flags().BoolVar(&merge, "merge", false, "merge into the kubeconfig file (--kubeconfig) with a context per cluster, instead of printing")
	kc.Flags().StringVar(&kubeconfigPath, "kubeconfig", "", "the file --merge writes; default the first file of $KUBECONFIG, else ~/.kube/config of the invoking user (SUDO_USER under sudo)")
	cmd.AddCommand(clusters, a.getNodesCommand(), kc)
	return cmd
}

// clusterRow is a line of get clusters: what a person reads in the table,
// and what -o json|yaml prints.
type clusterRow struct {
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	Phase     string `json:"phase,omitempty"`
	// ControlPlane and Workers are machines ready of those desired, as
	// Cluster API counts them in the Cluster's status.
	ControlPlane *replicaCount `json:"controlPlane,omitempty"`
	Workers      *replicaCount `json:"workers,omitempty"`
	// Endpoint is the control-plane endpoint, host:port.
	Endpoint string `json:"endpoint,omitempty"`
	// Available is the status of the Cluster's Available condition.
	Available string      `json:"available,omitempty"`
	Created   metav1.Time `json:"created"`
}

// replicaCount is ready of desired machines.
type replicaCount struct {
	Ready   int32 `json:"ready"`
	Desired int32 `json:"desired"`
}

func (r *replicaCount) String() string {
	if r == nil {
		return "-"
	}
	return fmt.Sprintf("%d/%d", r.Ready, r.Desired)
}

// countOf is a replica count of two optional numbers, nil when Cluster API
// reports neither.
func countOf(ready, desired *int32) *replicaCount {
	if ready == nil && desired == nil {
		return nil
	}
	return &replicaCount{Ready: ptr.Deref(ready, 0), Desired: ptr.Deref(desired, 0)}
}

// listClusters prints the plane's clusters as a table, or that there is
// none, or as JSON or YAML ({"clusters": [...]}).
func listClusters(ctx context.Context, c client.Client, out io.Writer, output outputFormat) error {
	var clusters clusterv1.ClusterList
	if err := c.List(ctx, &clusters); err != nil {
		return err
	}
	return printClusters(out, output, clusterRows(clusters.Items), time.Now())
}

// clusterRows are the rows of clusters, by namespace and name.
func clusterRows(clusters []clusterv1.Cluster) []clusterRow {
	rows := []clusterRow{}
	for _, cl := range clusters {
		row := clusterRow{Namespace: cl.Namespace, Name: cl.Name, Phase: cl.Status.Phase, Created: cl.CreationTimestamp}
		if ep := cl.Spec.ControlPlaneEndpoint; ep.Host != "" {
			row.Endpoint = fmt.Sprintf("%s:%d", ep.Host, ep.Port)
		}
		for _, cond := range cl.Status.Conditions {
			if cond.Type == clusterv1.AvailableCondition {
				row.Available = string(cond.Status)
			}
		}
		if s := cl.Status.ControlPlane; s != nil {
			row.ControlPlane = countOf(s.ReadyReplicas, s.DesiredReplicas)
		}
		if s := cl.Status.Workers; s != nil {
			row.Workers = countOf(s.ReadyReplicas, s.DesiredReplicas)
		}
		rows = append(rows, row)
	}
	slices.SortFunc(rows, func(x, y clusterRow) int {
		return strings.Compare(x.Namespace+"/"+x.Name, y.Namespace+"/"+y.Name)
	})
	return rows
}

// printClusters writes rows as the table (ages as of now), or as JSON or
// YAML.
func printClusters(out io.Writer, output outputFormat, rows []clusterRow, now time.Time) error {
	if output != outputText {
		return output.encode(out, struct {
			Clusters []clusterRow `json:"clusters"`
		}{rows})
	}
	if len(rows) == 0 {
		fmt.Fprintln(out, "No clusters found.")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tNAME\tPHASE\tCONTROL PLANE\tWORKERS\tENDPOINT\tAVAILABLE\tAGE")
	for _, r := range rows {
		age := duration.HumanDuration(now.Sub(r.Created.Time))
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Namespace, r.Name, orDash(r.Phase), r.ControlPlane, r.Workers,
			orDash(r.Endpoint), orDash(r.Available), age)
	}
	return tw.Flush()
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}

// completeClusters completes cluster names of the running plane.
func (a *app) completeClusters(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	p, err := plane.Attach(a.stateDir)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var clusters clusterv1.ClusterList
	if err := p.Client.List(cmd.Context(), &clusters); err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var names []string
	for _, cl := range clusters.Items {
		names = append(names, cl.Name)
	}
	return names, cobra.ShellCompDirectiveNoFileComp
}
