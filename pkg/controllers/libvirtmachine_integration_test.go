package controllers_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/guest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestLibvirtMachine runs the LibvirtMachine controller against envtest,
// Cluster API's own Cluster and Machine controllers and a real libvirtd.
// To keep these scenarios free of the HAProxy VM, the LibvirtClusters are
// marked managed-by: the test creates the cluster network with the engine
// and sets LibvirtCluster.status itself (the end-to-end suite runs the
// real LibvirtCluster controller).
// Scenarios share one management plane and run in order; booted VMs are
// shared where possible (each costs ~2 minutes of CPU under TCG).
func TestLibvirtMachine(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	h := newHarness(t)
	clusterA := testlibvirt.Name(t)
	h.createCluster(clusterA, true)
	h.startProvider(nil)

	t.Run("WaitsForClusterInfrastructureAndBootstrapData", func(t *testing.T) { h.t = t; testWaits(h) })
	t.Run("PauseAndUnpause", func(t *testing.T) { h.t = t; testPause(h, clusterA) })
	t.Run("MissingBaseImage", func(t *testing.T) { h.t = t; testMissingImage(h, clusterA) })
	t.Run("DeleteAfterLibvirtClusterGone", func(t *testing.T) { h.t = t; testLibvirtClusterGone(h) })
	t.Run("RestartBetweenEveryCreateStep", func(t *testing.T) { h.t = t; testRestarts(h, clusterA) })
	t.Run("BadBootstrapFormat", func(t *testing.T) { h.t = t; testBadFormat(h, clusterA) })
	t.Run("DeleteDuringCreation", func(t *testing.T) { h.t = t; testDeleteDuringCreation(h, clusterA) })
	t.Run("LibvirtdRestartedMidReconcile", func(t *testing.T) {
		testlibvirt.SoakOnly(t, "the e2e kills and restarts libvirtd while a machine of its cluster is created")
		h.t = t
		testLibvirtdRestart(h, clusterA)
	})
	t.Run("StuckImageServers", func(t *testing.T) { h.t = t; testStuckImageServers(h, clusterA) })
	t.Run("DomainDestroyedBehindOurBack", func(t *testing.T) { h.t = t; testDestroyedBehindOurBack(h, clusterA) })
	t.Run("BootedMachines", func(t *testing.T) {
		testlibvirt.SoakOnly(t, "every machine of the e2e's kubeadm cluster boots through its reservation to an address, "+
			"BootstrapSucceeded, a Node with its providerID and the domain's UUID, and the report gives the latencies")
		h.t = t
		testBootedMachines(h, clusterA)
	})
	h.t = t
	h.cleanupMachines() // leftovers of a failed scenario, so the checks below judge the rest

	// Only the shared base image may remain in the pool, and no host entry
	// on the network; AssertNothingOwned checks the host once the pool and
	// network are gone too.
	if vols := h.poolVolumes(); len(vols) != 1 || vols[0] != naming.ImageVolumeName(h.imageSum) {
		t.Errorf("pool holds %v, want only the base image", vols)
	}
	if entries, err := h.host.Reservations(h.ctx, h.network.Name); err != nil || len(entries) != 0 {
		t.Errorf("network host entries left: %v (%v)", entries, err)
	}
	h.assertNoSecretLeaks()
}

