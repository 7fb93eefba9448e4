//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// counters are the figures of one metrics scrape.
type counters struct {
	calls       float64
	byOperation map[string]float64
	machine     float64 // LibvirtMachine reconciles
	cluster     float64 // LibvirtCluster reconciles
	hasCalls    bool
}

func (s *suite) scrape(ctx context.Context) (counters, error) {
	text, err := s.plane.ManagerMetrics(ctx)
	if err != nil {
		return counters{}, err
	}
	m := parseMetrics(text, metricLibvirtCalls, metricReconciles)
	c := counters{byOperation: map[string]float64{}}
	for _, smp := range m[metricLibvirtCalls] {
		c.hasCalls = true
		c.calls += smp.value
		c.byOperation[smp.labels["operation"]] += smp.value
	}
	for _, smp := range m[metricReconciles] {
		switch smp.labels["controller"] {
		case "libvirtmachine":
			c.machine += smp.value
		case "libvirtcluster":
			c.cluster += smp.value
		}
	}
	return c, nil
}

// measureSteadyState computes libvirt calls per reconcile once every
// machine is ready: it touches an annotation on each LibvirtMachine (the
// controller has no generation predicate, so that reconciles it, and the
// LibvirtCluster through its LibvirtMachine watch) and divides the
// counters' deltas over the window.
func (s *suite) measureSteadyState(t *testing.T) {
	defer s.rep.phase("steady-state metrics window")()
	ctx := s.ctx
	before, err := s.scrape(ctx)
	if err != nil {
		t.Errorf("scraping the manager's metrics: %v", err)
		s.rep.SteadyState.Reason = "scraping /metrics failed: " + err.Error()
		return
	}
	start := time.Now()
	lms, err := s.clusterMachines(s.cut.name)
	must(t, err)
	touched := 0
	for round := range 3 {
		for i := range lms {
			lm := &lms[i]
			if extraMachine(lm.Name) {
				continue
			}
			patch := client.MergeFrom(lm.DeepCopy())
			if lm.Annotations == nil {
				lm.Annotations = map[string]string{}
			}
			lm.Annotations["e2e.capi-libvirt.dev/touched"] = strconv.Itoa(round)
			must(t, s.c.Patch(ctx, lm, patch))
			if round == 0 {
				touched++
			}
		}
		time.Sleep(5 * time.Second)
	}
	time.Sleep(10 * time.Second) // let the last reconciles finish
	after, err := s.scrape(ctx)
	must(t, err)
	ss := steadyState{WindowSeconds: time.Since(start).Seconds(), TriggeredByTouching: touched,
		MachineReconciles: after.machine - before.machine, ClusterReconciles: after.cluster - before.cluster}
	if after.machine-before.machine < float64(touched) {
		t.Errorf("touching %d LibvirtMachines 3 times gave only %.0f reconciles", touched, after.machine-before.machine)
	}
	if !after.hasCalls {
		ss.Reason = metricLibvirtCalls + " is not exported by this manager"
		s.rep.SteadyState = ss
		t.Logf("libvirt calls per reconcile: not available (%s)", ss.Reason)
		return
	}
	ss.Available = true
	ss.LibvirtCalls = after.calls - before.calls
	ss.CallsByOperation = map[string]float64{}
	for op, n := range after.byOperation {
		if d := n - before.byOperation[op]; d > 0 {
			ss.CallsByOperation[op] = d
		}
	}
	if r := ss.MachineReconciles + ss.ClusterReconciles; r > 0 {
		ss.CallsPerReconcile = ss.LibvirtCalls / r
	}
	s.rep.SteadyState = ss
	t.Logf("steady state: %.0f libvirt calls over %.0f LibvirtMachine + %.0f LibvirtCluster reconciles = %.2f per reconcile (%v)",
		ss.LibvirtCalls, ss.MachineReconciles, ss.ClusterReconciles, ss.CallsPerReconcile, ss.CallsByOperation)
}

// setWorkers sets the MachineDeployment's replicas.
func (s *suite) setWorkers(t *testing.T, n int32) {
	t.Helper()
	md := &clusterv1.MachineDeployment{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: s.cut.workers}, md))
	patch := client.MergeFrom(md.DeepCopy())
	md.Spec.Replicas = ptr.To(n)
	must(t, s.c.Patch(s.ctx, md, patch))
}

