package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func (a *app) statusCommand() *cobra.Command {
	var namespace string
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "The plane, and each cluster's Cluster API objects with conditions and VMs",
		Long: `Shows the management plane (its processes, libvirt) and, for cluster NAME or
every cluster, the tree of its Cluster API objects as clusterctl describe
does: Cluster, LibvirtCluster with its HAProxy VM, control plane and
MachineDeployments with their Machines and LibvirtMachines, each with its
conditions (those not True with reason and message), and each VM's state as
libvirt reports it now.`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: a.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			p, err := a.attach()
			if err != nil {
				return err
			}
			var vms domainStates
			host, derr := a.dial(ctx)
			if derr == nil {
				defer host.Close()
				vms = liveStates{ctx: ctx, host: host}
			} else {
				vms = recordedStates{err: derr}
			}
			if len(args) == 0 {
				a.printPlane(p, derr)
			}
			var clusters clusterv1.ClusterList
			if len(args) == 1 {
				cl := clusterv1.Cluster{}
				if err := p.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: args[0]}, &cl); err != nil {
					if apierrors.IsNotFound(err) {
						return noSuchCluster(namespace, args[0])
					}
					return err
				}
				clusters.Items = []clusterv1.Cluster{cl}
			} else if err := p.Client.List(ctx, &clusters); err != nil {
				return err
			}
			if len(clusters.Items) == 0 {
				fmt.Fprintln(a.out, "No clusters found.")
				return nil
			}
			for i := range clusters.Items {
				t, err := clusterTree(ctx, p.Client, &clusters.Items[i], vms)
				if err != nil {
					return err
				}
				fmt.Fprintln(a.out)
				t.print(a.out, "", "")
			}
			return nil
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of cluster NAME")
	return cmd
}

// printPlane prints the plane's line: processes, endpoints, libvirt.
func (a *app) printPlane(p *plane.Plane, libvirtErr error) {
	fmt.Fprintf(a.out, "Plane %s: running (pid %d), API %s", p.StateDir, p.Endpoints.ServePID, p.Config.Host)
	if pid, err := p.ManagerPID(); err == nil {
		fmt.Fprintf(a.out, ", manager pid %d", pid)
	} else {
		fmt.Fprintf(a.out, ", manager: %v (see %s/manager.log)", err, p.StateDir)
	}
	if libvirtErr != nil {
		fmt.Fprintf(a.out, "\n  libvirt: %v", libvirtErr)
	} else {
		fmt.Fprintf(a.out, ", libvirt %s", a.uri())
	}
	fmt.Fprintln(a.out)
}

// domainStates tells a VM's state.
type domainStates interface {
	state(d *infrav1.DomainStatus) string
}

// liveStates asks libvirt.
type liveStates struct {
	ctx  context.Context
	host *virt.Client
}

func (l liveStates) state(d *infrav1.DomainStatus) string {
	info, err := l.host.DomainInfo(l.ctx, d.Name)
	if virt.IsNotFound(err) {
		return "missing in libvirt"
	}
	if err != nil {
		return "libvirt: " + err.Error()
	}
	s := info.State
	if info.Reason != "" {
		s += " (" + info.Reason + ")"
	}
	if info.UUID != d.UUID && d.UUID != "" {
		s += ", UUID " + info.UUID + " differs from the recorded " + d.UUID
	}
	return s
}

// recordedStates is the state the provider last recorded, when libvirt
// cannot be asked.
type recordedStates struct{ err error }

func (r recordedStates) state(d *infrav1.DomainStatus) string {
	return fmt.Sprintf("%s as last recorded (libvirt not asked: %v)", orDash(d.State), errors.Unwrap(r.err))
}

// node is one object of the tree with its detail lines.
type node struct {
	text     string
	details  []string
	children []*node
}

func (n *node) add(c *node) *node { n.children = append(n.children, c); return c }