// testWaits: both waits are conditions, neither creates anything nor blocks
// deletion, and each ends when what it waits for arrives.
func testWaits(h *harness) {
	clusterB := testlibvirt.Name(h.t)
	h.createCluster(clusterB, false)
	// wi-0 as an earlier release made it: its finalizer under the legacy
	// name, which the controller replaces.
	h.createMachine("wi-0", machineOpts{cluster: clusterB, withData: true, finalizers: []string{infrav1.LegacyMachineFinalizer}})
	h.createMachine("wi-1", machineOpts{cluster: clusterB})
	lm := h.waitCondition("wi-0", infrav1.DomainReadyCondition, metav1.ConditionFalse, infrav1.WaitingForClusterInfrastructureReason, time.Minute)
	if !slices.Equal(lm.Finalizers, []string{infrav1.MachineFinalizer}) {
		h.t.Errorf("finalizers while waiting: %v, want the legacy one replaced by %s", lm.Finalizers, infrav1.MachineFinalizer)
	}
	h.waitCondition("wi-1", infrav1.BootstrapDataReadyCondition, metav1.ConditionFalse, infrav1.WaitingForClusterInfrastructureReason, time.Minute)
	h.assertNoLibvirtObjects("wi-0")

	start := time.Now()
	h.deleteMachine("wi-0", time.Minute)
	h.t.Logf("deleted while waiting for cluster infrastructure in %s", time.Since(start).Round(time.Millisecond))

	h.provisionCluster(clusterB)
	lm = h.waitCondition("wi-1", infrav1.BootstrapDataReadyCondition, metav1.ConditionFalse, infrav1.WaitingForBootstrapDataReason, time.Minute)
	if r := conditions.Get(lm, clusterv1.ReadyCondition); r == nil || r.Status != metav1.ConditionFalse {
		h.t.Errorf("Ready = %+v while waiting", r)
	}
	h.assertNoLibvirtObjects("wi-1")
	start = time.Now()
	h.deleteMachine("wi-1", time.Minute)
	h.t.Logf("deleted before bootstrap data in %s", time.Since(start).Round(time.Millisecond))
}

// testPause: a paused Cluster (or annotation) stops reconciliation,
// reported by the Paused condition; unpausing resumes it.
func testPause(h *harness, cluster string) {
	missing := &infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "capltest-no-such-image"}}
	h.createMachine("pz", machineOpts{cluster: cluster, image: missing})
	h.waitCondition("pz", infrav1.BootstrapDataReadyCondition, metav1.ConditionFalse, infrav1.WaitingForBootstrapDataReason, time.Minute)

	h.setClusterPaused(cluster, true)
	h.waitCondition("pz", clusterv1.PausedCondition, metav1.ConditionTrue, clusterv1.PausedReason, time.Minute)
	before := testenv.ActivityOf(h.t, "libvirtmachine")
	h.setBootstrapData("pz")
	before.WaitSettled(h.t, time.Minute)
	h.assertNoLibvirtObjects("pz")
	if c := conditions.Get(h.lm("pz"), infrav1.BootstrapDataReadyCondition); c.Reason != infrav1.WaitingForBootstrapDataReason {
		h.t.Errorf("reconciled while paused: %+v", c)
	}

	h.setClusterPaused(cluster, false)
	h.waitCondition("pz", clusterv1.PausedCondition, metav1.ConditionFalse, clusterv1.NotPausedReason, time.Minute)
	lm := h.waitCondition("pz", infrav1.DiskReadyCondition, metav1.ConditionFalse, infrav1.ImageNotFoundReason, time.Minute)

	// The annotation pauses the one object.
	patch := client.MergeFrom(lm.DeepCopy())
	lm.Annotations[clusterv1.PausedAnnotation] = ""
	must(h.t, h.c.Patch(h.ctx, lm, patch))
	h.waitCondition("pz", clusterv1.PausedCondition, metav1.ConditionTrue, clusterv1.PausedReason, time.Minute)
	lm = h.lm("pz")
	patch = client.MergeFrom(lm.DeepCopy())
	delete(lm.Annotations, clusterv1.PausedAnnotation)
	must(h.t, h.c.Patch(h.ctx, lm, patch))
	h.waitCondition("pz", clusterv1.PausedCondition, metav1.ConditionFalse, clusterv1.NotPausedReason, time.Minute)

	mac := h.lm("pz").Status.Domain.MAC
	h.deleteMachine("pz", time.Minute)
	h.assertClean("pz", mac)
}

