package controllers_test

import (
	"context"
	"fmt"
	"net"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller/controllerutil"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/loadbalancer"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestLibvirtCluster runs the LibvirtCluster controller (with the
// LibvirtMachine controller) against envtest, Cluster API's own Cluster and
// Machine controllers and a real libvirtd. The scenarios without VMs come
// first; then one cluster with a real HAProxy VM and two control-plane VMs
// (the base image running a stand-in API server that answers /readyz over
// TLS with its hostname) goes through creation with a manager crash after
// every libvirt step, traffic, health checks, drain, and deletion with a
// crash after every delete step. Three VMs in all.
func TestLibvirtCluster(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	h := newClusterHarness(t)
	existing := h.testNetwork()
	h.startProvider(nil)

	t.Run("SkipsExternallyManaged", func(t *testing.T) { h.t = t; testExternallyManaged(h) })
	t.Run("WaitsForOwnerAndPause", func(t *testing.T) { h.t = t; testOwnerAndPause(h, existing) })
	t.Run("NetworkConflictNamesTheOtherNetwork", func(t *testing.T) { h.t = t; testNetworkConflict(h, existing) })

	m := &lbCluster{name: testlibvirt.Name(t)}
	steps := []struct {
		name string
		run  func(*clusterHarness, *lbCluster)
	}{
		{"EndpointBeforeVMsAndCrashAfterEveryStep", testEndpointAndCrashes},
		{"TrafficReachesBothControlPlanes", testTrafficAndAdd},
		{"HealthCheckTakesStoppedServerOut", testHealthCheck},
		{"UnchangedBackendsNeverReload", testNoReload},
		{"DeletingMachineIsDrainedBeforeItsVMGoes", testDrain},
		{"DeletionWaitsForMachinesAndSurvivesCrashes", testClusterDeletion},
	}
	for _, s := range steps {
		if !t.Run(s.name, func(t *testing.T) { h.t = t; s.run(h, m) }) {
			break // the scenarios build on each other
		}
	}
	h.t = t
}

// testNetwork creates an existing libvirt network for clusters to name,
// deleted when the test ends.
func (h *clusterHarness) testNetwork() virt.NetworkInfo {
	h.t.Helper()
	name := testlibvirt.Name(h.t)
	info, err := h.host.EnsureNetwork(h.ctx, virt.NetworkSpec{Name: name,
		Owner: virt.Owner{Kind: "LibvirtCluster", Namespace: h.ns, Name: name, Cluster: name}})
	must(h.t, err)
	h.t.Cleanup(func() {
		if err := h.host.DeleteNetwork(context.Background(), name); err != nil {
			h.t.Errorf("deleting test network: %v", err)
		}
	})
	return info
}

// userEndpoint is a LibvirtCluster spec with load balancer type None.
func userEndpoint(network infrav1.ClusterNetwork) infrav1.LibvirtClusterSpec {
	return infrav1.LibvirtClusterSpec{
		ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "192.0.2.10", Port: 6443},
		Network:              network,
		LoadBalancer:         infrav1.LoadBalancer{Type: infrav1.LoadBalancerNone},
	}
}

// assertUntouched checks, once the controller handled what happened
// since before (its activity then), that it did not act: no finalizer,
// no conditions.
func (h *clusterHarness) assertUntouched(name string, before testenv.Activity) {
	h.t.Helper()
	before.WaitSettled(h.t, time.Minute)
	lc := h.lc(name)
	if controllerutil.ContainsFinalizer(lc, infrav1.ClusterFinalizer) || len(lc.Status.Conditions) > 0 {
		h.t.Errorf("reconciled: finalizers %v, conditions %v", lc.Finalizers, lc.Status.Conditions)
	}
}

// testExternallyManaged: a LibvirtCluster with the managed-by annotation
// is left to whoever manages it.
func testExternallyManaged(h *clusterHarness) {
	name := testlibvirt.Name(h.t)
	h.createCluster(name, clusterOpts{spec: userEndpoint(infrav1.ClusterNetwork{}),
		annotations: map[string]string{clusterv1.ManagedByAnnotation: "someone-else"}})
	h.waitCluster(name, "owned by its Cluster", time.Minute, func(lc *infrav1.LibvirtCluster) (bool, string) {
		return len(lc.OwnerReferences) > 0, "no owner reference"
	})
	// The controller's predicate drops every event of an externally
	// managed object before it reaches the queue. A second object created
	// after it is the mark: the informer hands events over in order, so
	// once the controller took the marker up, it had seen (and dropped)
	// everything of the first.
	before := testenv.ActivityOf(h.t, "libvirtcluster")
	marker := testlibvirt.Name(h.t)
	h.createCluster(marker, clusterOpts{spec: userEndpoint(infrav1.ClusterNetwork{}), noCluster: true})
	h.assertUntouched(name, before)
	h.deleteAndWait(&infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: marker}}, time.Minute)
	h.deleteAndWait(&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}, time.Minute)
}

