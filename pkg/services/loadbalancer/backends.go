package loadbalancer

import (
	"context"
	"fmt"
	"sort"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
)

// candidate is a control-plane machine with an address.
type candidate struct {
	machine  string
	address  string
	deleting bool
}

// DesiredBackends lists the control-plane Machines of the cluster whose
// LibvirtMachine reports an InternalIP, sorted by name. A Machine or
// LibvirtMachine being deleted is drained (see states); one that is gone
// is no backend any more.
func DesiredBackends(ctx context.Context, s *scope.ClusterScope) ([]infrav1.LoadBalancerBackend, error) {
	machines := &clusterv1.MachineList{}
	if err := s.Client.List(ctx, machines, client.InNamespace(s.Namespace()),
		client.MatchingLabels{clusterv1.ClusterNameLabel: s.ClusterName()},
		client.HasLabels{clusterv1.MachineControlPlaneLabel}); err != nil {
		return nil, fmt.Errorf("listing control-plane Machines: %w", err)
	}
	var cands []candidate
	for i := range machines.Items {
		m := &machines.Items[i]
		ref := m.Spec.InfrastructureRef
		if ref.Kind != "LibvirtMachine" || ref.APIGroup != infrav1.GroupVersion.Group {
			continue
		}
		lm := &infrav1.LibvirtMachine{}
		err := s.Client.Get(ctx, client.ObjectKey{Namespace: m.Namespace, Name: ref.Name}, lm)
		if apierrors.IsNotFound(err) {
			continue
		}
		if err != nil {
			return nil, fmt.Errorf("reading LibvirtMachine %s: %w", ref.Name, err)
		}
		addr := InternalIP(lm)
		if addr == "" {
			continue
		}
		cands = append(cands, candidate{machine: m.Name, address: addr,
			deleting: !m.DeletionTimestamp.IsZero() || !lm.DeletionTimestamp.IsZero()})
	}
	return states(cands), nil
}

// InternalIP is the LibvirtMachine's first InternalIP, "" when it has none.
func InternalIP(lm *infrav1.LibvirtMachine) string {
	for _, a := range lm.Status.Addresses {
		if a.Type == clusterv1.MachineInternalIP && a.Address != "" {
			return a.Address
		}
	}
	return ""
}

// states turns candidates into backends sorted by machine name. A deleting
// machine is Draining (no new connections) as long as another one takes
// new connections; otherwise it stays Active, since draining the last API
// server would leave the endpoint serving nothing.
func states(cands []candidate) []infrav1.LoadBalancerBackend {
	remaining := 0
	for _, c := range cands {
		if !c.deleting {
			remaining++
		}
	}
	out := make([]infrav1.LoadBalancerBackend, 0, len(cands))
	for _, c := range cands {
		st := infrav1.BackendActive
		if c.deleting && remaining > 0 {
			st = infrav1.BackendDraining
		}
		out = append(out, infrav1.LoadBalancerBackend{Machine: c.machine, Address: c.address, State: st})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Machine < out[j].Machine })
	return out
}
