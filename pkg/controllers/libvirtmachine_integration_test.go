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
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
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
