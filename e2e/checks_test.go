//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
)

// pausedCondition is Cluster API's condition on paused objects; it is
// False on a running cluster, the only condition that should be.
const pausedCondition = "Paused"

// checkConditions fails t for conditions without a reason, and for any
// condition but Paused that is not True.
func checkConditions(t *testing.T, what string, conds []metav1.Condition, required ...string) {
	t.Helper()
	seen := map[string]bool{}
	for _, c := range conds {
		seen[c.Type] = true
		if c.Reason == "" {
			t.Errorf("%s: condition %s has no reason", what, c.Type)
		}
		want := metav1.ConditionTrue
		if c.Type == pausedCondition {
			want = metav1.ConditionFalse
		}
		if c.Status != want {
			t.Errorf("%s: condition %s is %s (%s: %s), want %s", what, c.Type, c.Status, c.Reason, c.Message, want)
		}
	}
	for _, r := range required {
		if !seen[r] {
			t.Errorf("%s: condition %s missing (have %v)", what, r, conds)
		}
	}
}

// checkContract checks every field of Cluster API's infrastructure
// contract on every object of the ready cluster under test.
func (s *suite) checkContract(t *testing.T) {
	ctx := s.ctx
	cl := &clusterv1.Cluster{}
	must(t, s.c.Get(ctx, client.ObjectKey{Namespace: namespace, Name: s.cut.name}, cl))
	lc := s.libvirtCluster(t, s.cut.infrastructure)

	// LibvirtCluster.
	ep := lc.Spec.ControlPlaneEndpoint
	if ep.Host == "" || ep.Port <= 0 {
		t.Errorf("LibvirtCluster spec.controlPlaneEndpoint = %+v, want host and port", ep)
	}
	if !lc.Status.Initialization.IsProvisioned() {
		t.Error("LibvirtCluster status.initialization.provisioned is not true")
	}
	if !lc.Status.Ready {
		t.Error("LibvirtCluster status.ready (v1beta1 mirror) is not true")
	}
	if len(lc.Status.FailureDomains) == 0 {
		t.Error("LibvirtCluster status.failureDomains is empty")
	}
	for _, fd := range lc.Status.FailureDomains {
		if fd.Name == "" {
			t.Errorf("LibvirtCluster failure domain without a name: %+v", fd)
		}
	}
	if lc.Status.FailureReason != nil || lc.Status.FailureMessage != nil {
		t.Errorf("LibvirtCluster has failureReason %v / failureMessage %v", ptr.Deref(lc.Status.FailureReason, ""), ptr.Deref(lc.Status.FailureMessage, ""))
	}
	checkConditions(t, "LibvirtCluster", lc.Status.Conditions,
		infrav1.NetworkReadyCondition, infrav1.LoadBalancerReadyCondition, infrav1.StoragePoolReadyCondition)
	if lc.Status.Network == nil || lc.Status.Network.Name == "" || lc.Status.Network.CIDR == "" {
		t.Errorf("LibvirtCluster status.network = %+v, want name and CIDR", lc.Status.Network)
	}

	// Cluster.
	if !ptr.Deref(cl.Status.Initialization.InfrastructureProvisioned, false) {
		t.Error("Cluster status.initialization.infrastructureProvisioned is not true")
	}
	if cl.Spec.ControlPlaneEndpoint != ep {
		t.Errorf("Cluster spec.controlPlaneEndpoint = %+v, want the LibvirtCluster's %+v", cl.Spec.ControlPlaneEndpoint, ep)
	}
	var cpFailureDomains []string
	for _, fd := range lc.Status.FailureDomains {
		if ptr.Deref(fd.ControlPlane, false) {
			cpFailureDomains = append(cpFailureDomains, fd.Name)
		}
	}

	// Machines and LibvirtMachines.
	machines := &clusterv1.MachineList{}
	must(t, s.c.List(ctx, machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: s.cut.name}))
	count := 0
	for _, m := range machines.Items {
		if extraMachine(m.Name) {
			continue
		}
		count++
		lm := s.lm(m.Spec.InfrastructureRef.Name)
		if lm == nil {
			t.Errorf("Machine %s: LibvirtMachine %s not found", m.Name, m.Spec.InfrastructureRef.Name)
			continue
		}
		what := "LibvirtMachine " + lm.Name
		if lm.Status.Domain == nil || lm.Status.Domain.UUID == "" {
			t.Errorf("%s: status.domain.uuid missing (%+v)", what, lm.Status.Domain)
		} else if want := infrav1.ProviderIDPrefix + lm.Status.Domain.UUID; lm.Spec.ProviderID != want {
			t.Errorf("%s: spec.providerID = %q, want %q", what, lm.Spec.ProviderID, want)
		}
		if !lm.Status.Initialization.IsProvisioned() || !lm.Status.Ready {
			t.Errorf("%s: provisioned %v, ready %v; want both true", what, lm.Status.Initialization.Provisioned, lm.Status.Ready)
		}
		if lm.Status.FailureReason != nil || lm.Status.FailureMessage != nil {
			t.Errorf("%s: failureReason %q failureMessage %q", what, ptr.Deref(lm.Status.FailureReason, ""), ptr.Deref(lm.Status.FailureMessage, ""))
		}
		checkConditions(t, what, lm.Status.Conditions, infrav1.DiskReadyCondition, infrav1.DomainReadyCondition,
			infrav1.AddressAssignedCondition, infrav1.BootstrapDataReadyCondition, infrav1.BootstrapSucceededCondition)
		hasInternal := slices.ContainsFunc(lm.Status.Addresses, func(a clusterv1.MachineAddress) bool { return a.Type == clusterv1.MachineInternalIP })
		if !hasInternal {
			t.Errorf("%s: status.addresses %v has no InternalIP", what, lm.Status.Addresses)
		}
		// The demo's Machines ask for no failure domain (no control-plane
		// provider picks one); a machine placed in one reports it, and it
		// must be one the cluster offers.
		if m.Spec.FailureDomain != "" && lm.Status.FailureDomain != m.Spec.FailureDomain {
			t.Errorf("%s: status.failureDomain %q, want the Machine's %q", what, lm.Status.FailureDomain, m.Spec.FailureDomain)
		}
		if _, cp := m.Labels[clusterv1.MachineControlPlaneLabel]; cp && lm.Status.FailureDomain != "" && !slices.Contains(cpFailureDomains, lm.Status.FailureDomain) {
			t.Errorf("%s: status.failureDomain %q is not a control-plane failure domain of %v", what, lm.Status.FailureDomain, cpFailureDomains)
		}
		// The Machine mirrors it (Cluster API's Machine controller).
		if m.Spec.ProviderID != lm.Spec.ProviderID {
			t.Errorf("Machine %s: spec.providerID = %q, want %q", m.Name, m.Spec.ProviderID, lm.Spec.ProviderID)
		}
		if !ptr.Deref(m.Status.Initialization.InfrastructureProvisioned, false) {
			t.Errorf("Machine %s: status.initialization.infrastructureProvisioned is not true", m.Name)
		}
		if !sameAddresses(m.Status.Addresses, lm.Status.Addresses) {
			t.Errorf("Machine %s: status.addresses = %v, want the LibvirtMachine's %v", m.Name, m.Status.Addresses, lm.Status.Addresses)
		}
	}
	if want := int(s.cut.controlPlaneMachines + s.cut.workerMachines); count != want {
		t.Errorf("%d Machines of cluster %s, want %d", count, s.cut.name, want)
	}

	// MachineDeployment and its MachineSet.
	s.checkReplicas(t, s.cut.workerMachines)
}