// print writes the tree: first is the prefix of the node's own line,
// rest that of the lines below it.
func (n *node) print(w io.Writer, first, rest string) {
	fmt.Fprintln(w, first+n.text)
	bar := rest
	if len(n.children) > 0 {
		bar = rest + "│ "
	} else {
		bar = rest + "  "
	}
	for _, d := range n.details {
		fmt.Fprintln(w, bar+"  "+d)
	}
	for i, c := range n.children {
		if i == len(n.children)-1 {
			c.print(w, rest+"└─", rest+"  ")
		} else {
			c.print(w, rest+"├─", rest+"│ ")
		}
	}
}

// conditionsLine sums up conditions: those True by type, the others
// with status, reason and message.
func conditionsLine(conds []metav1.Condition) string {
	if len(conds) == 0 {
		return "conditions: none yet"
	}
	var ok, not []string
	for _, c := range conds {
		if c.Status == metav1.ConditionTrue {
			ok = append(ok, c.Type)
			continue
		}
		s := fmt.Sprintf("%s=%s %s", c.Type, c.Status, c.Reason)
		if m := strings.TrimSpace(c.Message); m != "" {
			s += ": " + oneLine(m)
		}
		not = append(not, s)
	}
	line := "conditions:"
	if len(ok) > 0 {
		line += " " + strings.Join(ok, ", ") + " True"
	}
	for _, s := range not {
		line += "; " + s
	}
	return line
}

// oneLine folds a multi-line message and bounds it.
func oneLine(s string) string {
	s = strings.Join(strings.Fields(s), " ")
	if len(s) > 300 {
		s = s[:297] + "..."
	}
	return s
}

