//go:build e2e

package e2e

import (
	"context"
	"slices"
	"sync"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// observeInterval is how often the recorder looks at the API server and at
// libvirt's DHCP leases: the report's timings are exact to about this.
const observeInterval = 200 * time.Millisecond

// recorder polls the namespace's machines and libvirt's leases and keeps
// the first time each step was seen.
type recorder struct {
	s  *suite
	mu sync.Mutex
	// machines is keyed by LibvirtMachine UID: a recreated name is a new
	// machine.
	machines map[string]*timeline
	// provisioned is when each Cluster's infrastructure was first seen
	// provisioned.
	provisioned map[string]time.Time
	// loadBalancers are the LibvirtClusters (by UID) whose load-balancer
	// VM the report counted.
	loadBalancers map[string]string
	stop          context.CancelFunc
	done          chan struct{}
}

func startRecorder(s *suite) *recorder {
	ctx, cancel := context.WithCancel(s.ctx)
	r := &recorder{s: s, machines: map[string]*timeline{}, provisioned: map[string]time.Time{}, loadBalancers: map[string]string{}, stop: cancel, done: make(chan struct{})}
	s.t.Cleanup(func() { r.stop(); <-r.done })
	go func() {
		defer close(r.done)
		tick := time.NewTicker(observeInterval)
		defer tick.Stop()
		for {
			r.observe(ctx)
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	return r
}

func (r *recorder) observe(ctx context.Context) {
	if r.s.selfHost.inside.Load() {
		// Every request costs a workload cluster under TCG dearly.
		return
	}
	c := r.s.c
	now := time.Now()
	clusters := &clusterv1.ClusterList{}
	machines := &clusterv1.MachineList{}
	lms := &infrav1.LibvirtMachineList{}
	lcs := &infrav1.LibvirtClusterList{}
	if c.List(ctx, clusters, client.InNamespace(namespace)) != nil || c.List(ctx, machines, client.InNamespace(namespace)) != nil ||
		c.List(ctx, lms, client.InNamespace(namespace)) != nil || c.List(ctx, lcs, client.InNamespace(namespace)) != nil {
		return
	}
	networks := map[string]string{} // cluster name → libvirt network
	for _, lc := range lcs.Items {
		if lc.Spec.LoadBalancer.Type == infrav1.LoadBalancerHAProxy && lc.Status.LoadBalancer != nil &&
			lc.Status.LoadBalancer.Domain != nil && r.loadBalancers[string(lc.UID)] == "" {
			r.loadBalancers[string(lc.UID)] = lc.Name
			r.s.rep.addGuest(guestSize("load balancer", lc.Spec.LoadBalancer.VirtualHardware))
		}
		if lc.Status.Network != nil {
			networks[lc.Labels[clusterv1.ClusterNameLabel]] = lc.Status.Network.Name
		}
	}
	secretNamed := map[string]bool{} // Machine name → dataSecretName set
	for _, m := range machines.Items {
		secretNamed[m.Name] = m.Spec.Bootstrap.DataSecretName != nil
	}
	type leaseQuery struct {
		tl  *timeline
		net string
	}
	var queries []leaseQuery
	r.mu.Lock()
	for _, cl := range clusters.Items {
		if p := cl.Status.Initialization.InfrastructureProvisioned; p != nil && *p && r.provisioned[cl.Name].IsZero() {
			r.provisioned[cl.Name] = now
		}
	}
	for i := range lms.Items {
		lm := &lms.Items[i]
		tl := r.machines[string(lm.UID)]
		if tl == nil {
			tl = &timeline{name: lm.Name, created: now}
			if ct := lm.CreationTimestamp.Time; ct.Before(now) && now.Sub(ct) > 2*time.Second {
				// Created before the recorder ran: the API's second is
				// the best there is.
				tl.created = ct
			}
			r.machines[string(lm.UID)] = tl
			r.s.rep.addGuest(guestSize("machine", lm.Spec.VirtualHardware))
		}
		owner := machineOwner(lm)
		setOnce(&tl.secret, now, owner != "" && secretNamed[owner])
		setOnce(&tl.domainReady, now, isTrue(lm, infrav1.DomainReadyCondition))
		setOnce(&tl.address, now, slices.ContainsFunc(lm.Status.Addresses, func(a clusterv1.MachineAddress) bool {
			return a.Type == clusterv1.MachineInternalIP
		}))
		setOnce(&tl.bootstrap, now, isTrue(lm, infrav1.BootstrapSucceededCondition))
		if lm.Status.Domain != nil && lm.Status.Domain.MAC != "" {
			tl.mac = lm.Status.Domain.MAC
		}
		tl.network = networks[lm.Labels[clusterv1.ClusterNameLabel]]
		if tl.lease.IsZero() && tl.mac != "" && tl.network != "" {
			queries = append(queries, leaseQuery{tl, tl.network})
		}
	}
	r.mu.Unlock()
	for _, q := range queries {
		qctx, cancel := context.WithTimeout(ctx, 5*time.Second)
		addrs, err := r.s.host.Addresses(qctx, virt.AddressQuery{Network: q.net, MAC: netalloc.MAC(q.tl.mac)})
		cancel()
		if err != nil {
			continue
		}
		seen := time.Now()
		for _, a := range addrs {
			if a.Source == virt.AddressSourceLease {
				r.mu.Lock()
				setOnce(&q.tl.lease, seen, true)
				r.mu.Unlock()
				break
			}
		}
	}
}

func setOnce(dst *time.Time, now time.Time, cond bool) {
	if cond && dst.IsZero() {
		*dst = now
	}
}

// machineOwner is the name of the Machine that owns lm, "" before Cluster
// API set the owner reference.
func machineOwner(lm *infrav1.LibvirtMachine) string {
	for _, ref := range lm.OwnerReferences {
		if ref.Kind == "Machine" {
			return ref.Name
		}
	}
	return ""
}

// timelines returns copies of the timelines of the named LibvirtMachines
// and when their cluster was provisioned.
func (r *recorder) timelines(cluster string, names ...string) ([]timeline, time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	want := map[string]bool{}
	for _, n := range names {
		want[n] = true
	}
	var out []timeline
	for _, tl := range r.machines {
		if want[tl.name] {
			out = append(out, *tl)
		}
	}
	return out, r.provisioned[cluster]
}

// startRSSSampler samples the manager's resident memory every few seconds
// into the report.
func startRSSSampler(s *suite) {
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	s.t.Cleanup(func() { cancel(); <-done })
	go func() {
		defer close(done)
		tick := time.NewTicker(3 * time.Second)
		defer tick.Stop()
		for {
			if rss, err := s.plane.ManagerRSSBytes(); err == nil {
				s.rep.sampleRSS(rss)
			}
			select {
			case <-ctx.Done():
				return
			case <-tick.C:
			}
		}
	}()
}
