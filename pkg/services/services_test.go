package services_test

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/address"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/disk"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/guest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/internal/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const secretMarker = "s3cr3t-bootstrap-token-do-not-leak"

type fixture struct {
	t        *testing.T
	client   client.Client
	host     *fakehost.Host
	recorder *record.FakeRecorder
	lm       *infrav1.LibvirtMachine
	machine  *clusterv1.Machine
	lc       *infrav1.LibvirtCluster
	cluster  *clusterv1.Cluster
	secret   *corev1.Secret
}

func newFixture(t *testing.T) *fixture {
	t.Helper()
	f := &fixture{t: t, host: fakehost.New(), recorder: record.NewFakeRecorder(100)}
	f.cluster = &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	f.cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	f.lc = &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	f.lc.Spec.StoragePool = infrav1.StoragePool{Name: "pool", Path: "/pools/pool"}
	f.lc.Status.Network = &infrav1.NetworkStatus{Name: "net"}
	f.machine = &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m0"}}
	f.machine.Spec.ClusterName = "c"
	f.machine.Spec.Bootstrap.DataSecretName = ptr.To("m0-bootstrap")
	f.machine.Spec.FailureDomain = "fd1"
	f.lm = &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m0", UID: types.UID("0b9d6c86-1111-4e2e-9c55-3b6f1b0d7a11")}}
	f.lm.Spec.Image.Volume = &infrav1.VolumeReference{Name: "base"}
	f.lm.Spec.CPUs, f.lm.Spec.MemoryMiB = 1, 512
	f.secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m0-bootstrap"},
		Data: map[string][]byte{"value": []byte("#cloud-config\n# " + secretMarker + "\n"), "format": []byte("cloud-config")}}
	f.host.Volumes["pool/base"] = virt.VolumeInfo{Pool: "pool", Name: "base", Path: "/pools/pool/base", CapacityBytes: 2 << 30, Format: "qcow2"}
	return f
}

func (f *fixture) scope() *scope.MachineScope {
	f.t.Helper()
	scheme, err := manager.NewScheme()
	if err != nil {
		f.t.Fatal(err)
	}
	if f.client == nil {
		f.client = fake.NewClientBuilder().WithScheme(scheme).
			WithObjects(f.lm, f.machine, f.cluster, f.lc, f.secret).
			WithStatusSubresource(&infrav1.LibvirtMachine{}).Build()
		// The fake client filled in resourceVersion; reread for patching.
		if err := f.client.Get(context.Background(), client.ObjectKeyFromObject(f.lm), f.lm); err != nil {
			f.t.Fatal(err)
		}
	}
	s, err := scope.NewMachineScope(scope.MachineScopeParams{
		Client: f.client, Cluster: f.cluster, Machine: f.machine, LibvirtCluster: f.lc,
		LibvirtMachine: f.lm, Host: f.host, HostName: "host1", Recorder: f.recorder,
	})
	if err != nil {
		f.t.Fatal(err)
	}
	return s
}

func (f *fixture) stored() *infrav1.LibvirtMachine {
	f.t.Helper()
	got := &infrav1.LibvirtMachine{}
	if err := f.client.Get(context.Background(), client.ObjectKeyFromObject(f.lm), got); err != nil {
		f.t.Fatal(err)
	}
	return got
}

// reconcile runs svc as its plan step does: its outcome sets condType on s.
func reconcile(s *scope.MachineScope, condType string, svc services.Service) error {
	return services.Plan{{Service: svc, Condition: condType}}.Run(context.Background(), s, false)
}

func wantCondition(t *testing.T, lm *infrav1.LibvirtMachine, condType string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	c := conditions.Get(lm, condType)
	if c == nil || c.Status != status || c.Reason != reason {
		t.Fatalf("%s = %+v, want %s/%s", condType, c, status, reason)
	}
	return c
}

