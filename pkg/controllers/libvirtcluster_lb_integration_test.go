package controllers_test

import (
	"fmt"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// testHealthCheck: an API server that stops answering /readyz gets no
// more requests; back up, it gets them again.
func testHealthCheck(h *clusterHarness, m *lbCluster) {
	cp0 := naming.DomainName(h.ns, "cp-0")
	stopped := time.Now()
	h.guestRun(cp0, "systemctl", "stop", "capl-readyz.service")
	h.waitFor("HAProxy to mark cp-0 down", time.Minute, func() (bool, string) {
		servers, err := h.haproxyServers(m.domain)
		return err == nil && strings.HasPrefix(servers["cp-0"].Status, "DOWN"), fmt.Sprint(servers, err)
	})
	h.t.Logf("BENCH health_check_removal: %s from stopping cp-0's API server to HAProxy marking it DOWN", time.Since(stopped).Round(time.Millisecond))
	if got := answers(m.endpoint, 6); got["cp-1"] != 6 {
		h.t.Errorf("with cp-0 down, 6 requests went to %v", got)
	}
	h.guestRun(cp0, "systemctl", "start", "capl-readyz.service")
	h.waitFor("cp-0 back in rotation", time.Minute, func() (bool, string) {
		got := answers(m.endpoint, 4)
		return got["cp-0"] > 0, fmt.Sprint(got)
	})
}

// guestRun runs a command in a domain through the guest agent.
func (h *clusterHarness) guestRun(domain, path string, args ...string) {
	h.t.Helper()
	res, err := h.host.GuestExec(h.ctx, domain, path, args, nil)
	must(h.t, err)
	if res.ExitCode != 0 {
		h.t.Fatalf("%s %v in %s: exit %d: %s", path, args, domain, res.ExitCode, res.Stderr)
	}
}

// testNoReload: reconciles with an unchanged backend set (the cluster and
// both control-plane LibvirtMachines touched repeatedly) never reload
// HAProxy: the worker process, the configuration ID and lastReloadTime
// stay.
func testNoReload(h *clusterHarness, m *lbCluster) {
	before := h.haproxyInfo(m.domain)
	lc := h.lc(m.name)
	hash, reloaded := lc.Status.LoadBalancer.ConfigHash, lc.Status.LoadBalancer.LastReloadTime
	start := reconciles(h.t)
	for i := range 5 {
		for _, target := range []struct {
			obj  client.Object
			name string
		}{{&infrav1.LibvirtCluster{}, m.name}, {&infrav1.LibvirtMachine{}, "cp-0"}, {&infrav1.LibvirtMachine{}, "cp-1"}} {
			before := reconciles(h.t)
			must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: target.name}, target.obj))
			patch := client.MergeFrom(target.obj.DeepCopyObject().(client.Object))
			a := target.obj.GetAnnotations()
			if a == nil {
				a = map[string]string{}
			}
			a["capl-test/touch"] = strconv.Itoa(i)
			target.obj.SetAnnotations(a)
			must(h.t, h.c.Patch(h.ctx, target.obj, patch))
			// One at a time: the work queue folds events that arrive together.
			h.waitFor(fmt.Sprintf("a reconcile after touching %s", target.name), time.Minute, func() (bool, string) {
				return reconciles(h.t) > before, "none yet"
			})
		}
	}
	after := h.haproxyInfo(m.domain)
	lc = h.lc(m.name)
	if after["Pid"] != before["Pid"] || after["description"] != before["description"] {
		h.t.Errorf("HAProxy reloaded: worker %s→%s, configuration %s→%s", before["Pid"], after["Pid"], before["description"], after["description"])
	}
	if lc.Status.LoadBalancer.ConfigHash != hash || !lc.Status.LoadBalancer.LastReloadTime.Equal(reloaded) {
		h.t.Errorf("configHash %s→%s, lastReloadTime %v→%v", hash, lc.Status.LoadBalancer.ConfigHash, reloaded, lc.Status.LoadBalancer.LastReloadTime)
	}
	h.t.Logf("%.0f reconciles later HAProxy worker %s still runs %s (uptime %s→%s s)",
		reconciles(h.t)-start, after["Pid"], after["description"], before["Uptime_sec"], after["Uptime_sec"])
}