// testMissingImage: a base image that does not exist is a DiskReady reason.
func testMissingImage(h *harness, cluster string) {
	img := &infrav1.ImageSource{URL: "file:///var/cache/capi-libvirt/images/no-such-image.qcow2", Checksum: "sha256:" + strings.Repeat("0", 64)}
	h.createMachine("noimg", machineOpts{cluster: cluster, withData: true, image: img})
	lm := h.waitCondition("noimg", infrav1.DiskReadyCondition, metav1.ConditionFalse, infrav1.ImageNotFoundReason, time.Minute)
	if c := conditions.Get(lm, infrav1.DiskReadyCondition); !strings.Contains(c.Message, "no-such-image.qcow2") {
		h.t.Errorf("message %q does not name the image", c.Message)
	}
	if r := conditions.Get(lm, clusterv1.ReadyCondition); r.Status != metav1.ConditionFalse || !strings.Contains(r.Message, "DiskReady") {
		h.t.Errorf("Ready = %+v", r)
	}
	h.deleteMachine("noimg", time.Minute)
	h.assertClean("noimg", lm.Status.Domain.MAC)
}

// testLibvirtClusterGone: a machine whose LibvirtCluster was deleted still
// cleans up, from what the LibvirtMachine itself recorded (pool, network,
// MAC).
func testLibvirtClusterGone(h *harness) {
	clusterC := testlibvirt.Name(h.t)
	h.createCluster(clusterC, true)
	missing := &infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "capltest-no-such-image"}}
	h.createMachine("orph", machineOpts{cluster: clusterC, withData: true, image: missing})
	lm := h.waitCondition("orph", infrav1.DiskReadyCondition, metav1.ConditionFalse, infrav1.ImageNotFoundReason, time.Minute)
	if _, ok := h.reservation(lm.Status.Domain.MAC); !ok {
		h.t.Fatal("no reservation to clean up")
	}
	must(h.t, h.c.Delete(h.ctx, &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: clusterC}}))
	h.waitFor("LibvirtCluster gone", time.Minute, func() (bool, string) {
		err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: clusterC}, &infrav1.LibvirtCluster{})
		return err != nil, fmt.Sprint(err)
	})
	h.deleteMachine("orph", time.Minute)
	h.assertClean("orph", lm.Status.Domain.MAC)
}