// noLeaks fails when the secret marker appears in a condition or event.
func (f *fixture) noLeaks() {
	f.t.Helper()
	for _, c := range f.lm.Status.Conditions {
		if strings.Contains(c.Message, secretMarker) {
			f.t.Errorf("condition %s leaks bootstrap data: %q", c.Type, c.Message)
		}
	}
	for {
		select {
		case ev := <-f.recorder.Events:
			if strings.Contains(ev, secretMarker) {
				f.t.Errorf("event leaks bootstrap data: %q", ev)
			}
		default:
			return
		}
	}
}

func TestAddressPersistsMACBeforeReserving(t *testing.T) {
	f := newFixture(t)
	s := f.scope()
	first := scope.MACCandidates(string(f.lm.UID), 2)
	// Someone else's entry holds the first candidate.
	f.host.Entries["net"] = []virt.Reservation{{MAC: strings.ToUpper(first[0].String()), IP: netip.MustParseAddr("192.168.100.2")}}
	f.host.OnCall = func(method string) {
		if method == "ReserveAddress" && f.stored().Status.Domain == nil {
			t.Error("ReserveAddress ran before the MAC was persisted")
		}
	}
	if err := reconcile(s, infrav1.AddressReservedCondition, address.New(s)); err != nil {
		t.Fatal(err)
	}
	if s.MAC() != first[1].String() {
		t.Errorf("MAC = %s, want the second candidate %s", s.MAC(), first[1])
	}
	stored := f.stored()
	if stored.Annotations[scope.PoolAnnotation] != "pool" || stored.Annotations[scope.NetworkAnnotation] != "network:net" {
		t.Errorf("placement not recorded: %v", stored.Annotations)
	}
	wantCondition(t, f.lm, infrav1.AddressReservedCondition, metav1.ConditionTrue, infrav1.ReadyReason)
	// Idempotent: a second run keeps the MAC and the one entry.
	fs := f.scope()
	if err := reconcile(fs, infrav1.AddressReservedCondition, address.New(fs)); err != nil {
		t.Fatal(err)
	}
	if n := len(f.host.Entries["net"]); n != 2 {
		t.Errorf("%d entries, want 2", n)
	}
	fs = f.scope()
	if err := address.New(fs).Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if n := len(f.host.Entries["net"]); n != 1 {
		t.Errorf("after delete %d entries, want only the foreign one", n)
	}
}

func TestAddressWaitsForNetworkAndHandlesBridges(t *testing.T) {
	f := newFixture(t)
	f.lc.Status.Network = nil
	fs := f.scope()
	err := reconcile(fs, infrav1.AddressReservedCondition, address.New(fs))
	if rq, ok := services.AsRequeue(err); !ok || rq.After == 0 {
		t.Fatalf("err = %v, want a timed requeue", err)
	}
	wantCondition(t, f.lm, infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.WaitingForNetworkReason)

	f.lm.Spec.Network = &infrav1.NetworkAttachment{Bridge: "br0"}
	fs = f.scope()
	if err := reconcile(fs, infrav1.AddressReservedCondition, address.New(fs)); err != nil {
		t.Fatal(err)
	}
	wantCondition(t, f.lm, infrav1.AddressReservedCondition, metav1.ConditionTrue, infrav1.ReservationNotSupportedReason)
	if f.host.Called("ReserveAddress") {
		t.Error("reserved on a bridge")
	}
}

func TestAddressConflict(t *testing.T) {
	f := newFixture(t)
	f.host.Errs["ReserveAddress"] = &virt.AddressConflictError{Network: "net", Reason: virt.ConflictLeased, HeldBy: "52:54:00:00:00:01", Until: time.Now().Add(time.Minute)}
	fs := f.scope()
	err := reconcile(fs, infrav1.AddressReservedCondition, address.New(fs))
	if _, ok := services.AsRequeue(err); !ok {
		t.Fatalf("err = %v, want a requeue until the lease expires", err)
	}
	wantCondition(t, f.lm, infrav1.AddressReservedCondition, metav1.ConditionFalse, infrav1.AddressConflictReason)
}