// checkReplicas checks the MachineDeployment and its one MachineSet have
// want replicas, in spec and status, and that many Machines.
func (s *suite) checkReplicas(t *testing.T, want int32) {
	t.Helper()
	md := &clusterv1.MachineDeployment{}
	must(t, s.c.Get(s.ctx, client.ObjectKey{Namespace: namespace, Name: s.cut.workers}, md))
	if got := ptr.Deref(md.Spec.Replicas, -1); got != want {
		t.Errorf("MachineDeployment spec.replicas = %d, want %d", got, want)
	}
	if got := ptr.Deref(md.Status.Replicas, -1); got != want {
		t.Errorf("MachineDeployment status.replicas = %d, want %d", got, want)
	}
	sets := &clusterv1.MachineSetList{}
	must(t, s.c.List(s.ctx, sets, client.InNamespace(namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}))
	if len(sets.Items) != 1 {
		t.Errorf("%d MachineSets of the MachineDeployment, want 1", len(sets.Items))
	}
	for _, ms := range sets.Items {
		if ptr.Deref(ms.Spec.Replicas, -1) != want || ptr.Deref(ms.Status.Replicas, -1) != want {
			t.Errorf("MachineSet %s: spec.replicas %d status.replicas %d, want %d", ms.Name, ptr.Deref(ms.Spec.Replicas, -1), ptr.Deref(ms.Status.Replicas, -1), want)
		}
	}
	machines := &clusterv1.MachineList{}
	must(t, s.c.List(s.ctx, machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.MachineDeploymentNameLabel: md.Name}))
	if int32(len(machines.Items)) != want {
		t.Errorf("%d Machines of the MachineDeployment, want %d", len(machines.Items), want)
	}
}