// testOwnerAndPause: without an owning Cluster nothing happens; paused
// (by annotation: Cluster API sets no owner reference on a paused
// Cluster's objects) the Paused condition says so; unpaused, a cluster on
// an existing network with the user's endpoint is provisioned at once, and
// its deletion leaves the network alone.
func testOwnerAndPause(h *clusterHarness, existing virt.NetworkInfo) {
	name := testlibvirt.Name(h.t)
	// As an earlier release made it: its finalizer under the legacy name,
	// which the controller replaces.
	before := testenv.ActivityOf(h.t, "libvirtcluster")
	h.createCluster(name, clusterOpts{spec: userEndpoint(infrav1.ClusterNetwork{Name: existing.Name}), noCluster: true,
		annotations: map[string]string{clusterv1.PausedAnnotation: ""}, finalizers: []string{infrav1.LegacyClusterFinalizer}})
	h.assertUntouched(name, before)

	h.createOwner(name, false)
	lc := h.waitClusterCondition(name, clusterv1.PausedCondition, metav1.ConditionTrue, clusterv1.PausedReason, time.Minute)
	if controllerutil.ContainsFinalizer(lc, infrav1.ClusterFinalizer) || lc.Status.Network != nil {
		h.t.Error("reconciled while paused")
	}
	patch := client.MergeFrom(lc.DeepCopy())
	delete(lc.Annotations, clusterv1.PausedAnnotation)
	must(h.t, h.c.Patch(h.ctx, lc, patch))
	c := &clusterv1.Cluster{}

	lc = h.waitCluster(name, "provisioned", time.Minute, func(lc *infrav1.LibvirtCluster) (bool, string) {
		return lc.Status.Initialization.IsProvisioned() && lc.Status.Ready, fmt.Sprint(lc.Status.Conditions)
	})
	if !slices.Equal(lc.Finalizers, []string{infrav1.ClusterFinalizer}) {
		h.t.Errorf("finalizers: %v, want the legacy one replaced by %s", lc.Finalizers, infrav1.ClusterFinalizer)
	}
	wantNet := infrav1.NetworkStatus{Name: existing.Name, Bridge: existing.Bridge, CIDR: existing.CIDR.String()}
	if lc.Status.Network == nil || *lc.Status.Network != wantNet {
		h.t.Errorf("status.network = %+v, want %+v", lc.Status.Network, wantNet)
	}
	for _, want := range []struct{ cond, reason string }{
		{clusterv1.ReadyCondition, ""}, {clusterv1.PausedCondition, clusterv1.NotPausedReason},
		{infrav1.NetworkReadyCondition, infrav1.ReadyReason}, {infrav1.StoragePoolReadyCondition, infrav1.ReadyReason},
		{infrav1.LoadBalancerReadyCondition, infrav1.LoadBalancerDisabledReason},
	} {
		got := conditions.Get(lc, want.cond)
		wantStatus := metav1.ConditionTrue
		if want.cond == clusterv1.PausedCondition {
			wantStatus = metav1.ConditionFalse
		}
		if got == nil || got.Status != wantStatus || (want.reason != "" && got.Reason != want.reason) {
			h.t.Errorf("%s = %+v, want %s/%s", want.cond, got, wantStatus, want.reason)
		}
	}
	host := hosts.HostName(h.uri)
	if fds := lc.Status.FailureDomains; len(fds) != 1 || fds[0].Name != host || !ptr.Deref(fds[0].ControlPlane, false) {
		h.t.Errorf("failureDomains = %+v, want one control-plane domain %s", fds, host)
	}
	h.waitFor("Cluster API to read the infrastructure", time.Minute, func() (bool, string) {
		must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, c))
		ok := ptr.Deref(c.Status.Initialization.InfrastructureProvisioned, false) &&
			c.Spec.ControlPlaneEndpoint == lc.Spec.ControlPlaneEndpoint && len(c.Status.FailureDomains) == 1
		return ok, fmt.Sprintf("endpoint %+v, failure domains %+v", c.Spec.ControlPlaneEndpoint, c.Status.FailureDomains)
	})
	if _, err := h.host.DomainInfo(h.ctx, naming.LoadBalancerDomainName(h.ns, name)); !virt.IsNotFound(err) {
		h.t.Errorf("a load balancer VM exists with type None (%v)", err)
	}

	h.deleteAndWait(c, time.Minute)
	if _, err := h.host.UseNetwork(h.ctx, existing.Name); err != nil {
		h.t.Errorf("the named network is gone with the cluster: %v", err)
	}
}

