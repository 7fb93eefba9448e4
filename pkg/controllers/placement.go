package controllers

import (
	"context"
	"fmt"
	"strings"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/hostdevice"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// recheckHost is how often an object whose host is unreachable looks
// again; a reconnect also triggers it (hostevents).
const recheckHost = 30 * time.Second

// placement is the failure domain of an object and the libvirt host it
// names.
type placement struct {
	failureDomain string
	ref           hosts.Ref
	host          virt.Host
	hostName      string
	// problem is why nothing can be done on the host now; nil when the
	// host answers.
	problem *placementProblem
}

// placementProblem is a condition reason and message that stops a
// reconcile before it calls libvirt.
type placementProblem struct {
	reason, message string
}

// resolveHost fills in p's host and, when it cannot be used, the problem.
// A URI the operator does not allow is never dialled (the webhook may
// have been bypassed); a host that does not answer (or whose credentials
// are missing) is reported, never waited for: other hosts' objects go on.
func resolveHost(ctx context.Context, set *hosts.Set, policy tenancy.Policy, p placement) placement {
	p.hostName = set.Name(p.ref)
	if err := policy.CheckLibvirtURI(p.ref.URI, p.ref.Secret != ""); err != nil {
		p.host = set.Default()
		p.problem = &placementProblem{reason: infrav1.HostNotAllowedReason,
			message: fmt.Sprintf("Failure domain %q: libvirt URI %s %v", p.failureDomain, p.ref.URI, err)}
		return p
	}
	host, err := set.Get(ctx, p.ref)
	if err == nil {
		p.host = host
		err = hosts.Reachable(host)
	} else {
		// No call reaches a host: the reconcile stops at the problem.
		p.host = set.Default()
	}
	if err != nil {
		p.problem = &placementProblem{reason: infrav1.HostUnreachableReason,
			message: fmt.Sprintf("libvirt host %s (failure domain %q) is unreachable: %v", p.ref.String(), p.failureDomain, err)}
	}
	return p
}

// placeMachine decides once where lm goes and finds that host: the
// failure domain lm.spec records, else the Machine's, else the cluster's
// least used one that may hold it. The choice is written to lm's spec by
// the caller before anything is created, so that it survives a move.
func (r *LibvirtMachineReconciler) placeMachine(ctx context.Context, lm *infrav1.LibvirtMachine, m *clusterv1.Machine,
	lc *infrav1.LibvirtCluster, deleting bool) (placement, error) {
	fd := lm.Spec.FailureDomain
	if fd == "" && m != nil {
		fd = m.Spec.FailureDomain
	}
	if fd == "" && !deleting && lc != nil && len(lc.Spec.FailureDomains) > 0 {
		var problem *placementProblem
		var err error
		if fd, problem, err = r.leastUsedFailureDomain(ctx, lm, m, lc); err != nil {
			return placement{}, err
		}
		if problem != nil {
			return placement{host: r.Hosts.Default(), hostName: r.Hosts.Name(hosts.Ref{}), problem: problem}, nil
		}
	}
	p := placement{failureDomain: fd}
	if fd == "" && deleting && lc != nil && len(lc.Spec.FailureDomains) > 0 {
		// Never placed (a machine waiting for its host devices): the
		// placement is recorded before anything is created, so nothing of
		// it is on any host; findOwnDomain still looks on every one.
		p.host, p.hostName = r.Hosts.Default(), r.Hosts.Name(hosts.Ref{})
		return p, nil
	}
	if lc == nil && lm.Spec.FailureDomain != "" {
		p.host = r.Hosts.Default()
		p.problem = &placementProblem{reason: infrav1.FailureDomainNotFoundReason,
			message: fmt.Sprintf("The LibvirtCluster is gone: the libvirt host of failure domain %q is not known", fd)}
		return p, nil
	}
	ref, ok := hosts.FailureDomainRef(lc, fd)
	if !ok {
		p.host = r.Hosts.Default()
		p.problem = &placementProblem{reason: infrav1.FailureDomainNotFoundReason, message: failureDomainMissing(lc, fd, m)}
		return p, nil
	}
	p.ref = ref
	return resolveHost(ctx, r.Hosts, r.Tenancy, p), nil
}

// findOwnDomain, for a machine being deleted, looks for its domain on the
// other hosts the manager reaches when the host its spec names now does
// not have it (or is not known): a failure domain's host changed, or
// went, behind the webhook's back. Only a domain whose ownership metadata
// names this machine is taken; without one p stays as it is.
func (r *LibvirtMachineReconciler) findOwnDomain(ctx context.Context, lm *infrav1.LibvirtMachine, p placement) placement {
	domain := naming.DomainName(lm.Namespace, lm.Name)
	owner := virt.Owner{Kind: "LibvirtMachine", Namespace: lm.Namespace, Name: lm.Name}
	if p.problem == nil {
		info, err := p.host.DomainInfo(ctx, domain)
		if !virt.IsNotFound(err) && (err != nil || info.Owner.IsObject(owner)) {
			return p
		}
	}
	for uri, h := range r.Hosts.Open() {
		if hosts.Reachable(h) != nil {
			continue
		}
		if info, err := h.DomainInfo(ctx, domain); err == nil && info.Owner.IsObject(owner) {
			ctrl.LoggerFrom(ctx).Info("Deleting the machine's domain where its ownership metadata is, not on the host its failure domain names now",
				"host", hosts.HostName(uri), "failureDomain", p.failureDomain)
			p.host, p.hostName, p.problem = h, hosts.HostName(uri), nil
			return p
		}
	}
	return p
}

// failureDomainMissing explains why no failure domain fits.
func failureDomainMissing(lc *infrav1.LibvirtCluster, fd string, m *clusterv1.Machine) string {
	if fd == "" {
		if scope.IsControlPlane(m, nil) {
			return "No failure domain of the LibvirtCluster has controlPlane true: a control-plane machine cannot be placed"
		}
		return "The LibvirtCluster lists no failure domain"
	}
	return fmt.Sprintf("Failure domain %q is not one of the LibvirtCluster %s's spec.failureDomains", fd, lc.Name)
}

// leastUsedFailureDomain is the failure domain among those that may hold
// m with the fewest of the cluster's machines, the first listed on a tie;
// "" when none may hold it. A machine with host devices goes only where
// the host has them free; when no host has, the problem says why.
func (r *LibvirtMachineReconciler) leastUsedFailureDomain(ctx context.Context, lm *infrav1.LibvirtMachine, m *clusterv1.Machine,
	lc *infrav1.LibvirtCluster) (string, *placementProblem, error) {
	list := &infrav1.LibvirtMachineList{}
	if err := r.Client.List(ctx, list, client.InNamespace(lm.Namespace),
		client.MatchingLabels{clusterv1.ClusterNameLabel: lm.Labels[clusterv1.ClusterNameLabel]}); err != nil {
		return "", nil, fmt.Errorf("listing the cluster's LibvirtMachines to place %s: %w", lm.Name, err)
	}
	used := map[string]int{}
	for _, other := range list.Items {
		if other.Name != lm.Name {
			used[other.Spec.FailureDomain]++
		}
	}
	best, bestCount := "", 0
	var withoutDevices []string
	reason := "" // the reason every host gave; WaitingForHostDevice when they differ
	for _, fd := range lc.Spec.FailureDomains {
		if scope.IsControlPlane(m, nil) && (fd.ControlPlane == nil || !*fd.ControlPlane) {
			continue
		}
		if why, whyReason := r.hostDevicesMissing(ctx, lm, lc, fd.Name); why != "" {
			withoutDevices = append(withoutDevices, fmt.Sprintf("%s: %s", fd.Name, why))
			if reason != "" && reason != whyReason {
				whyReason = infrav1.WaitingForHostDeviceReason
			}
			reason = whyReason
			continue
		}
		if best == "" || used[fd.Name] < bestCount {
			best, bestCount = fd.Name, used[fd.Name]
		}
	}
	if best == "" && len(withoutDevices) > 0 {
		// A device every host refuses the same way (the wrong IDs, a NIC)
		// is reported as such; otherwise the machine waits for one.
		return "", &placementProblem{reason: reason,
			message: "No failure domain's host has the machine's host devices free (" + strings.Join(withoutDevices, "; ") + ")"}, nil
	}
	return best, nil, nil
}

// hostDevicesMissing tells why the host of failure domain fd cannot take
// lm's host devices now, and the condition reason that says so; "" when
// it can (or lm has none). Aliases the operator did not list are left to
// the reference step, which refuses them wherever the machine goes.
func (r *LibvirtMachineReconciler) hostDevicesMissing(ctx context.Context, lm *infrav1.LibvirtMachine, lc *infrav1.LibvirtCluster, fd string) (why, reason string) {
	if len(lm.Spec.HostDevices) == 0 {
		return "", ""
	}
	ref, _ := hosts.FailureDomainRef(lc, fd) // fd is one of lc's
	p := resolveHost(ctx, r.Hosts, r.Tenancy, placement{failureDomain: fd, ref: ref})
	if p.problem != nil {
		return p.problem.message, infrav1.WaitingForHostDeviceReason
	}
	for _, d := range lm.Spec.HostDevices {
		dev, err := r.Tenancy.HostDevice(d.Name)
		if err != nil {
			return "", ""
		}
		problem, err := hostdevice.Check(ctx, p.host, r.Tenancy, dev, p.hostName, naming.DomainName(lm.Namespace, lm.Name))
		if err != nil {
			return err.Error(), infrav1.WaitingForHostDeviceReason
		}
		if problem != nil {
			return d.Name + ": " + problem.Message, problem.Reason
		}
	}
	return "", ""
}

// placeCluster finds the host of lc's cluster-wide objects (its network
// and HAProxy VM): the load balancer's failure domain, else the first
// one that takes control-plane machines, else the manager's host.
func placeCluster(ctx context.Context, set *hosts.Set, policy tenancy.Policy, lc *infrav1.LibvirtCluster) placement {
	fd := hosts.LoadBalancerFailureDomain(lc)
	ref, ok := hosts.FailureDomainRef(lc, fd)
	p := placement{failureDomain: fd, ref: ref}
	if !ok {
		p.host, p.hostName = set.Default(), set.Name(hosts.Ref{})
		p.problem = &placementProblem{reason: infrav1.FailureDomainNotFoundReason,
			message: fmt.Sprintf("spec.loadBalancer.failureDomain %q is not one of spec.failureDomains", fd)}
		return p
	}
	return resolveHost(ctx, set, policy, p)
}