// workerMachines lists the LibvirtMachines of the MachineDeployment's
// Machines by name, with their UIDs.
func (s *suite) workerMachines(t *testing.T) map[string]*infrav1.LibvirtMachine {
	t.Helper()
	machines := &clusterv1.MachineList{}
	must(t, s.c.List(s.ctx, machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: s.cut.workers}))
	out := map[string]*infrav1.LibvirtMachine{}
	for _, m := range machines.Items {
		if lm := s.lm(m.Spec.InfrastructureRef.Name); lm != nil {
			out[lm.Name] = lm
		}
	}
	return out
}

// scaleWorkers scales the MachineDeployment 2 → 3 → 1.
func (s *suite) scaleWorkers(t *testing.T) {
	network := s.clusterNetwork()
	before := s.workerMachines(t)
	if len(before) != 2 {
		t.Fatalf("%d worker machines before scaling, want 2", len(before))
	}
	stop := s.rep.phase("scale workers 2 → 3 (one machine alone to BootstrapSucceeded)")
	s.setWorkers(t, 3)
	var added string
	s.waitFor(t, "a third worker LibvirtMachine", 5*time.Minute, func() (bool, string) {
		for name := range s.workerMachines(t) {
			if before[name] == nil {
				added = name
				return true, ""
			}
		}
		return false, "none yet"
	})
	s.waitMachineCondition(t, added, infrav1.BootstrapSucceededCondition, singleTimeout)
	stop()
	tls, provisioned := s.rec.timelines(clusterName, added)
	s.rep.addBatch(batch("1 alone (scale 2 → 3)", tls, provisioned))
	s.waitFor(t, "MachineDeployment status.replicas 3", 2*time.Minute, s.replicasAre(3))
	s.checkReplicas(t, 3)

	stop = s.rep.phase("scale workers 3 → 1")
	all := s.workerMachines(t)
	s.setWorkers(t, 1)
	s.waitFor(t, "MachineDeployment down to 1 machine", deleteTimeout, func() (bool, string) {
		n := len(s.workerMachines(t))
		ok, status := s.replicasAre(1)()
		return ok && n == 1, fmt.Sprintf("%d LibvirtMachines; %s", n, status)
	})
	stop()
	s.checkReplicas(t, 1)
	left := s.workerMachines(t)
	for name, lm := range all {
		if left[name] != nil {
			continue
		}
		if l := s.machineLeftovers(name, macSeed(lm), network); len(l) > 0 {
			t.Errorf("deleted worker %s left in libvirt: %s", name, strings.Join(l, ", "))
		}
	}
	for _, lm := range left {
		if !isTrue(lm, infrav1.BootstrapSucceededCondition) {
			t.Errorf("remaining worker %s is not BootstrapSucceeded", lm.Name)
		}
	}
}

// replicasAre reports whether the MachineDeployment's status shows n
// replicas.
func (s *suite) replicasAre(n int32) func() (bool, string) {
	return func() (bool, string) {
		md := &clusterv1.MachineDeployment{}
		if err := s.c.Get(s.ctx, client.ObjectKeyFromObject(s.demo.md), md); err != nil {
			return false, err.Error()
		}
		got := ptr.Deref(md.Status.Replicas, -1)
		return got == n, fmt.Sprintf("status.replicas %d", got)
	}
}

// backendObservation is what the watcher of a deleted control-plane
// machine saw.
type backendObservation struct {
	mu              sync.Mutex
	draining        time.Time // backend first seen Draining
	domainAtDrain   bool      // its domain still existed when it was seen Draining
	domainGone      time.Time // its domain first seen gone
	backendRemoved  time.Time // backend first seen absent
	states          []string  // distinct backend states in order
	activeAfterGone bool      // backend seen Active after the domain was gone
}