// testNetworkConflict: a CIDR that another libvirt network uses is a
// NetworkReady reason whose message names that network; nothing is created.
func testNetworkConflict(h *clusterHarness, existing virt.NetworkInfo) {
	name := testlibvirt.Name(h.t)
	h.createCluster(name, clusterOpts{spec: userEndpoint(infrav1.ClusterNetwork{CIDR: existing.CIDR.String()})})
	lc := h.waitClusterCondition(name, infrav1.NetworkReadyCondition, metav1.ConditionFalse, string(virt.ConflictSubnet), time.Minute)
	if c := conditions.Get(lc, infrav1.NetworkReadyCondition); !strings.Contains(c.Message, existing.Name) {
		h.t.Errorf("message %q does not name network %s", c.Message, existing.Name)
	}
	if lc.Status.Initialization.IsProvisioned() {
		h.t.Error("provisioned without a network")
	}
	if _, err := h.host.UseNetwork(h.ctx, naming.ClusterNetworkName(h.ns, name)); !virt.IsNotFound(err) {
		h.t.Errorf("a network was created despite the conflict (%v)", err)
	}
	h.deleteAndWait(&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}, time.Minute)
}

// lbCluster is the cluster with the HAProxy VM the later scenarios share.
type lbCluster struct {
	name     string
	endpoint string // host:port
	domain   string // the HAProxy VM
	network  string
}

// applyStep is the guest-agent command that checks, moves into place and
// reloads HAProxy's configuration (loadbalancer.Apply's script).
const applyStep = "GuestExec /bin/sh -c haproxy -c"