func sameAddresses(a, b []clusterv1.MachineAddress) bool {
	key := func(as []clusterv1.MachineAddress) []string {
		var out []string
		for _, x := range as {
			out = append(out, string(x.Type)+"="+x.Address)
		}
		slices.Sort(out)
		return out
	}
	return slices.Equal(key(a), key(b))
}

// endpoint is the demo cluster's control-plane endpoint, host:port.
func (s *suite) endpoint(t *testing.T) string {
	lc := s.libvirtCluster(t, s.demo.lc.Name)
	return lc.Spec.ControlPlaneEndpoint.Host + ":" + strconv.Itoa(int(lc.Spec.ControlPlaneEndpoint.Port))
}

// answers sends n requests through the endpoint and counts the answers
// per hostname; failed requests count under "error: …".
func answers(endpoint string, n int) map[string]int {
	out := map[string]int{}
	for range n {
		host, err := devplane.Readyz(context.Background(), endpoint)
		if err != nil {
			host = "error: " + err.Error()
		}
		out[host]++
	}
	return out
}

// checkEndpoint checks the endpoint serves through HAProxy and that every
// control-plane guest answers over a few rounds of requests (HAProxy
// balances round-robin).
func (s *suite) checkEndpoint(t *testing.T) {
	lc := s.libvirtCluster(t, s.demo.lc.Name)
	if lc.Status.LoadBalancer == nil {
		t.Fatal("LibvirtCluster status.loadBalancer is missing")
	}
	var backends []string
	for _, b := range lc.Status.LoadBalancer.Backends {
		if b.State != infrav1.BackendActive || b.Address == "" {
			t.Errorf("backend %+v is not Active with an address", b)
		}
		backends = append(backends, b.Machine)
	}
	slices.Sort(backends)
	if !slices.Equal(backends, s.demo.controlPlane) {
		t.Errorf("load balancer backends %v, want the control-plane Machines %v", backends, s.demo.controlPlane)
	}
	ep := s.endpoint(t)
	// HAProxy marks a backend up after its health checks pass; give a
	// guest whose server started last a little time.
	var got map[string]int
	err := s.poll(t, "every control-plane guest answering through "+ep, 2*time.Minute, func() (bool, string) {
		got = answers(ep, 3*len(s.demo.controlPlane))
		for _, cp := range s.demo.controlPlane {
			if got[cp] == 0 {
				return false, fmt.Sprint(got)
			}
		}
		return true, ""
	})
	if err != nil {
		t.Error(err)
	}
	for host := range got {
		if !slices.Contains(s.demo.controlPlane, host) {
			t.Errorf("endpoint %s answered by %q, not a control-plane machine (answers %v)", ep, host, got)
		}
	}
	t.Logf("endpoint %s answers: %v", ep, got)
}

// Where the guest keeps its boot and cloud-init's instance.
const (
	bootIDFile     = "/proc/sys/kernel/random/boot_id"
	instanceIDFile = "/var/lib/cloud/data/instance-id"
	sentinelFile   = "/run/cluster-api/bootstrap-success.complete"
)