// testRestarts kills the manager right after each create step succeeded in
// libvirt and before the reconcile could record it, then starts a new one:
// every step must converge without duplicates or leaks.
func testRestarts(h *harness, cluster string) {
	h.stopProvider()
	name := "crash"
	domain := naming.DomainName(h.ns, name)
	h.createMachine(name, machineOpts{cluster: cluster, withData: true})
	checks := map[string]func(lm *infrav1.LibvirtMachine){
		"ReserveAddress": func(lm *infrav1.LibvirtMachine) {
			if lm.Status.Domain == nil || lm.Status.Domain.MAC == "" {
				h.t.Fatal("MAC not persisted before the reservation")
			}
			if _, ok := h.reservation(lm.Status.Domain.MAC); !ok {
				h.t.Error("no reservation after ReserveAddress")
			}
		},
		"ImportImage": func(*infrav1.LibvirtMachine) {
			if _, err := h.host.VolumeInfo(h.ctx, h.pool, naming.ImageVolumeName(h.imageSum)); err != nil {
				h.t.Error(err)
			}
		},
		"EnsureOverlay": func(*infrav1.LibvirtMachine) {
			if _, err := h.host.VolumeInfo(h.ctx, h.pool, naming.OverlayVolumeName(domain)); err != nil {
				h.t.Error(err)
			}
		},
		"UploadVolume": func(lm *infrav1.LibvirtMachine) {
			if _, err := h.host.VolumeInfo(h.ctx, h.pool, naming.SeedVolumeName(domain)); err != nil {
				h.t.Error(err)
			}
			if conditions.IsTrue(lm, infrav1.BootstrapDataReadyCondition) {
				h.t.Error("seed recorded although the manager crashed right after the upload")
			}
		},
		"EnsureDomain": func(lm *infrav1.LibvirtMachine) {
			// The UUID was recorded before anything was made: the domain
			// a crash leaves behind is the machine's, found by it.
			info, err := h.host.DomainInfo(h.ctx, domain)
			if err != nil {
				h.t.Error(err)
			} else if lm.Spec.ProviderID != infrav1.ProviderIDPrefix+info.UUID {
				h.t.Errorf("providerID %q recorded before defining, the domain has UUID %s", lm.Spec.ProviderID, info.UUID)
			}
		},
		"StartDomain": func(*infrav1.LibvirtMachine) {
			if info, err := h.host.DomainInfo(h.ctx, domain); err != nil || info.State != "running" {
				h.t.Errorf("domain %+v, %v", info, err)
			}
		},
	}
	for _, step := range []string{"ReserveAddress", "ImportImage", "EnsureOverlay", "UploadVolume", "EnsureDomain", "StartDomain"} {
		crashed := make(chan struct{})
		var once sync.Once
		h.startProvider(func(inner virt.Host) virt.Host {
			return &hookHost{Host: inner, after: func(ctx context.Context, method string, err error) error {
				if err != nil || method != step {
					return err
				}
				once.Do(func() { close(crashed) })
				<-ctx.Done() // the manager dies before anything else is persisted
				return errSimulatedCrash
			}}
		})
		select {
		case <-crashed:
		case <-time.After(3 * time.Minute):
			h.t.Fatalf("step %s never ran", step)
		}
		h.stopProvider()
		checks[step](h.lm(name))
		h.t.Logf("manager killed right after %s; restarting", step)
	}
	h.startProvider(nil)
	lm := h.waitCondition(name, infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 2*time.Minute)

	// No duplicates: one host entry, one domain with our UUID, one overlay
	// and one seed next to the base image, and no import marker.
	entries, err := h.host.Reservations(h.ctx, h.network.Name)
	must(h.t, err)
	if len(entries) != 1 || !netalloc.SameMAC(entries[0].MAC.String(), lm.Status.Domain.MAC) {
		h.t.Errorf("host entries %v, want exactly one for %s", entries, lm.Status.Domain.MAC)
	}
	info, err := h.host.DomainInfo(h.ctx, domain)
	must(h.t, err)
	if lm.Spec.ProviderID != infrav1.ProviderIDPrefix+info.UUID {
		h.t.Errorf("domain UUID %s, providerID %s", info.UUID, lm.Spec.ProviderID)
	}
	want := []string{naming.ImageVolumeName(h.imageSum), naming.OverlayVolumeName(domain), naming.SeedVolumeName(domain), naming.ConsoleLogVolumeName(domain)}
	if got := h.poolVolumes(); fmt.Sprint(got) != fmt.Sprint(sortedCopy(want)) {
		h.t.Errorf("pool holds %v, want %v", got, sortedCopy(want))
	}
	h.deleteMachine(name, 2*time.Minute)
	h.assertClean(name, lm.Status.Domain.MAC)
}

// testBadFormat: a Secret in a format other than cloud-config is a clear
// condition; nothing boots.
func testBadFormat(h *harness, cluster string) {
	h.createMachine("fmt", machineOpts{cluster: cluster, withData: true, format: "ignition"})
	lm := h.waitCondition("fmt", infrav1.BootstrapDataReadyCondition, metav1.ConditionFalse, infrav1.UnsupportedBootstrapFormatReason, 2*time.Minute)
	if c := conditions.Get(lm, infrav1.BootstrapDataReadyCondition); !strings.Contains(c.Message, `"ignition"`) {
		h.t.Errorf("message %q", c.Message)
	}
	if _, err := h.host.DomainInfo(h.ctx, naming.DomainName(h.ns, "fmt")); !virt.IsNotFound(err) {
		h.t.Errorf("a domain was defined without valid bootstrap data (%v)", err)
	}
	h.deleteMachine("fmt", time.Minute)
	h.assertClean("fmt", lm.Status.Domain.MAC)
}