// deleteControlPlaneMachine deletes one control-plane Machine and checks
// HAProxy drains it (weight 0, state Draining) before its VM goes, then
// drops it, while the endpoint keeps serving.
func (s *suite) deleteControlPlaneMachine(t *testing.T) {
	defer s.rep.phase("delete a control-plane machine behind the endpoint")()
	victim := s.demo.controlPlane[len(s.demo.controlPlane)-1]
	lm := s.lm(victim)
	if lm == nil || lm.Status.Domain == nil {
		t.Fatalf("control-plane LibvirtMachine %s or its domain status is missing", victim)
	}
	domain := lm.Status.Domain.Name
	network := s.clusterNetwork()
	ep := s.endpoint(t)

	obs := &backendObservation{}
	ctx, cancel := context.WithCancel(s.ctx)
	done := make(chan struct{})
	go func() {
		defer close(done)
		for ctx.Err() == nil {
			lc := &infrav1.LibvirtCluster{}
			if s.c.Get(ctx, client.ObjectKeyFromObject(s.demo.lc), lc) == nil && lc.Status.LoadBalancer != nil {
				qctx, qcancel := context.WithTimeout(ctx, 10*time.Second)
				_, derr := s.host.DomainInfo(qctx, domain)
				qcancel()
				exists := derr == nil
				now := time.Now()
				obs.mu.Lock()
				if !exists && virt.IsNotFound(derr) {
					setOnce(&obs.domainGone, now, true)
				}
				idx := slices.IndexFunc(lc.Status.LoadBalancer.Backends, func(b infrav1.LoadBalancerBackend) bool { return b.Machine == victim })
				state := "absent"
				if idx >= 0 {
					state = string(lc.Status.LoadBalancer.Backends[idx].State)
				}
				if len(obs.states) == 0 || obs.states[len(obs.states)-1] != state {
					obs.states = append(obs.states, state)
				}
				if state == string(infrav1.BackendDraining) && obs.draining.IsZero() {
					obs.draining = now
					obs.domainAtDrain = exists
				}
				if state == string(infrav1.BackendActive) && !obs.domainGone.IsZero() {
					obs.activeAfterGone = true
				}
				if state == "absent" && !obs.draining.IsZero() {
					setOnce(&obs.backendRemoved, now, true)
				}
				obs.mu.Unlock()
			}
			time.Sleep(100 * time.Millisecond)
		}
	}()
	defer func() { cancel(); <-done }()

	m := &clusterv1.Machine{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: victim}, m))
	s.deleteAndWait(t, m, deleteTimeout, &infrav1.LibvirtMachine{ObjectMeta: lm.ObjectMeta})
	s.waitFor(t, "backend of "+victim+" removed and its domain gone", 3*time.Minute, func() (bool, string) {
		obs.mu.Lock()
		defer obs.mu.Unlock()
		return !obs.backendRemoved.IsZero() && !obs.domainGone.IsZero(), fmt.Sprintf("states %v, domain gone %v", obs.states, !obs.domainGone.IsZero())
	})
	obs.mu.Lock()
	t.Logf("backend of %s went through %v; draining at +0, domain gone %+.1fs, backend removed %+.1fs", victim, obs.states,
		obs.domainGone.Sub(obs.draining).Seconds(), obs.backendRemoved.Sub(obs.draining).Seconds())
	switch {
	case obs.draining.IsZero():
		t.Errorf("backend of %s was never seen Draining (states %v)", victim, obs.states)
	case !obs.domainAtDrain || !obs.draining.Before(obs.domainGone):
		t.Errorf("backend of %s was Draining only after its domain was gone (states %v)", victim, obs.states)
	}
	if obs.activeAfterGone {
		t.Errorf("backend of %s was Active again after its domain was gone (states %v)", victim, obs.states)
	}
	obs.mu.Unlock()
	if l := s.machineLeftovers(victim, macSeed(lm), network); len(l) > 0 {
		t.Errorf("deleted control-plane machine %s left in libvirt: %s", victim, strings.Join(l, ", "))
	}
	s.demo.controlPlane = s.demo.controlPlane[:len(s.demo.controlPlane)-1]
	got := answers(ep, 4*len(s.demo.controlPlane))
	for host, n := range got {
		if !slices.Contains(s.demo.controlPlane, host) {
			t.Errorf("after deleting %s the endpoint answered %d times with %q (answers %v)", victim, n, host, got)
		}
	}
	t.Logf("endpoint %s after deleting %s: %v (remaining %v)", ep, victim, got, slices.Sorted(maps.Keys(got)))
}