func TestDiskErrorsBecomeReasons(t *testing.T) {
	for _, tc := range []struct {
		name   string
		setup  func(*fixture)
		reason string
	}{
		{"missing volume", func(f *fixture) { f.lm.Spec.Image.Volume.Name = "nope" }, infrav1.ImageNotFoundReason},
		{"missing url", func(f *fixture) {
			f.lm.Spec.Image = infrav1.ImageSource{URL: "file:///nope.qcow2", Checksum: "sha256:" + strings.Repeat("a", 64)}
		}, infrav1.ImageNotFoundReason},
		{"checksum", func(f *fixture) {
			f.host.Images["file:///img.qcow2"] = strings.Repeat("b", 64)
			f.lm.Spec.Image = infrav1.ImageSource{URL: "file:///img.qcow2", Checksum: "sha256:" + strings.Repeat("a", 64)}
		}, infrav1.ImageChecksumMismatchReason},
		{"pool full", func(f *fixture) {
			f.host.Errs["EnsureOverlay"] = fmt.Errorf("%w: no space left on device", virt.ErrPoolFull)
		}, infrav1.PoolFullReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			tc.setup(f)
			fs := f.scope()
			err := reconcile(fs, infrav1.DiskReadyCondition, disk.New(fs, &syncImporter{host: f.host}))
			if _, ok := services.AsRequeue(err); !ok {
				t.Fatalf("err = %v, want a requeue", err)
			}
			wantCondition(t, f.lm, infrav1.DiskReadyCondition, metav1.ConditionFalse, tc.reason)
		})
	}
}

// syncImporter imports in the caller, at once: the disk service's handling
// of an import's outcome without the importer's goroutines.
type syncImporter struct {
	host     virt.Host
	released []imageimport.Waiter
}

func (i *syncImporter) Ensure(k imageimport.Key, _ imageimport.Waiter) imageimport.Status {
	info, err := i.host.ImportImage(context.Background(), virt.ImageImport{Pool: k.Pool, Volume: k.Volume, Source: k.Source, SHA256: k.SHA256})
	if err != nil {
		return imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: err, RetryAt: time.Now().Add(time.Minute)}
	}
	return imageimport.Status{Phase: imageimport.Done, Attempt: 1, Volume: info}
}

func (i *syncImporter) Release(w imageimport.Waiter) { i.released = append(i.released, w) }

// runningImporter reports an import under way.
type runningImporter struct{ st imageimport.Status }

func (i runningImporter) Ensure(imageimport.Key, imageimport.Waiter) imageimport.Status { return i.st }
func (runningImporter) Release(imageimport.Waiter)                                      {}

func TestDiskImportReasons(t *testing.T) {
	for _, tc := range []struct {
		name    string
		st      imageimport.Status
		reason  string
		message string
	}{
		{"running", imageimport.Status{Phase: imageimport.Running, Attempt: 1, Read: 3 << 20, Total: 12 << 20, Elapsed: 3 * time.Second},
			infrav1.WaitingForImageImportReason, "3.0 MiB of 12.0 MiB (25%), 1.0 MiB/s"},
		{"no answer yet", imageimport.Status{Phase: imageimport.Running, Attempt: 2, Elapsed: 4 * time.Second},
			infrav1.WaitingForImageImportReason, "(attempt 2): waiting for the source to answer (4s so far)"},
		{"timed out", imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: errors.New("timeout awaiting response headers"), RetryAt: time.Now().Add(time.Minute)},
			infrav1.ImageImportFailedReason, "timeout awaiting response headers"},
		{"not found", imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: fmt.Errorf("%w: 404", virt.ErrImageNotFound), RetryAt: time.Now().Add(time.Minute)},
			infrav1.ImageNotFoundReason, "404"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			f.lm.Spec.Image = infrav1.ImageSource{URL: "http://images.example/img.qcow2", Checksum: "sha256:" + strings.Repeat("a", 64)}
			fs := f.scope()
			err := reconcile(fs, infrav1.DiskReadyCondition, disk.New(fs, runningImporter{tc.st}))
			if rq, ok := services.AsRequeue(err); !ok || rq.After <= 0 {
				t.Fatalf("err = %v, want a timed requeue", err)
			}
			c := wantCondition(t, f.lm, infrav1.DiskReadyCondition, metav1.ConditionFalse, tc.reason)
			if c != nil && !strings.Contains(c.Message, tc.message) {
				t.Errorf("message %q does not say %q", c.Message, tc.message)
			}
			if f.host.Called("EnsureOverlay") {
				t.Error("overlay created before the image")
			}
		})
	}
}

