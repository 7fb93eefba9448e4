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

	"k8s.io/utils/ptr"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func (a *app) statusCommand() *cobra.Command {
	var namespace string
	var output outputFormat
	cmd := &cobra.Command{
		Use:   "status [NAME]",
		Short: "The plane, and each cluster's Cluster API objects with conditions and VMs",
		Long: `Shows the management plane (its processes, libvirt) and, for cluster NAME or
every cluster, the tree of its Cluster API objects as clusterctl describe
does: Cluster, LibvirtCluster with its HAProxy VM, control plane and
MachineDeployments with their Machines and LibvirtMachines, each with its
conditions (those not True with reason and message), and each VM's state as
libvirt reports it now. With -o json or -o yaml the same as data: "plane"
(without NAME) and "clusters", each condition whole.`,
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
			var report statusReport
			if len(args) == 0 {
				report.Plane = a.planeStatus(p, derr)
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
			report.Clusters = []clusterStatus{}
			for i := range clusters.Items {
				cs, err := readClusterStatus(ctx, p.Client, &clusters.Items[i], vms)
				if err != nil {
					return err
				}
				report.Clusters = append(report.Clusters, cs)
			}
			return printStatus(a.out, output, report)
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of cluster NAME")
	addOutputFlag(cmd, &output)
	return cmd
}

// statusReport is what status shows.
type statusReport struct {
	// Plane is the plane's processes and libvirt; only without NAME.
	Plane    *planeStatus    `json:"plane,omitempty"`
	Clusters []clusterStatus `json:"clusters"`
}

// printStatus writes the report as the plane's line and a tree per
// cluster, or as JSON or YAML.
func printStatus(out io.Writer, output outputFormat, r statusReport) error {
	if output != outputText {
		return output.encode(out, r)
	}
	if r.Plane != nil {
		r.Plane.print(out)
	}
	if len(r.Clusters) == 0 {
		fmt.Fprintln(out, "No clusters found.")
		return nil
	}
	for _, cs := range r.Clusters {
		fmt.Fprintln(out)
		cs.tree().print(out, "", "")
	}
	return nil
}

// planeStatus is the plane's processes, endpoints and libvirt.
type planeStatus struct {
	StateDir  string `json:"stateDir"`
	APIServer string `json:"apiServer"`
	ServePID  int    `json:"servePID"`
	// ManagerPID is the manager's, or ManagerError why there is none.
	ManagerPID   int    `json:"managerPID,omitempty"`
	ManagerError string `json:"managerError,omitempty"`
	// LibvirtURI is the libvirt the plane's VMs are on, LibvirtError why
	// it did not answer.
	LibvirtURI   string `json:"libvirtURI"`
	LibvirtError string `json:"libvirtError,omitempty"`
}

// planeStatus reads the plane's line: processes, endpoints, libvirt.
func (a *app) planeStatus(p *plane.Plane, libvirtErr error) *planeStatus {
	ps := &planeStatus{StateDir: p.StateDir, APIServer: p.Config.Host, ServePID: p.Endpoints.ServePID, LibvirtURI: a.uri()}
	if pid, err := p.ManagerPID(); err == nil {
		ps.ManagerPID = pid
	} else {
		ps.ManagerError = err.Error()
	}
	if libvirtErr != nil {
		ps.LibvirtError = libvirtErr.Error()
	}
	return ps
}

// print writes the plane's line.
func (ps *planeStatus) print(out io.Writer) {
	fmt.Fprintf(out, "Plane %s: running (pid %d), API %s", ps.StateDir, ps.ServePID, ps.APIServer)
	if ps.ManagerError == "" {
		fmt.Fprintf(out, ", manager pid %d", ps.ManagerPID)
	} else {
		fmt.Fprintf(out, ", manager: %s (see %s/manager.log)", ps.ManagerError, ps.StateDir)
	}
	if ps.LibvirtError != "" {
		fmt.Fprintf(out, "\n  libvirt: %s", ps.LibvirtError)
	} else {
		fmt.Fprintf(out, ", libvirt %s", ps.LibvirtURI)
	}
	fmt.Fprintln(out)
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

// clusterStatus is a cluster's objects as status shows them.
type clusterStatus struct {
	Namespace  string             `json:"namespace"`
	Name       string             `json:"name"`
	Phase      string             `json:"phase,omitempty"`
	Endpoint   string             `json:"endpoint,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	Deleting   *metav1.Time       `json:"deletionTimestamp,omitempty"`

	LibvirtCluster     *libvirtClusterStatus     `json:"libvirtCluster,omitempty"`
	ControlPlane       *controlPlaneStatus       `json:"controlPlane,omitempty"`
	MachineDeployments []machineDeploymentStatus `json:"machineDeployments,omitempty"`
	// Machines are those of no control plane or MachineDeployment (the
	// stand-in cluster's control plane, machines made by hand).
	Machines []machineStatus `json:"machines,omitempty"`
}

// libvirtClusterStatus is the cluster's LibvirtCluster, or Error why it
// could not be read.
type libvirtClusterStatus struct {
	Name         string                 `json:"name"`
	Error        string                 `json:"error,omitempty"`
	Provisioned  bool                   `json:"provisioned"`
	Conditions   []metav1.Condition     `json:"conditions,omitempty"`
	Network      *infrav1.NetworkStatus `json:"network,omitempty"`
	LoadBalancer *vmStatus              `json:"loadBalancer,omitempty"`
}

// controlPlaneStatus is the cluster's control plane: its replicas and
// conditions when it is a KubeadmControlPlane.
type controlPlaneStatus struct {
	Kind       string             `json:"kind"`
	Name       string             `json:"name"`
	Error      string             `json:"error,omitempty"`
	Ready      *replicaCount      `json:"ready,omitempty"`
	Version    string             `json:"version,omitempty"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	Machines   []machineStatus    `json:"machines,omitempty"`
}

type machineDeploymentStatus struct {
	Name       string             `json:"name"`
	Ready      *replicaCount      `json:"ready"`
	Conditions []metav1.Condition `json:"conditions,omitempty"`
	Machines   []machineStatus    `json:"machines,omitempty"`
}

// machineStatus is a Machine with its LibvirtMachine (nil: not found yet).
type machineStatus struct {
	Name              string                `json:"name"`
	Phase             string                `json:"phase,omitempty"`
	Node              string                `json:"node,omitempty"`
	Version           string                `json:"version,omitempty"`
	Conditions        []metav1.Condition    `json:"conditions,omitempty"`
	InfrastructureRef string                `json:"infrastructureRef"`
	LibvirtMachine    *libvirtMachineStatus `json:"libvirtMachine,omitempty"`
}

type libvirtMachineStatus struct {
	Name           string             `json:"name"`
	Conditions     []metav1.Condition `json:"conditions,omitempty"`
	FailureReason  string             `json:"failureReason,omitempty"`
	FailureMessage string             `json:"failureMessage,omitempty"`
	VM             *vmStatus          `json:"vm,omitempty"`
}

// vmStatus is a VM: its domain, the state libvirt reports now (or as last
// recorded, and why), its host and addresses.
type vmStatus struct {
	Domain    string   `json:"domain"`
	State     string   `json:"state"`
	UUID      string   `json:"uuid,omitempty"`
	Host      string   `json:"host,omitempty"`
	Addresses []string `json:"addresses,omitempty"`
}

// vmOf is the VM of domain status d, nil without a domain.
func vmOf(d *infrav1.DomainStatus, vms domainStates, addresses ...string) *vmStatus {
	if d == nil || d.Name == "" {
		return nil
	}
	return &vmStatus{Domain: d.Name, State: vms.state(d), UUID: d.UUID, Host: d.Host, Addresses: addresses}
}

// readClusterStatus reads the objects of cluster cl.
func readClusterStatus(ctx context.Context, c client.Client, cl *clusterv1.Cluster, vms domainStates) (clusterStatus, error) {
	cs := clusterStatus{Namespace: cl.Namespace, Name: cl.Name, Phase: cl.Status.Phase, Conditions: cl.Status.Conditions}
	if ep := cl.Spec.ControlPlaneEndpoint; ep.Host != "" {
		cs.Endpoint = fmt.Sprintf("%s:%d", ep.Host, ep.Port)
	}
	if !cl.DeletionTimestamp.IsZero() {
		cs.Deleting = cl.DeletionTimestamp
	}
	ns := client.InNamespace(cl.Namespace)
	inCluster := client.MatchingLabels{clusterv1.ClusterNameLabel: cl.Name}

	if ref := cl.Spec.InfrastructureRef; ref.IsDefined() {
		lcs := &libvirtClusterStatus{Name: ref.Name}
		lc := &infrav1.LibvirtCluster{}
		if err := c.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: ref.Name}, lc); err != nil {
			lcs.Error = err.Error()
		} else {
			lcs.Provisioned = lc.Status.Initialization.IsProvisioned()
			lcs.Conditions = lc.Status.Conditions
			lcs.Network = lc.Status.Network
			if lb := lc.Status.LoadBalancer; lb != nil {
				var addrs []string
				if lb.Address != "" {
					addrs = []string{lb.Address}
				}
				lcs.LoadBalancer = vmOf(lb.Domain, vms, addrs...)
			}
		}
		cs.LibvirtCluster = lcs
	}

	var machines clusterv1.MachineList
	if err := c.List(ctx, &machines, ns, inCluster); err != nil {
		return cs, err
	}
	slices.SortFunc(machines.Items, func(x, y clusterv1.Machine) int { return strings.Compare(x.Name, y.Name) })
	var lms infrav1.LibvirtMachineList
	if err := c.List(ctx, &lms, ns, inCluster); err != nil {
		return cs, err
	}
	libvirtMachines := map[string]*infrav1.LibvirtMachine{}
	for i := range lms.Items {
		libvirtMachines[lms.Items[i].Name] = &lms.Items[i]
	}
	shown := map[string]bool{}
	machinesOf := func(match func(*clusterv1.Machine) bool) []machineStatus {
		var out []machineStatus
		for i := range machines.Items {
			m := &machines.Items[i]
			if shown[m.Name] || !match(m) {
				continue
			}
			shown[m.Name] = true
			out = append(out, readMachineStatus(m, libvirtMachines[m.Spec.InfrastructureRef.Name], vms))
		}
		return out
	}

	if ref := cl.Spec.ControlPlaneRef; ref.IsDefined() {
		cps := &controlPlaneStatus{Kind: ref.Kind, Name: ref.Name}
		if ref.Kind == "KubeadmControlPlane" {
			kcp := &controlplanev1.KubeadmControlPlane{}
			if err := c.Get(ctx, client.ObjectKey{Namespace: cl.Namespace, Name: ref.Name}, kcp); err != nil {
				cps.Error = err.Error()
			} else {
				cps.Ready = &replicaCount{Ready: ptr.Deref(kcp.Status.ReadyReplicas, 0), Desired: ptr.Deref(kcp.Spec.Replicas, 0)}
				cps.Version = kcp.Spec.Version
				cps.Conditions = kcp.Status.Conditions
			}
		}
		cps.Machines = machinesOf(func(m *clusterv1.Machine) bool { _, ok := m.Labels[clusterv1.MachineControlPlaneLabel]; return ok })
		cs.ControlPlane = cps
	}
	var mds clusterv1.MachineDeploymentList
	if err := c.List(ctx, &mds, ns, inCluster); err != nil {
		return cs, err
	}
	for _, md := range mds.Items {
		cs.MachineDeployments = append(cs.MachineDeployments, machineDeploymentStatus{
			Name:       md.Name,
			Ready:      &replicaCount{Ready: ptr.Deref(md.Status.ReadyReplicas, 0), Desired: ptr.Deref(md.Spec.Replicas, 0)},
			Conditions: md.Status.Conditions,
			Machines:   machinesOf(func(m *clusterv1.Machine) bool { return m.Labels[clusterv1.MachineDeploymentNameLabel] == md.Name }),
		})
	}
	cs.Machines = machinesOf(func(*clusterv1.Machine) bool { return true })
	return cs, nil
}

// readMachineStatus is a Machine with its LibvirtMachine and VM.
func readMachineStatus(m *clusterv1.Machine, lm *infrav1.LibvirtMachine, vms domainStates) machineStatus {
	ms := machineStatus{Name: m.Name, Phase: m.Status.Phase, Version: m.Spec.Version, Conditions: m.Status.Conditions,
		InfrastructureRef: m.Spec.InfrastructureRef.Name}
	if m.Status.NodeRef.IsDefined() {
		ms.Node = m.Status.NodeRef.Name
	}
	if lm == nil {
		return ms
	}
	lms := &libvirtMachineStatus{Name: lm.Name, Conditions: lm.Status.Conditions,
		FailureReason: ptr.Deref(lm.Status.FailureReason, ""), FailureMessage: ptr.Deref(lm.Status.FailureMessage, "")}
	var addrs []string
	for _, a := range lm.Status.Addresses {
		addrs = append(addrs, a.Address)
	}
	lms.VM = vmOf(lm.Status.Domain, vms, addrs...)
	ms.LibvirtMachine = lms
	return ms
}

// tree is the cluster as status prints it, as clusterctl describe draws it.
func (cs clusterStatus) tree() *node {
	root := &node{text: fmt.Sprintf("Cluster %s/%s  %s", cs.Namespace, cs.Name, orDash(cs.Phase))}
	if cs.Endpoint != "" {
		root.text += "  endpoint " + cs.Endpoint
	}
	root.details = append(root.details, conditionsLine(cs.Conditions))
	if cs.Deleting != nil {
		root.details = append(root.details, "deleting since "+cs.Deleting.Format("15:04:05"))
	}
	if lc := cs.LibvirtCluster; lc != nil {
		if lc.Error != "" {
			root.add(&node{text: "LibvirtCluster " + lc.Name, details: []string{lc.Error}})
		} else {
			n := root.add(&node{text: fmt.Sprintf("LibvirtCluster %s  provisioned=%t", lc.Name, lc.Provisioned)})
			n.details = append(n.details, conditionsLine(lc.Conditions))
			if net := lc.Network; net != nil {
				n.details = append(n.details, fmt.Sprintf("network %s (bridge %s, %s)", orDash(net.Name), orDash(net.Bridge), orDash(net.CIDR)))
			}
			if vm := lc.LoadBalancer; vm != nil {
				n.details = append(n.details, fmt.Sprintf("VM %s: %s, address %s", vm.Domain, vm.State, orDash(strings.Join(vm.Addresses, " "))))
			}
		}
	}
	if cp := cs.ControlPlane; cp != nil {
		n := root.add(&node{text: cp.Kind + " " + cp.Name})
		switch {
		case cp.Error != "":
			n.details = append(n.details, cp.Error)
		case cp.Ready != nil:
			n.text += fmt.Sprintf("  %s ready, version %s", cp.Ready, cp.Version)
			n.details = append(n.details, conditionsLine(cp.Conditions))
		}
		for _, m := range cp.Machines {
			n.add(m.node())
		}
	}
	for _, md := range cs.MachineDeployments {
		n := root.add(&node{text: fmt.Sprintf("MachineDeployment %s  %s ready", md.Name, md.Ready)})
		n.details = append(n.details, conditionsLine(md.Conditions))
		for _, m := range md.Machines {
			n.add(m.node())
		}
	}
	if len(cs.Machines) > 0 {
		rest := root.add(&node{text: "Machines"})
		for _, m := range cs.Machines {
			rest.add(m.node())
		}
	}
	return root
}

// node is the machine's node of the tree.
func (ms machineStatus) node() *node {
	n := &node{text: fmt.Sprintf("Machine %s  %s", ms.Name, orDash(ms.Phase))}
	if ms.Node != "" {
		n.text += "  node " + ms.Node
	}
	if ms.Version != "" {
		n.text += "  " + ms.Version
	}
	n.details = append(n.details, conditionsLine(ms.Conditions))
	lm := ms.LibvirtMachine
	if lm == nil {
		n.details = append(n.details, "LibvirtMachine "+ms.InfrastructureRef+": not found yet")
		return n
	}
	n.details = append(n.details, "LibvirtMachine "+lm.Name+" "+conditionsLine(lm.Conditions))
	if lm.FailureReason != "" {
		msg := ""
		if lm.FailureMessage != "" {
			msg = ": " + oneLine(lm.FailureMessage)
		}
		n.details = append(n.details, "failed: "+lm.FailureReason+msg)
	}
	if vm := lm.VM; vm != nil {
		n.details = append(n.details, fmt.Sprintf("VM %s: %s, UUID %s, address %s", vm.Domain, vm.State, orDash(vm.UUID), orDash(strings.Join(vm.Addresses, " "))))
	}
	return n
}