// testDeleteDuringCreation deletes the Machine as soon as its domain is
// defined, while the reconcile is still creating.
func testDeleteDuringCreation(h *harness, cluster string) {
	h.createMachine("del", machineOpts{cluster: cluster, withData: true})
	domain := naming.DomainName(h.ns, "del")
	h.waitFor("domain "+domain+" defined", 2*time.Minute, func() (bool, string) {
		_, err := h.host.DomainInfo(h.ctx, domain)
		return err == nil, fmt.Sprint(err)
	})
	mac := h.lm("del").Status.Domain.MAC
	start := time.Now()
	h.deleteMachine("del", 2*time.Minute)
	h.t.Logf("deleted during creation in %s", time.Since(start).Round(time.Millisecond))
	h.assertClean("del", mac)
}

// testLibvirtdRestart restarts libvirtd while a reconcile is between
// defining and starting the domain; the machine must still start and get
// its address (lease watch and events survive the reconnect).
func testLibvirtdRestart(h *harness, cluster string) {
	h.stopProvider()
	domain := naming.DomainName(h.ns, "lvd")
	var once sync.Once
	h.startProvider(func(inner virt.Host) virt.Host {
		return &hookHost{Host: inner, before: func(_ context.Context, method, object string) {
			if method == "StartDomain" && object == domain {
				once.Do(func() {
					took, err := restartLibvirtd(h.uri)
					if err != nil {
						h.t.Errorf("restarting libvirtd: %v", err)
						return
					}
					h.t.Logf("libvirtd restarted (stopped and back) in %s", took.Round(time.Millisecond))
				})
			}
		}}
	})
	h.createMachine("lvd", machineOpts{cluster: cluster, withData: true})
	h.waitCondition("lvd", infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason, 3*time.Minute)
	lm := h.waitAddress("lvd", 6*time.Minute)
	if ip, ok := h.leaseIP(lm.Status.Domain.MAC); !ok || internalIP(lm) != ip.String() {
		h.t.Errorf("addresses %v, lease %s", lm.Status.Addresses, ip)
	}
	h.deleteMachine("lvd", 2*time.Minute)
	h.assertClean("lvd", lm.Status.Domain.MAC)
	h.stopProvider()
	h.startProvider(nil)
}

// testDestroyedBehindOurBack boots one machine until it is provisioned
// (its guest took an address), then destroys and undefines its domain
// outside the provider: a vanished domain of a provisioned machine is a
// terminal failure the Machine carries, and provisioned stays true.
func testDestroyedBehindOurBack(h *harness, cluster string) {
	h.booted = true
	h.createMachine("d0", machineOpts{cluster: cluster, userData: bootUserData(), dataDisks: []infrav1.DataDisk{{Name: "scratch", SizeGiB: 2}}})
	h.setBootstrapData("d0")
	var lm *infrav1.LibvirtMachine
	h.waitFor("d0 provisioned", 6*time.Minute, func() (bool, string) {
		lm = h.lm("d0")
		return lm.Status.Initialization.IsProvisioned(), fmt.Sprintf("addresses %v", lm.Status.Addresses)
	})
	h.checkDataDisk(lm.Status.Domain.Name, "scratch", 2<<30)
	mac := lm.Status.Domain.MAC
	h.destroyBehindOurBack(lm.Status.Domain.Name)
	h.waitFor("terminal failure of d0", 2*time.Minute, func() (bool, string) {
		lm := h.lm("d0")
		return ptr.Deref(lm.Status.FailureReason, "") == scope.FailureReasonUpdate, fmt.Sprint(lm.Status.FailureReason)
	})
	h.waitCondition("d0", infrav1.DomainReadyCondition, metav1.ConditionFalse, infrav1.DomainMissingReason, time.Minute)
	h.waitFor("Machine d0 to carry the failure", time.Minute, func() (bool, string) {
		m := h.machine("d0")
		d := m.Status.Deprecated
		return d != nil && d.V1Beta1 != nil && d.V1Beta1.FailureReason != nil, "not yet"
	})
	if lm := h.lm("d0"); !lm.Status.Initialization.IsProvisioned() {
		h.t.Error("provisioned went back to false")
	}
	h.deleteMachine("d0", 3*time.Minute)
	h.assertClean("d0", mac)
}