// clusterTree reads the objects of cluster cl into a tree.
func clusterTree(ctx context.Context, c client.Client, cl *clusterv1.Cluster, vms domainStates) (*node, error) {
	root := &node{text: fmt.Sprintf("Cluster %s/%s  %s", cl.Namespace, cl.Name, orDash(cl.Status.Phase))}
	if ep := cl.Spec.ControlPlaneEndpoint; ep.Host != "" {
		root.text += fmt.Sprintf("  endpoint %s:%d", ep.Host, ep.Port)
	}
	root.details = append(root.details, conditionsLine(cl.Status.Conditions))
	if !cl.DeletionTimestamp.IsZero() {
		root.details = append(root.details, "deleting since "+cl.DeletionTimestamp.Format("15:04:05"))
	}
	ns := client.InNamespace(cl.Namespace)
	inCluster := client.MatchingLabels{clusterv1.ClusterNameLabel: cl.Name}

	if ref := cl.Spec.InfrastructureRef; ref.IsDefined() {
		lc := &infrav1.LibvirtCluster{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: ref.Name}, lc); err != nil {
			root.add(&node{text: "LibvirtCluster " + ref.Name, details: []string{err.Error()}})
		} else {
			n := root.add(&node{text: fmt.Sprintf("LibvirtCluster %s  provisioned=%t", lc.Name, lc.Status.Initialization.IsProvisioned())})
			n.details = append(n.details, conditionsLine(lc.Status.Conditions))
			if net := lc.Status.Network; net != nil {
				n.details = append(n.details, fmt.Sprintf("network %s (bridge %s, %s)", orDash(net.Name), orDash(net.Bridge), orDash(net.CIDR)))
			}
			if lb := lc.Status.LoadBalancer; lb != nil && lb.Domain != nil && lb.Domain.Name != "" {
				n.details = append(n.details, fmt.Sprintf("VM %s: %s, address %s", lb.Domain.Name, vms.state(lb.Domain), orDash(lb.Address)))
			}
		}
	}

	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, ns, inCluster); err != nil {
		return nil, err
	}
	slices.SortFunc(machines.Items, func(x, y clusterv1.Machine) int { return strings.Compare(x.Name, y.Name) })
	var lms infrav1.LibvirtMachineList
	if err := c.List(ctx, &lms, ns, inCluster); err != nil {
		return nil, err
	}
	libvirtMachines := map[string]*infrav1.LibvirtMachine{}
	for i := range lms.Items {
		libvirtMachines[lms.Items[i].Name] = &lms.Items[i]
	}
	shown := map[string]bool{}
	addMachines := func(parent *node, match func(*clusterv1.Machine) bool) {
		for i := range machines.Items {
			m := &machines.Items[i]
			if shown[m.Name] || !match(m) {
				continue
			}
			shown[m.Name] = true
			parent.add(machineNode(m, libvirtMachines[m.Spec.InfrastructureRef.Name], vms))
		}
	}

	if ref := cl.Spec.ControlPlaneRef; ref.IsDefined() {
		n := root.add(&node{text: ref.Kind + " " + ref.Name})
		if ref.Kind == "KubeadmControlPlane" {
			kcp := &controlplanev1.KubeadmControlPlane{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: ref.Name}, kcp); err != nil {
				n.details = append(n.details, err.Error())
			} else {
				n.text += fmt.Sprintf("  %s ready, version %s", readyOf(kcp.Status.ReadyReplicas, kcp.Spec.Replicas), kcp.Spec.Version)
				n.details = append(n.details, conditionsLine(kcp.Status.Conditions))
			}
		}
		addMachines(n, func(m *clusterv1.Machine) bool { _, ok := m.Labels[clusterv1.MachineControlPlaneLabel]; return ok })
	}
	var mds clusterv1.MachineDeploymentList
	if err := c.List(ctx, &mds, ns, inCluster); err != nil {
		return nil, err
	}
	for _, md := range mds.Items {
		n := root.add(&node{text: fmt.Sprintf("MachineDeployment %s  %s ready", md.Name, readyOf(md.Status.ReadyReplicas, md.Spec.Replicas))})
		n.details = append(n.details, conditionsLine(md.Status.Conditions))
		addMachines(n, func(m *clusterv1.Machine) bool { return m.Labels[clusterv1.MachineDeploymentNameLabel] == md.Name })
	}
	// Machines of no control plane or MachineDeployment (the stand-in
	// cluster's control plane, machines made by hand).
	rest := &node{text: "Machines"}
	addMachines(rest, func(*clusterv1.Machine) bool { return true })
	if len(rest.children) > 0 {
		root.add(rest)
	}
	return root, nil
}

// machineNode is a Machine with its LibvirtMachine and VM.
func machineNode(m *clusterv1.Machine, lm *infrav1.LibvirtMachine, vms domainStates) *node {
	n := &node{text: fmt.Sprintf("Machine %s  %s", m.Name, orDash(m.Status.Phase))}
	if m.Status.NodeRef.IsDefined() {
		n.text += "  node " + m.Status.NodeRef.Name
	}
	if m.Spec.Version != "" {
		n.text += "  " + m.Spec.Version
	}
	n.details = append(n.details, conditionsLine(m.Status.Conditions))
	if lm == nil {
		n.details = append(n.details, "LibvirtMachine "+m.Spec.InfrastructureRef.Name+": not found yet")
		return n
	}
	n.details = append(n.details, "LibvirtMachine "+lm.Name+" "+conditionsLine(lm.Status.Conditions))
	if lm.Status.FailureReason != nil {
		msg := ""
		if lm.Status.FailureMessage != nil {
			msg = ": " + oneLine(*lm.Status.FailureMessage)
		}
		n.details = append(n.details, "failed: "+*lm.Status.FailureReason+msg)
	}
	if d := lm.Status.Domain; d != nil && d.Name != "" {
		var addrs []string
		for _, a := range lm.Status.Addresses {
			addrs = append(addrs, a.Address)
		}
		n.details = append(n.details, fmt.Sprintf("VM %s: %s, UUID %s, address %s", d.Name, vms.state(d), orDash(d.UUID), orDash(strings.Join(addrs, " "))))
	}
	return n
}