func TestDiskImportsByChecksum(t *testing.T) {
	f := newFixture(t)
	sum := strings.Repeat("c", 64)
	f.host.Images["file:///img.qcow2"] = sum
	f.lm.Spec.Image = infrav1.ImageSource{URL: "file:///img.qcow2", Checksum: "sha256:" + sum}
	s := f.scope()
	if err := reconcile(s, infrav1.DiskReadyCondition, disk.New(s, &syncImporter{host: f.host})); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.host.Volumes["pool/"+scope.ImageVolumeName(sum)]; !ok {
		t.Errorf("base not imported under its checksum name: %v", f.host.Volumes)
	}
	ov, ok := f.host.Volumes["pool/"+s.OverlayVolume()]
	if !ok || ov.CapacityBytes != uint64(infrav1.DefaultDiskSizeGiB)<<30 {
		t.Errorf("overlay = %+v", ov)
	}
	if f.host.Pools["pool"].Path != "/pools/pool" {
		t.Errorf("pool not ensured: %v", f.host.Pools)
	}
	images := &syncImporter{host: f.host}
	if err := disk.New(s, images).Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if len(images.released) != 1 || images.released[0].Name != f.lm.Name {
		t.Errorf("Delete released %v, want the machine's wait", images.released)
	}
	if _, ok := f.host.Volumes["pool/"+s.OverlayVolume()]; ok {
		t.Error("overlay survived Delete")
	}
	if _, ok := f.host.Volumes["pool/"+scope.ImageVolumeName(sum)]; !ok {
		t.Error("Delete removed the shared base image")
	}
}

func TestSeedUploadsOnceAndNeverLeaks(t *testing.T) {
	f := newFixture(t)
	s := f.scope()
	if err := reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s)); err != nil {
		t.Fatal(err)
	}
	wantCondition(t, f.lm, infrav1.BootstrapDataReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason)
	iso := string(f.host.Data["pool/"+s.SeedVolume()])
	if !strings.Contains(iso, "instance-id: "+s.DomainUUID()) || !strings.Contains(iso, "local-hostname: m0") || !strings.Contains(iso, secretMarker) {
		t.Error("seed lacks instance-id, hostname or user-data")
	}
	// Known complete: neither the Secret nor libvirt is written again.
	f.host.Calls = nil
	f.secret.Data = nil
	if err := f.client.Delete(context.Background(), f.secret); err != nil {
		t.Fatal(err)
	}
	if err := reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s)); err != nil {
		t.Fatal(err)
	}
	if f.host.Called("UploadVolume") {
		t.Error("uploaded again although the seed was complete")
	}
	f.noLeaks()
}

func TestSeedRewritesUnconfirmedVolume(t *testing.T) {
	f := newFixture(t)
	s := f.scope()
	// A volume from an upload cut short by a crash: no True condition.
	f.host.Volumes["pool/"+s.SeedVolume()] = virt.VolumeInfo{Name: s.SeedVolume()}
	if err := reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s)); err != nil {
		t.Fatal(err)
	}
	if !f.host.Called("UploadVolume") {
		t.Error("an unconfirmed seed volume was trusted")
	}
}

