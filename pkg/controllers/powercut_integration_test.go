package controllers_test

import (
	"bytes"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"libvirt.org/go/libvirt"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/guest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestPowerCutAroundBootstrap cuts the power of booting machines (vCPUs
// stopped, then QEMU killed: what the guest had not written to its disk is
// lost) and lets the provider start them again:
//
//   - right after the guest wrote its bootstrap sentinel and before the
//     provider read it (its Cluster paused): the machine must end
//     BootstrapSucceeded, provisioned, its seed emptied. On the code before
//     the sentinel vendor-data it ended BootstrapFailed for good: the
//     sentinel was in /run, and cloud-init does not rerun the bootstrap.
//   - in the middle of the bootstrap: the machine must end BootstrapFailed
//     with a message saying why, not wait for the sentinel forever. It did
//     before too, with a message that only blamed the bootstrap; the case
//     keeps the link to the disk from changing the outcome.
//
// Both machines boot at once, 1 vCPU and 512 MiB each.
func TestPowerCutAroundBootstrap(t *testing.T) {
	if testing.Short() && !testprereq.InCI() {
		t.Skip("integration test: not run with -short outside CI")
	}
	// Runs in make test: a run without a libvirtd or the image must not
	// pass by skipping.
	for _, env := range []string{testlibvirt.EnvURI, testlibvirt.EnvImage} {
		if os.Getenv(env) == "" {
			t.Fatalf("%s is not set: run the test through `make test`, which sets it", env)
		}
	}
	h := newHarness(t)
	h.startProvider(nil)
	// One import before both machines ask for the image.
	_, err := h.host.ImportImage(h.ctx, virt.ImageImport{Pool: h.pool, Volume: naming.ImageVolumeName(h.imageSum),
		Source: h.image, Policy: testlibvirt.FilePolicy(h.image), SHA256: h.imageSum})
	must(t, err)

	t.Run("RightAfterTheSentinel", func(t *testing.T) { t.Parallel(); testCutAfterSentinel(h.forSubtest(t)) })
	t.Run("DuringTheBootstrap", func(t *testing.T) { t.Parallel(); testCutDuringBootstrap(h.forSubtest(t)) })
}

// testCutAfterSentinel: the guest writes the sentinel the way Cluster API's
// kubeadm bootstrap does (a write_files placeholder in /run/cluster-api,
// then the sentinel from runcmd); the test reads it through the guest
// agent while the provider is paused, and cuts the power the moment it
// appears.
func testCutAfterSentinel(h *harness) {
	const name = "cut-after"
	start := time.Now()
	cluster := testlibvirt.Name(h.t)
	h.createCluster(cluster, true)
	h.createMachine(name, machineOpts{cluster: cluster, withData: true, userData: `#cloud-config
# ` + secretMarker + `
write_files:
- path: /run/cluster-api/placeholder
  permissions: '0640'
  content: placeholder
runcmd:
- 'mkdir -p /run/cluster-api && echo success > ` + guest.SentinelPath + `'
`})
	domain := naming.DomainName(h.ns, name)
	h.waitFor(name+" provisioned", 12*time.Minute, func() (bool, string) {
		lm := h.lm(name)
		return lm.Status.Initialization.IsProvisioned(), fmt.Sprintf("addresses %v", lm.Status.Addresses)
	})
	// Paused, the provider reads nothing from the guest: the sentinel can
	// only be lost or kept by the guest.
	h.setClusterPaused(cluster, true)
	lm := h.waitCondition(name, clusterv1.PausedCondition, metav1.ConditionTrue, clusterv1.PausedReason, time.Minute)
	if conditions.IsTrue(lm, infrav1.BootstrapSucceededCondition) {
		h.t.Fatal("the provider read the sentinel before the Cluster was paused: there was nothing left to cut")
	}
	cutPower := h.powerSwitch(domain)
	// Written, not only created: the shell opens the file before echo
	// writes to it.
	h.waitFor("the sentinel in "+domain, 15*time.Minute, func() (bool, string) {
		data, err := h.host.GuestReadFile(h.ctx, domain, guest.SentinelPath)
		return err == nil && string(data) == "success\n", fmt.Sprintf("%q, %v", data, err)
	})
	seen := time.Now()
	frozen := cutPower()
	h.t.Logf("guest stopped %s after the sentinel was read", frozen.Round(time.Millisecond))
	cut := time.Now()

	h.setClusterPaused(cluster, false)
	lm = h.waitBootstrapSucceeded(name, 15*time.Minute)
	succeeded := time.Now()
	if !lm.Status.Initialization.IsProvisioned() {
		h.t.Error("not provisioned")
	}
	if !h.hasEvent(name, "DomainRestarted") {
		h.t.Error("no DomainRestarted event: the provider did not start the cut domain")
	}
	// What the bootstrap left in /run/cluster-api before the cut is there
	// after the reboot, read through the link.
	for path, want := range map[string]string{guest.SentinelPath: "success\n", "/run/cluster-api/placeholder": "placeholder"} {
		if got, err := h.host.GuestReadFile(h.ctx, domain, path); err != nil || string(got) != want {
			h.t.Errorf("%s after the reboot: %q, %v; want %q", path, got, err, want)
		}
	}
	h.waitSeedEmptied(name)
	h.t.Logf("BENCH power_cut_after_sentinel: %s from creation to BootstrapSucceeded after the cut (%s to the sentinel, %s from the cut)",
		succeeded.Sub(start).Round(time.Second), seen.Sub(start).Round(time.Second), succeeded.Sub(cut).Round(time.Second))

	mac := lm.Status.Domain.MAC
	h.deleteMachine(name, 3*time.Minute)
	h.assertClean(name, mac)
}

// testCutDuringBootstrap: runcmd marks that the bootstrap started, then
// sleeps in place of kubeadm; the power is cut during the sleep. The
// marker comes after a sync, so that cloud-init's record that it started
// runcmd is on the disk when the test sees it, as it is a few seconds into
// any real bootstrap (ext4 commits every 5 s): a cut before that reruns
// the bootstrap, which is not the case under test.
func testCutDuringBootstrap(h *harness) {
	const name = "cut-during"
	const marker = "/run/capl-test-bootstrapping"
	start := time.Now()
	cluster := testlibvirt.Name(h.t)
	h.createCluster(cluster, true)
	h.createMachine(name, machineOpts{cluster: cluster, withData: true, userData: `#cloud-config
# ` + secretMarker + `
runcmd:
- 'sync && touch ` + marker + ` && sleep 3600 && mkdir -p /run/cluster-api && echo success > ` + guest.SentinelPath + `'
`})
	domain := naming.DomainName(h.ns, name)
	cutPower := h.powerSwitch(domain)
	h.waitFor("the bootstrap to start in "+domain, 15*time.Minute, func() (bool, string) {
		_, err := h.host.GuestReadFile(h.ctx, domain, marker)
		return err == nil, fmt.Sprint(err)
	})
	cutPower()
	cut := time.Now()

	lm := h.waitCondition(name, infrav1.BootstrapSucceededCondition, metav1.ConditionFalse, infrav1.BootstrapFailedReason, 15*time.Minute)
	failed := time.Now()
	msg := conditions.Get(lm, infrav1.BootstrapSucceededCondition).Message
	h.t.Logf("BootstrapFailed: %s", msg)
	if !strings.Contains(msg, guest.SentinelPath) || !strings.Contains(msg, "went down") {
		h.t.Errorf("message %q should name the sentinel and say that the guest may have gone down during the bootstrap", msg)
	}
	// The guest rebooted (its /run is new) and the bootstrap did not run
	// again.
	if _, err := h.host.GuestReadFile(h.ctx, domain, marker); !virt.IsNotFound(err) {
		h.t.Errorf("%s after the reboot: %v, want not found", marker, err)
	}
	if lm.Status.BootstrapDataRemoved {
		h.t.Error("the bootstrap data was removed although the bootstrap never succeeded")
	}
	h.t.Logf("BENCH power_cut_during_bootstrap: %s from creation to BootstrapFailed after the cut (%s to the cut, %s from the cut)",
		failed.Sub(start).Round(time.Second), cut.Sub(start).Round(time.Second), failed.Sub(cut).Round(time.Second))

	mac := lm.Status.Domain.MAC
	h.deleteMachine(name, 3*time.Minute)
	h.assertClean(name, mac)
}

// forSubtest is h for a parallel subtest: the same plane, libvirt objects
// and provider, with t for failures and its own lock. The provider and its
// cleanup stay with h.
func (h *harness) forSubtest(t *testing.T) *harness {
	return &harness{t: t, ctx: h.ctx, env: h.env, c: h.c, uri: h.uri, image: h.image, imageSum: h.imageSum,
		host: h.host, pool: h.pool, poolPath: h.poolPath, network: h.network, ns: h.ns, logs: h.logs, logPath: h.logPath}
}

// powerSwitch returns a function that cuts the power of the running
// domain and returns how long the guest still ran once it was called. The
// connection is opened beforehand, and the guest's vCPUs are stopped
// (virDomainSuspend, milliseconds) before QEMU is killed
// (virDomainDestroy, seconds under load): from the guest's view the power
// goes at once, and what it had not written to its disk is lost. The
// domain stays defined.
func (h *harness) powerSwitch(domain string) (cut func() time.Duration) {
	h.t.Helper()
	conn, err := libvirt.NewConnect(h.uri)
	must(h.t, err)
	h.t.Cleanup(func() { _, _ = conn.Close() })
	return func() time.Duration {
		h.t.Helper()
		start := time.Now()
		dom, err := conn.LookupDomainByName(domain)
		must(h.t, err)
		defer dom.Free()
		must(h.t, dom.Suspend())
		ran := time.Since(start)
		must(h.t, dom.Destroy())
		return ran
	}
}

// waitBootstrapSucceeded waits for BootstrapSucceeded True and fails at
// once on BootstrapFailed, which the provider would not take back.
func (h *harness) waitBootstrapSucceeded(name string, timeout time.Duration) *infrav1.LibvirtMachine {
	h.t.Helper()
	var lm *infrav1.LibvirtMachine
	h.waitFor(name+" BootstrapSucceeded", timeout, func() (bool, string) {
		lm = h.lm(name)
		c := conditions.Get(lm, infrav1.BootstrapSucceededCondition)
		if c == nil {
			return false, "condition absent"
		}
		if c.Reason == infrav1.BootstrapFailedReason {
			h.t.Fatalf("%s: BootstrapSucceeded %s/%s: %s", name, c.Status, c.Reason, c.Message)
		}
		return c.Status == metav1.ConditionTrue, fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message)
	})
	return lm
}

// waitSeedEmptied waits until the provider recorded the removal of the
// bootstrap data and checks the seed volume: the seed of the machine's
// instance-id and hostname without user-data or vendor-data, then zeros.
func (h *harness) waitSeedEmptied(name string) {
	h.t.Helper()
	var lm *infrav1.LibvirtMachine
	h.waitFor(name+" bootstrap data removed", 2*time.Minute, func() (bool, string) {
		lm = h.lm(name)
		return lm.Status.BootstrapDataRemoved, "not yet"
	})
	want, err := cloudinit.BuildISO(cloudinit.Seed{InstanceID: lm.Status.Domain.UUID, LocalHostname: name})
	must(h.t, err)
	got, err := h.host.ReadVolume(h.ctx, h.pool, naming.SeedVolumeName(lm.Status.Domain.Name), 1<<20)
	must(h.t, err)
	if !bytes.HasPrefix(got, want) || len(bytes.Trim(got[len(want):], "\x00")) > 0 {
		h.t.Errorf("the seed volume (%d bytes) is not the emptied seed (%d bytes) padded with zeros", len(got), len(want))
	}
}

// hasEvent tells whether the LibvirtMachine name has an event with reason.
func (h *harness) hasEvent(name, reason string) bool {
	h.t.Helper()
	events := &corev1.EventList{}
	must(h.t, h.c.List(h.ctx, events, client.InNamespace(h.ns)))
	for _, ev := range events.Items {
		if ev.InvolvedObject.Kind == "LibvirtMachine" && ev.InvolvedObject.Name == name && ev.Reason == reason {
			return true
		}
	}
	return false
}
