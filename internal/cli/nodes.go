package cli

import (
	"fmt"
	"io"
	"strings"
	"text/tabwriter"

	"github.com/spf13/cobra"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

func (a *app) getNodesCommand() *cobra.Command {
	var namespace string
	var output outputFormat
	cmd := &cobra.Command{
		Use:     "nodes [CLUSTER]",
		Aliases: []string{"node"},
		Short:   "List the VMs of a cluster (of every cluster without CLUSTER): domain, state, host, address, node",
		Long: `Lists every VM of cluster CLUSTER, or of every cluster of the plane: its
machines' VMs (control plane and workers) and the HAProxy VM, each with its
libvirt domain, its state as libvirt reports it now (as last recorded when
libvirt does not answer), the libvirt host it runs on, its addresses and the
Kubernetes node it became. It reads the LibvirtMachines, Machines and
LibvirtClusters of the plane and asks libvirt, as status does. With -o json
or -o yaml the same as {"nodes": [...]}.`,
		Example: `  capl-dev get nodes demo
  capl-dev get nodes -o json`,
		Args:              cobra.MaximumNArgs(1),
		ValidArgsFunction: a.completeClusters,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := cmd.Context()
			p, err := a.attach()
			if err != nil {
				return err
			}
			// Every namespace unless a cluster or -n is given.
			ns, cluster := "", ""
			if cmd.Flags().Changed("namespace") {
				ns = namespace
			}
			if len(args) == 1 {
				ns, cluster = namespace, args[0]
				if err := p.Client.Get(ctx, client.ObjectKey{Namespace: ns, Name: cluster}, &clusterv1.Cluster{}); err != nil {
					if apierrors.IsNotFound(err) {
						return noSuchCluster(ns, cluster)
					}
					return err
				}
			}
			vms, err := planeVMs(ctx, p.Client, ns, cluster)
			if err != nil {
				return err
			}
			var states domainStates
			if host, err := a.dial(ctx); err == nil {
				defer host.Close()
				states = liveStates{ctx: ctx, host: host}
			} else {
				states = recordedStates{err: err}
			}
			return printNodes(a.out, output, nodeRows(vms, states))
		},
	}
	cmd.Flags().StringVarP(&namespace, "namespace", "n", "default", "namespace of CLUSTER; without CLUSTER, every namespace unless given")
	addOutputFlag(cmd, &output)
	return cmd
}

// nodeRow is a VM as get nodes shows it.
type nodeRow struct {
	Namespace string `json:"namespace"`
	Cluster   string `json:"cluster"`
	// Role is control-plane, worker or load-balancer (the HAProxy VM).
	Role    string `json:"role"`
	Domain  string `json:"domain"`
	State   string `json:"state"`
	Host    string `json:"host,omitempty"`
	UUID    string `json:"uuid,omitempty"`
	Machine string `json:"machine,omitempty"`
	Node    string `json:"node,omitempty"`
	// Addresses are the VM's, as the provider recorded them.
	Addresses []string `json:"addresses,omitempty"`
}

// nodeRows are the rows of vms (as planeVMs orders them, by domain), each
// VM's state from states.
func nodeRows(vms []guestVM, states domainStates) []nodeRow {
	rows := []nodeRow{}
	for _, v := range vms {
		r := nodeRow{Namespace: v.Namespace, Cluster: v.Cluster, Role: "worker", Domain: v.Domain,
			Machine: v.Machine, Node: v.Node, Addresses: v.Addresses}
		switch {
		case v.LoadBalancer:
			r.Role = "load-balancer"
		case v.ControlPlane:
			r.Role = "control-plane"
		}
		if d := v.DomainStatus; d != nil {
			r.State, r.Host, r.UUID = states.state(d), d.Host, d.UUID
		}
		rows = append(rows, r)
	}
	return rows
}

// printNodes writes rows as a table, or as JSON or YAML.
func printNodes(out io.Writer, output outputFormat, rows []nodeRow) error {
	if output != outputText {
		return output.encode(out, struct {
			Nodes []nodeRow `json:"nodes"`
		}{rows})
	}
	if len(rows) == 0 {
		fmt.Fprintln(out, "No VMs found.")
		return nil
	}
	tw := tabwriter.NewWriter(out, 0, 4, 3, ' ', 0)
	fmt.Fprintln(tw, "NAMESPACE\tCLUSTER\tROLE\tDOMAIN\tSTATE\tHOST\tADDRESS\tNODE")
	for _, r := range rows {
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", r.Namespace, orDash(r.Cluster), r.Role, r.Domain, orDash(r.State),
			orDash(r.Host), orDash(strings.Join(r.Addresses, ",")), orDash(r.Node))
	}
	return tw.Flush()
}