// checkDataDisk asks the guest of domain, through its agent, what its data
// disk named disk is: the device its /dev/disk/by-id/virtio-<disk> link
// names, of size bytes.
func (h *harness) checkDataDisk(domain, disk string, size uint64) {
	h.t.Helper()
	link := "/dev/disk/by-id/virtio-" + disk
	var out string
	h.waitFor("the guest's view of data disk "+disk, 2*time.Minute, func() (bool, string) {
		res, err := h.host.GuestExec(h.ctx, domain, "/bin/sh", []string{"-c", "readlink -f " + link + " && blockdev --getsize64 " + link}, nil)
		if err != nil {
			return false, err.Error()
		}
		out = strings.TrimSpace(string(res.Stdout))
		return res.ExitCode == 0, fmt.Sprintf("exit %d: %s%s", res.ExitCode, res.Stdout, res.Stderr)
	})
	if want := fmt.Sprintf("/dev/vdb\n%d", size); out != want {
		h.t.Errorf("%s in the guest: %q, want %q (the first data disk, of its size)", link, out, want)
	}
	h.t.Logf("the guest sees data disk %s as %s", disk, strings.ReplaceAll(out, "\n", ", "))
}

// testBootedMachines boots three small VMs at once: it measures the
// controller's latencies and runs the full happy path on one (bootstrap
// sentinel and Node identity from the real guest). (Three, not more: the
// e2e suite boots its cluster's machines together; here the batch only
// has to be concurrent.)
func testBootedMachines(h *harness, cluster string) {
	names := []string{"b0", "b1", "b2"}
	// The figures are the controller's overhead, not a one-off 150 MiB
	// import: make sure the base image is in the pool (a no-op after the
	// earlier scenarios).
	_, err := h.host.ImportImage(h.ctx, virt.ImageImport{Pool: h.pool, Volume: naming.ImageVolumeName(h.imageSum),
		Source: h.image, Policy: testlibvirt.FilePolicy(h.image), SHA256: h.imageSum})
	must(h.t, err)
	for _, n := range names {
		h.createMachine(n, machineOpts{cluster: cluster, userData: bootUserData(), failureDomain: "fd-1"})
	}
	for _, n := range names {
		h.waitCondition(n, infrav1.BootstrapDataReadyCondition, metav1.ConditionFalse, infrav1.WaitingForBootstrapDataReason, time.Minute)
	}

	// Domain start times come from our own libvirt event subscription.
	subCtx, cancel := context.WithCancel(h.ctx)
	defer cancel()
	events := h.host.Subscribe(subCtx)
	var mu sync.Mutex
	started := map[string]time.Time{}
	go func() {
		for ev := range events {
			if ev.Kind == virt.EventDomainStarted {
				mu.Lock()
				if _, ok := started[ev.Domain]; !ok {
					started[ev.Domain] = time.Now()
				}
				mu.Unlock()
			}
		}
	}()
	eligible := map[string]time.Time{}
	for _, n := range names {
		eligible[n] = time.Now()
		h.setBootstrapData(n)
	}
	leased, addressed := map[string]time.Time{}, map[string]time.Time{}
	h.waitFor("addresses of all three machines", 12*time.Minute, func() (bool, string) {
		for _, n := range names {
			lm := h.lm(n)
			if lm.Status.Domain == nil || lm.Status.Domain.MAC == "" {
				continue
			}
			now := time.Now()
			if _, ok := leased[n]; !ok {
				if _, ok := h.leaseIP(lm.Status.Domain.MAC); ok {
					leased[n] = now
				}
			}
			if _, ok := addressed[n]; !ok && internalIP(lm) != "" {
				addressed[n] = now
			}
		}
		return len(addressed) == len(names), fmt.Sprintf("%d of %d have addresses", len(addressed), len(names))
	})
	cancel()
	var toStart, toAddress []time.Duration
	mu.Lock()
	for _, n := range names {
		s, ok := started[naming.DomainName(h.ns, n)]
		if !ok {
			h.t.Errorf("no DomainStarted event for %s", n)
			continue
		}
		toStart = append(toStart, s.Sub(eligible[n]))
		if l, ok := leased[n]; ok {
			toAddress = append(toAddress, max(addressed[n].Sub(l), 0))
		}
	}
	mu.Unlock()
	report := func(what string, ds []time.Duration) {
		line := fmt.Sprintf("BENCH %s median=%s n=%d samples=%v", what, median(ds).Round(time.Millisecond), len(ds), roundAll(ds))
		h.t.Log(line)
		fmt.Println(line)
	}
	report("eligible-to-started", toStart)
	report("lease-to-address", toAddress)

	// Free the CPU for b0's cloud-init: delete the others at once.
	macs := map[string]string{}
	for _, n := range names[1:] {
		macs[n] = h.lm(n).Status.Domain.MAC
		must(h.t, client.IgnoreNotFound(h.c.Delete(h.ctx, &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: n}})))
	}
	for _, n := range names[1:] {
		h.deleteMachine(n, 3*time.Minute)
		h.assertClean(n, macs[n])
	}

	happyPath(h, "b0")
	mac := h.lm("b0").Status.Domain.MAC
	h.deleteMachine("b0", 2*time.Minute)
	h.assertClean("b0", mac)
}