// testEndpointAndCrashes creates the cluster with a manager crash right
// after each libvirt and guest-agent step of the load balancer. The
// endpoint is published before the VM is defined; the first control-plane
// machine is created once the VM started; the cluster is provisioned once
// the VM runs, before HAProxy serves (LoadBalancerReady turns True when it
// accepts connections), and the reload that a crash interrupted before it
// was recorded is not repeated.
func testEndpointAndCrashes(h *clusterHarness, m *lbCluster) {
	h.stopProvider()
	m.domain = naming.LoadBalancerDomainName(h.ns, m.name)
	spec := infrav1.LibvirtClusterSpec{LoadBalancer: infrav1.LoadBalancer{
		Type:            infrav1.LoadBalancerHAProxy,
		Image:           &infrav1.ImageSource{URL: "file://" + h.lbImage, Checksum: "sha256:" + h.lbImageSum},
		VirtualHardware: tcgHardware(),
	}}
	created := time.Now()
	h.createCluster(m.name, clusterOpts{spec: spec})
	var started time.Time
	// The HAProxy worker and configuration the interrupted reload left.
	var reloadedPID, reloadedConfig string
	plan := newCrashPlan("EnsureNetwork", "ReserveAddress", "ImportImage", "EnsureOverlay", "UploadVolume",
		"EnsureDomain", "StartDomain", "GuestWriteFile", applyStep)
	// A step's bound covers a TCG boot to the guest agent; cp-0 boots
	// alongside the HAProxy VM (the cluster is provisioned once that runs),
	// so on a busy host two VMs share it.
	h.run(plan, 10*time.Minute, func(step string) {
		lc := h.lc(m.name)
		switch step {
		case "EnsureNetwork":
			if lc.Status.Network != nil {
				h.t.Errorf("status.network %+v recorded although the manager crashed first", lc.Status.Network)
			}
		case "ImportImage":
			// The disk step runs after the endpoint was published.
			ep := lc.Spec.ControlPlaneEndpoint
			if lc.Status.LoadBalancer == nil || ep.Host == "" || ep.Host != lc.Status.LoadBalancer.Address || ep.Port != 6443 {
				h.t.Fatalf("endpoint %+v not published with the reserved address (%+v)", ep, lc.Status.LoadBalancer)
			}
			if _, err := h.host.DomainInfo(h.ctx, m.domain); !virt.IsNotFound(err) {
				h.t.Errorf("the VM exists before its disk (%v)", err)
			}
			m.endpoint = net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port)))
			h.t.Logf("endpoint %s published %s after creation, before the HAProxy VM was defined", m.endpoint, time.Since(created).Round(time.Millisecond))
		case "StartDomain":
			started = time.Now()
			if lc.Status.Initialization.IsProvisioned() {
				h.t.Error("provisioned recorded although the manager crashed right after starting the VM")
			}
			// The first control-plane machine: after the endpoint, and booting
			// alongside the load balancer.
			h.createControlPlaneMachine(m.name, "cp-0")
		case applyStep:
			// The VM ran since the StartDomain crash: the cluster was
			// provisioned before HAProxy was ever configured.
			if !lc.Status.Initialization.IsProvisioned() {
				h.t.Error("not provisioned although the HAProxy VM runs")
			}
			if conditions.IsTrue(lc, infrav1.LoadBalancerReadyCondition) {
				h.t.Error("LoadBalancerReady True before HAProxy's configuration was applied")
			}
			if lc.Status.LoadBalancer.ConfigHash != "" {
				h.t.Errorf("configHash %s recorded although the manager crashed right after the reload", lc.Status.LoadBalancer.ConfigHash)
			}
			h.waitFor("HAProxy running the reloaded configuration", time.Minute, func() (bool, string) {
				out, err := loadbalancer.Stats(h.ctx, h.host, m.domain, "show info")
				info := loadbalancer.ParseInfo(out)
				reloadedPID, reloadedConfig = info["Pid"], info["description"]
				return err == nil && strings.HasPrefix(info["description"], "capl-config-"), fmt.Sprint(info, err)
			})
		}
	})
	lc := h.waitCluster(m.name, "serving", 5*time.Minute, func(lc *infrav1.LibvirtCluster) (bool, string) {
		return lc.Status.Initialization.IsProvisioned() && conditions.IsTrue(lc, infrav1.LoadBalancerReadyCondition),
			fmt.Sprint(conditions.Get(lc, infrav1.LoadBalancerReadyCondition))
	})
	serving := time.Now()
	m.network = lc.Status.Network.Name
	if m.network != naming.ClusterNetworkName(h.ns, m.name) || !lc.Status.Network.Managed || lc.Status.Network.CIDR == "" {
		h.t.Errorf("status.network = %+v", lc.Status.Network)
	}
	conn, err := net.DialTimeout("tcp", m.endpoint, 5*time.Second)
	must(h.t, err)
	_ = conn.Close()
	// cp-0 boots alongside the load balancer: when its address arrived
	// after the interrupted reload, its backend is a new configuration and
	// a second reload is due; the same configuration must not be reloaded.
	info := h.haproxyInfo(m.domain)
	reloaded := info["Pid"] != reloadedPID || lc.Status.LoadBalancer.LastReloadTime != nil
	if reloaded && info["description"] == reloadedConfig {
		h.t.Errorf("HAProxy reloaded %s again after the crash: worker %s, was %s; lastReloadTime %v",
			reloadedConfig, info["Pid"], reloadedPID, lc.Status.LoadBalancer.LastReloadTime)
	}
	if reloaded {
		h.t.Logf("HAProxy reloaded once more after the crash, from %s to %s: a backend joined in between", reloadedConfig, info["description"])
	}
	h.t.Logf("BENCH lb_time_to_serving: %s from VM start to serving (%s from LibvirtCluster creation; both include 2 simulated manager crashes and restarts)",
		serving.Sub(started).Round(time.Second), serving.Sub(created).Round(time.Second))

	// Cluster API took the endpoint.
	h.waitFor("Cluster API to read the endpoint", time.Minute, func() (bool, string) {
		c := &clusterv1.Cluster{}
		must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: m.name}, c))
		return c.Spec.ControlPlaneEndpoint == lc.Spec.ControlPlaneEndpoint, fmt.Sprintf("%+v", c.Spec.ControlPlaneEndpoint)
	})
	// No duplicate reservations after the crashes.
	entries, err := h.host.Reservations(h.ctx, m.network)
	must(h.t, err)
	if len(entries) < 1 || len(entries) > 2 { // the HAProxy VM, and cp-0 once it reserved
		h.t.Errorf("host entries on the cluster network: %v", entries)
	}
}