func TestSeedRejectsOtherFormats(t *testing.T) {
	f := newFixture(t)
	f.secret.Data["format"] = []byte("ignition")
	fs := f.scope()
	err := reconcile(fs, infrav1.BootstrapDataReadyCondition, seed.New(fs))
	if _, ok := services.AsRequeue(err); !ok {
		t.Fatalf("err = %v, want a requeue", err)
	}
	c := wantCondition(t, f.lm, infrav1.BootstrapDataReadyCondition, metav1.ConditionFalse, infrav1.UnsupportedBootstrapFormatReason)
	if !strings.Contains(c.Message, `"ignition"`) {
		t.Errorf("message %q does not name the format", c.Message)
	}
	if f.host.Called("UploadVolume") {
		t.Error("uploaded a seed of an unsupported format")
	}
	f.noLeaks()
}

func TestSeedMissingSecret(t *testing.T) {
	f := newFixture(t)
	f.machine.Spec.Bootstrap.DataSecretName = ptr.To("other")
	fs := f.scope()
	err := reconcile(fs, infrav1.BootstrapDataReadyCondition, seed.New(fs))
	if rq, ok := services.AsRequeue(err); !ok || rq.After == 0 {
		t.Fatalf("err = %v, want a timed requeue", err)
	}
	wantCondition(t, f.lm, infrav1.BootstrapDataReadyCondition, metav1.ConditionFalse, infrav1.BootstrapSecretNotFoundReason)
}

// provision runs address, disk and seed so that the domain can be defined.
func provision(t *testing.T, f *fixture) *scope.MachineScope {
	t.Helper()
	s := f.scope()
	for _, st := range []services.Step{
		{Service: address.New(s), Condition: infrav1.AddressReservedCondition},
		{Service: disk.New(s, &syncImporter{host: f.host}), Condition: infrav1.DiskReadyCondition},
		{Service: seed.New(s), Condition: infrav1.BootstrapDataReadyCondition},
	} {
		if err := reconcile(s, st.Condition, st.Service); err != nil {
			t.Fatal(err)
		}
	}
	return s
}

func TestDomainDefinesAndStarts(t *testing.T) {
	f := newFixture(t)
	f.lm.Spec.DomainType, f.lm.Spec.TCGTranslationCacheMiB = infrav1.DomainTypeQEMU, 128
	s := provision(t, f)
	if err := reconcile(s, infrav1.DomainReadyCondition, domain.New(s, 0)); err != nil {
		t.Fatal(err)
	}
	spec := f.host.Specs[s.DomainName()]
	if spec.UUID != s.DomainUUID() || spec.MAC != s.MAC() || spec.Network != "net" || spec.CPUMode != "maximum" ||
		spec.TCGCacheMiB != 128 || spec.SeedISOPath == "" || spec.DiskPath == "" || spec.Owner.Kind != "LibvirtMachine" {
		t.Errorf("domain spec = %+v", spec)
	}
	if f.host.Domains[s.DomainName()].State != "running" {
		t.Error("domain not started")
	}
	if f.lm.Spec.ProviderID != "libvirt:///"+s.DomainUUID() {
		t.Errorf("providerID = %q", f.lm.Spec.ProviderID)
	}
	wantCondition(t, f.lm, infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason)
}

func TestDomainStartFailureCarriesLibvirtMessage(t *testing.T) {
	f := newFixture(t)
	s := provision(t, f)
	f.host.Errs["StartDomain"] = &virt.DomainStartError{Name: s.DomainName(), Message: "Cannot get interface MTU on 'br9': No such device"}
	if err := reconcile(s, infrav1.DomainReadyCondition, domain.New(s, 0)); err == nil {
		t.Fatal("no error")
	}
	c := wantCondition(t, f.lm, infrav1.DomainReadyCondition, metav1.ConditionFalse, infrav1.DomainFailedToStartReason)
	if !strings.Contains(c.Message, "No such device") {
		t.Errorf("message %q lacks libvirt's reason", c.Message)
	}
}

func TestDomainTerminalFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(f *fixture, s *scope.MachineScope)
		reason string
	}{
		{"vanished", func(f *fixture, s *scope.MachineScope) { delete(f.host.Domains, s.DomainName()) }, infrav1.DomainMissingReason},
		{"replaced", func(f *fixture, s *scope.MachineScope) {
			d := f.host.Domains[s.DomainName()]
			d.UUID = "00000000-0000-0000-0000-000000000001"
			f.host.Domains[s.DomainName()] = d
		}, infrav1.DomainMissingReason},
		{"cannot restart", func(f *fixture, s *scope.MachineScope) {
			d := f.host.Domains[s.DomainName()]
			d.State, d.Reason = "shutoff", "crashed"
			f.host.Domains[s.DomainName()] = d
			f.host.Errs["StartDomain"] = &virt.DomainStartError{Name: s.DomainName(), Message: "disk gone"}
		}, infrav1.DomainCrashedReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := newFixture(t)
			s := provision(t, f)
			if err := reconcile(s, infrav1.DomainReadyCondition, domain.New(s, 0)); err != nil {
				t.Fatal(err)
			}
			s.SetProvisioned()
			tc.break_(f, s)
			err := reconcile(s, infrav1.DomainReadyCondition, domain.New(s, 0))
			te, ok := services.AsTerminal(err)
			if !ok || te.FailureReason != scope.FailureReasonUpdate {
				t.Fatalf("err = %v, want a terminal UpdateError", err)
			}
			wantCondition(t, f.lm, infrav1.DomainReadyCondition, metav1.ConditionFalse, tc.reason)
			if f.host.Called("EnsureDomain") && len(f.host.Specs) > 1 {
				t.Error("a replacement domain was defined")
			}
		})
	}
}

func TestDomainRestartsAfterStopAndReportsDrift(t *testing.T) {
	f := newFixture(t)
	s := provision(t, f)
	if err := reconcile(s, infrav1.DomainReadyCondition, domain.New(s, 0)); err != nil {
		t.Fatal(err)
	}
	s.SetProvisioned()
	d := f.host.Domains[s.DomainName()]
	d.State, d.Reason, d.VCPUs = "shutoff", "shutdown", 4
	f.host.Domains[s.DomainName()] = d
	if err := reconcile(s, infrav1.DomainReadyCondition, domain.New(s, 0)); err != nil {
		t.Fatal(err)
	}
	if f.host.Domains[s.DomainName()].State != "running" {
		t.Error("stopped domain not restarted")
	}
	c := wantCondition(t, f.lm, infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.HardwareDriftReason)
	if !strings.Contains(c.Message, "4 vCPUs") {
		t.Errorf("drift message %q", c.Message)
	}
	if len(f.host.Specs) != 1 {
		t.Error("drift recreated the domain")
	}
}

func TestDomainDeleteLeavesForeignDomain(t *testing.T) {
	f := newFixture(t)
	s := f.scope()
	f.host.Domains[s.DomainName()] = virt.DomainInfo{Name: s.DomainName(), UUID: "00000000-0000-0000-0000-000000000001", State: "running"}
	if err := domain.New(s, time.Second).Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.host.Domains[s.DomainName()]; !ok {
		t.Error("deleted a domain that is not ours")
	}
}

type leaseRecorder struct{ watched []string }

func (l *leaseRecorder) WatchLease(network, mac string) {
	l.watched = append(l.watched, network+"/"+mac)
}