// testDrain deletes cp-1: HAProxy stops sending it new connections (weight
// 0) while its VM still runs, only then is the VM shut down, and the
// server is removed once the machine is gone.
func testDrain(h *clusterHarness, m *lbCluster) {
	cp1 := naming.DomainName(h.ns, "cp-1")
	deleted := time.Now()
	must(h.t, h.c.Delete(h.ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "cp-1"}}))
	var drained, down, gone time.Time
	checkedTraffic := false
	h.waitFor("cp-1 drained, stopped and removed", 4*time.Minute, func() (bool, string) {
		servers, err := h.haproxyServers(m.domain)
		s, present := servers["cp-1"]
		if err == nil && drained.IsZero() && (!present || s.Weight == "0") {
			drained = time.Now()
		}
		info, derr := h.host.DomainInfo(h.ctx, cp1)
		running := derr == nil && info.State == "running"
		if !running && down.IsZero() {
			down = time.Now()
			if drained.IsZero() {
				h.t.Errorf("cp-1's VM is %s (%v) but HAProxy still gives it weight %s", info.State, derr, s.Weight)
			}
		}
		if !drained.IsZero() && running && !checkedTraffic {
			checkedTraffic = true
			if got := answers(m.endpoint, 6); got["cp-0"] != 6 {
				h.t.Errorf("while cp-1 drains, 6 new requests went to %v", got)
			}
		}
		if err == nil && !present && gone.IsZero() {
			gone = time.Now()
		}
		return !gone.IsZero() && h.libvirtMachine("cp-1") == nil, fmt.Sprintf("servers %v (%v), domain %+v (%v)", servers, err, info, derr)
	})
	h.t.Logf("BENCH backend_drain_latency: %s from deleting the Machine to weight 0 in HAProxy; VM stopped %s later; server removed %s after deletion",
		drained.Sub(deleted).Round(time.Millisecond), down.Sub(drained).Round(time.Millisecond), gone.Sub(deleted).Round(time.Millisecond))
	if !checkedTraffic {
		h.t.Log("the VM stopped before the test could send requests during the drain")
	}
	// status follows once the reconcile that reloaded HAProxy patches it.
	h.waitCluster(m.name, "status backends cp-0 only", time.Minute, func(lc *infrav1.LibvirtCluster) (bool, string) {
		b := lc.Status.LoadBalancer.Backends
		return len(b) == 1 && b[0].Machine == "cp-0" && b[0].State == infrav1.BackendActive, fmt.Sprintf("%+v", b)
	})
	if got := answers(m.endpoint, 4); got["cp-0"] != 4 {
		h.t.Errorf("after cp-1 left, requests went to %v", got)
	}

	// The cluster's story so far, as events (DomainDefined and DomainStarted
	// were lost to the crashes right after those steps).
	events := &corev1.EventList{}
	must(h.t, h.c.List(h.ctx, events, client.InNamespace(h.ns)))
	seen := map[string]int{}
	for _, ev := range events.Items {
		if ev.InvolvedObject.Kind == "LibvirtCluster" && ev.InvolvedObject.Name == m.name {
			seen[ev.Reason]++
		}
	}
	for _, reason := range []string{"ControlPlaneEndpointSet", "LoadBalancerReloaded", "Provisioned", infrav1.ReadyReason} {
		if seen[reason] == 0 {
			h.t.Errorf("no %s event on the LibvirtCluster (saw %v)", reason, seen)
		}
	}
}

// testClusterDeletion deletes the LibvirtCluster while cp-0 still exists:
// it waits, with the endpoint serving, until the machine is gone; then the
// HAProxy VM and the network go, with a manager crash after each delete
// step, and nothing remains in libvirt.
func testClusterDeletion(h *clusterHarness, m *lbCluster) {
	lc := h.lc(m.name)
	mac := lc.Status.LoadBalancer.Domain.MAC
	must(h.t, h.c.Delete(h.ctx, lc))
	lc = h.waitClusterCondition(m.name, infrav1.LoadBalancerReadyCondition, metav1.ConditionFalse, infrav1.WaitingForMachinesDeletionReason, time.Minute)
	if c := conditions.Get(lc, infrav1.LoadBalancerReadyCondition); !strings.Contains(c.Message, "cp-0") {
		h.t.Errorf("message %q does not name cp-0", c.Message)
	}
	if info, err := h.host.DomainInfo(h.ctx, m.domain); err != nil || info.State != "running" {
		h.t.Errorf("the HAProxy VM is %+v (%v) while machines remain", info, err)
	}
	if got := answers(m.endpoint, 2); got["cp-0"] != 2 {
		h.t.Errorf("while waiting, requests went to %v", got)
	}

	h.stopProvider()
	must(h.t, h.c.Delete(h.ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: "cp-0"}}))
	plan := newCrashPlan("DeleteDomain "+m.domain, "DeleteVolume "+naming.SeedVolumeName(m.domain),
		"DeleteVolume "+naming.OverlayVolumeName(m.domain), "ReleaseOwnedAddress "+mac, "DeleteNetwork "+m.network)
	h.run(plan, 4*time.Minute, nil)
	h.waitFor("LibvirtCluster gone", 2*time.Minute, func() (bool, string) {
		err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: m.name}, &infrav1.LibvirtCluster{})
		return err != nil, fmt.Sprint(err)
	})
	h.deleteAndWait(&clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: m.name}}, time.Minute)

	if _, err := h.host.DomainInfo(h.ctx, m.domain); !virt.IsNotFound(err) {
		h.t.Errorf("HAProxy VM left behind (%v)", err)
	}
	if _, err := h.host.UseNetwork(h.ctx, m.network); !virt.IsNotFound(err) {
		h.t.Errorf("network %s left behind (%v)", m.network, err)
	}
	// Only the shared base images remain in the pool; the harness checks
	// the whole host once the test's own pool and network are gone too.
	for _, vol := range h.poolVolumes() {
		if !strings.HasPrefix(vol, naming.ImageVolumeName("")) {
			h.t.Errorf("volume %s left behind", vol)
		}
	}
}