// testTrafficAndAdd: cp-0 serves through the endpoint; cp-1, added now,
// joins the backends once it has an address, and requests reach both.
func testTrafficAndAdd(h *clusterHarness, m *lbCluster) {
	// Under TCG on a shared host a VM's cloud-init may take minutes.
	h.waitFor("cp-0 answering through the endpoint", 10*time.Minute, func() (bool, string) {
		host, err := readyz(m.endpoint)
		return host == "cp-0", fmt.Sprintf("%q %v", host, err)
	})
	h.createControlPlaneMachine(m.name, "cp-1")
	var addressed, inHAProxy time.Time
	h.waitFor("cp-1 in HAProxy", 10*time.Minute, func() (bool, string) {
		if lm := h.libvirtMachine("cp-1"); addressed.IsZero() && lm != nil && loadbalancer.InternalIP(lm) != "" {
			addressed = time.Now()
		}
		servers, err := h.haproxyServers(m.domain)
		if _, ok := servers["cp-1"]; ok && err == nil {
			inHAProxy = time.Now()
		}
		return !addressed.IsZero() && !inHAProxy.IsZero(), fmt.Sprintf("servers %v, %v", servers, err)
	})
	h.t.Logf("BENCH backend_add_latency: %s from cp-1's LibvirtMachine reporting its address to HAProxy running it as a server",
		inHAProxy.Sub(addressed).Round(time.Millisecond))
	var got map[string]int
	h.waitFor("requests reaching both control planes", 10*time.Minute, func() (bool, string) {
		got = answers(m.endpoint, 8)
		return got["cp-0"] > 0 && got["cp-1"] > 0 && got["error"] == 0, fmt.Sprint(got)
	})
	h.t.Logf("8 requests through %s: %v", m.endpoint, got)
	lc := h.lc(m.name)
	if b := lc.Status.LoadBalancer.Backends; len(b) != 2 || b[0].State != infrav1.BackendActive || b[1].State != infrav1.BackendActive {
		h.t.Errorf("status backends %+v", b)
	}
}