// happyPath checks the whole contract on a booted machine.
func happyPath(h *harness, name string) {
	lm := h.waitCondition(name, infrav1.AddressAssignedCondition, metav1.ConditionTrue, infrav1.ReadyReason, time.Minute)
	agentReads := true
	if _, err := h.host.GuestReadFile(h.ctx, lm.Status.Domain.Name, "/etc/hostname"); err != nil && strings.Contains(err.Error(), "not implemented") {
		h.t.Errorf("the engine's GuestReadFile is not implemented yet (%v): the bootstrap sentinel and the Node identity cannot be verified", err)
		agentReads = false
	} else {
		lm = h.waitCondition(name, infrav1.BootstrapSucceededCondition, metav1.ConditionTrue, infrav1.ReadyReason, 10*time.Minute)
	}
	uuid := strings.TrimPrefix(lm.Spec.ProviderID, infrav1.ProviderIDPrefix)
	if info, err := h.host.DomainInfo(h.ctx, lm.Status.Domain.Name); err != nil || !strings.EqualFold(info.UUID, uuid) {
		h.t.Errorf("providerID %q, domain %+v (%v)", lm.Spec.ProviderID, info, err)
	}
	if !lm.Status.Initialization.IsProvisioned() || !lm.Status.Ready {
		h.t.Error("not provisioned / ready")
	}
	if r := conditions.Get(lm, clusterv1.ReadyCondition); agentReads && (r == nil || r.Status != metav1.ConditionTrue) {
		h.t.Errorf("Ready = %+v", r)
	}
	d := lm.Status.Domain
	if d == nil || d.Name != naming.DomainName(h.ns, name) || d.UUID != uuid || d.State != "running" || d.Host == "" || d.MAC == "" {
		h.t.Errorf("status.domain = %+v", d)
	}
	ip, ok := h.leaseIP(d.MAC)
	wantAddrs := fmt.Sprint([]clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: ip.String()}, {Type: clusterv1.MachineHostName, Address: name}})
	if !ok || fmt.Sprint(lm.Status.Addresses) != wantAddrs {
		h.t.Errorf("addresses %v, want %s", lm.Status.Addresses, wantAddrs)
	}
	if lm.Status.FailureDomain != "fd-1" {
		h.t.Errorf("failureDomain %q", lm.Status.FailureDomain)
	}
	// Cluster API's Machine controller picked all of it up.
	h.waitFor("Machine "+name+" to mirror the infrastructure", time.Minute, func() (bool, string) {
		m := h.machine(name)
		return m.Spec.ProviderID == lm.Spec.ProviderID && ptr.Deref(m.Status.Initialization.InfrastructureProvisioned, false) &&
				len(m.Status.Addresses) == 2, fmt.Sprintf("providerID %q, provisioned %v, addresses %v",
				m.Spec.ProviderID, m.Status.Initialization.InfrastructureProvisioned, m.Status.Addresses)
	})
	if !agentReads {
		return
	}
	// Node identity: what cloud-init rendered from instance-id, and the
	// SMBIOS UUID, both read inside the guest.
	rendered, err := h.host.GuestReadFile(h.ctx, d.Name, "/run/capl-test/provider-id")
	if err != nil || strings.TrimSpace(string(rendered)) != h.machine(name).Spec.ProviderID {
		h.t.Errorf("rendered provider-id %q (%v), Machine.spec.providerID %q", rendered, err, h.machine(name).Spec.ProviderID)
	}
	product, err := h.host.GuestReadFile(h.ctx, d.Name, "/sys/class/dmi/id/product_uuid")
	if err != nil || strings.ToLower(strings.TrimSpace(string(product))) != uuid {
		h.t.Errorf("product_uuid %q (%v), want %s", product, err, uuid)
	}
	if _, err := h.host.GuestReadFile(h.ctx, d.Name, guest.SentinelPath); err != nil {
		h.t.Errorf("sentinel: %v", err)
	}
}