func TestGuestAddressesNeedALease(t *testing.T) {
	f := newFixture(t)
	s := provision(t, f)
	leases := &leaseRecorder{}
	g := guest.NewAddresses(s, leases)
	err := reconcile(s, infrav1.AddressAssignedCondition, g)
	if _, ok := services.AsRequeue(err); !ok {
		t.Fatalf("err = %v, want to wait for a lease", err)
	}
	wantCondition(t, f.lm, infrav1.AddressAssignedCondition, metav1.ConditionFalse, infrav1.WaitingForAddressReason)
	if len(leases.watched) != 1 || leases.watched[0] != "net/"+s.MAC() {
		t.Errorf("lease watches = %v", leases.watched)
	}
	f.host.Leases["net"] = map[string]netip.Addr{strings.ToUpper(s.MAC()): netip.MustParseAddr("192.168.100.2")}
	if err := reconcile(s, infrav1.AddressAssignedCondition, g); err != nil {
		t.Fatal(err)
	}
	want := []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: "192.168.100.2"}, {Type: clusterv1.MachineHostName, Address: "m0"}}
	if fmt.Sprint(f.lm.Status.Addresses) != fmt.Sprint(want) {
		t.Errorf("addresses = %v, want %v", f.lm.Status.Addresses, want)
	}
}

func TestGuestBootstrapSentinel(t *testing.T) {
	f := newFixture(t)
	s := f.scope()
	g := guest.NewBootstrap(s)
	err := reconcile(s, infrav1.BootstrapSucceededCondition, g)
	if rq, ok := services.AsRequeue(err); !ok || rq.After < 10*time.Second {
		t.Fatalf("err = %v, want a requeue with backoff", err)
	}
	wantCondition(t, f.lm, infrav1.BootstrapSucceededCondition, metav1.ConditionFalse, infrav1.WaitingForBootstrapReason)

	f.host.Files[s.DomainName()+":/run/cloud-init/result.json"] = []byte(`{"v1": {"errors": ["runcmd failed: ` + secretMarker + `"]}}`)
	_ = reconcile(s, infrav1.BootstrapSucceededCondition, g)
	c := wantCondition(t, f.lm, infrav1.BootstrapSucceededCondition, metav1.ConditionFalse, infrav1.BootstrapFailedReason)
	if !strings.Contains(c.Message, "1 errors") {
		t.Errorf("message %q", c.Message)
	}

	f.host.Files[s.DomainName()+":"+guest.SentinelPath] = []byte("success\n")
	if err := reconcile(s, infrav1.BootstrapSucceededCondition, g); err != nil {
		t.Fatal(err)
	}
	wantCondition(t, f.lm, infrav1.BootstrapSucceededCondition, metav1.ConditionTrue, infrav1.ReadyReason)
	f.noLeaks()

	f.host.Errs["GuestReadFile"] = errors.New("must not be called again")
	if err := reconcile(s, infrav1.BootstrapSucceededCondition, g); err != nil {
		t.Errorf("sentinel re-read after success: %v", err)
	}
}

func TestCloseSummarisesAndPatches(t *testing.T) {
	f := newFixture(t)
	s := provision(t, f)
	s.MarkFalse(infrav1.DomainReadyCondition, infrav1.ProvisioningReason, "Defining")
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	stored := f.stored()
	if c := conditions.Get(stored, clusterv1.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "DomainReady: Defining") {
		t.Errorf("Ready = %+v", c)
	}
	wantCondition(t, stored, infrav1.BootstrapDataReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason)
}

func TestConditionTransitionsRecordEvents(t *testing.T) {
	f := newFixture(t)
	s := f.scope()
	drain := func() []string {
		var out []string
		for {
			select {
			case ev := <-f.recorder.Events:
				out = append(out, ev)
			default:
				return out
			}
		}
	}
	s.MarkWaiting(infrav1.WaitingForBootstrapDataReason, "waiting")
	if evs := drain(); len(evs) != 0 {
		t.Errorf("waiting recorded events: %v", evs)
	}
	s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")
	s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")
	if evs := drain(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal Ready DiskReady is True") {
		t.Errorf("events %v, want one Normal event for the transition to True", evs)
	}
	s.MarkFalse(infrav1.DiskReadyCondition, infrav1.PoolFullReason, "full")
	s.MarkFalse(infrav1.DiskReadyCondition, infrav1.PoolFullReason, "still full")
	if evs := drain(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning PoolFull") {
		t.Errorf("events %v, want one Warning", evs)
	}
}