// waitAddress waits until status.addresses holds an InternalIP. (The patch
// helper writes conditions before the rest of status, so AddressAssigned
// can be seen True a moment before the address itself.)
func (h *harness) waitAddress(name string, timeout time.Duration) *infrav1.LibvirtMachine {
	h.t.Helper()
	var lm *infrav1.LibvirtMachine
	h.waitFor(name+" to have an address", timeout, func() (bool, string) {
		lm = h.lm(name)
		c := conditions.Get(lm, infrav1.AddressAssignedCondition)
		return internalIP(lm) != "", fmt.Sprintf("%+v", c)
	})
	return lm
}

func internalIP(lm *infrav1.LibvirtMachine) string {
	for _, a := range lm.Status.Addresses {
		if a.Type == clusterv1.MachineInternalIP {
			return a.Address
		}
	}
	return ""
}

func (h *harness) reservation(mac string) (virt.Reservation, bool) {
	entries, err := h.host.Reservations(h.ctx, h.network.Name)
	must(h.t, err)
	for _, e := range entries {
		if netalloc.SameMAC(e.MAC.String(), mac) {
			return e, true
		}
	}
	return virt.Reservation{}, false
}

func sortedCopy(s []string) []string {
	out := append([]string(nil), s...)
	for i := range out {
		for j := i + 1; j < len(out); j++ {
			if out[j] < out[i] {
				out[i], out[j] = out[j], out[i]
			}
		}
	}
	return out
}

func roundAll(ds []time.Duration) []time.Duration {
	out := make([]time.Duration, len(ds))
	for i, d := range ds {
		out[i] = d.Round(time.Millisecond)
	}
	return out
}
