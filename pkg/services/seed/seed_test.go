package seed_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestSeedUploadsOnceAndNeverLeaks(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	if err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s, s.Host)); err != nil {
		t.Fatal(err)
	}
	servicetest.WantCondition(t, f.LM, infrav1.BootstrapDataReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason)
	iso := string(f.Host.Data["pool/"+s.VM.SeedVolume()])
	if !strings.Contains(iso, "instance-id: "+s.VM.UUID) || !strings.Contains(iso, "local-hostname: m0") || !strings.Contains(iso, servicetest.SecretMarker) {
		t.Error("seed lacks instance-id, hostname or user-data")
	}
	// The volume holds the seed's bytes: it is not written again.
	f.Host.Calls = nil
	if err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s, s.Host)); err != nil {
		t.Fatal(err)
	}
	if f.Host.Called("UploadVolume") {
		t.Error("uploaded again although the volume holds the seed")
	}
	// Once the domain exists (defined on the seed), the Secret is not read.
	f.Secret.Data = nil
	if err := f.Client.Delete(context.Background(), f.Secret); err != nil {
		t.Fatal(err)
	}
	defined := func() bool { return true }
	if err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s, s.Host).WithDomainDefined(defined)); err != nil {
		t.Fatal(err)
	}
	if f.Host.Called("UploadVolume") {
		t.Error("uploaded again although the domain was defined on the seed")
	}
	f.NoLeaks()
}

// TestSeedOfAnotherInstanceIsRewritten: a seed written before the VM's
// UUID was chosen (by a release that derived it otherwise) carries another
// instance-id, which would make cloud-init take the VM for another
// instance: the volume is written again with the VM's own.
func TestSeedOfAnotherInstanceIsRewritten(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	if err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s, s.Host)); err != nil {
		t.Fatal(err)
	}
	const other = "0b7d4c1e-3f5a-4a8e-9c2d-6e1f0a9b8c7d"
	s.VM.UUID = other
	f.Host.Calls = nil
	if err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s, s.Host)); err != nil {
		t.Fatal(err)
	}
	if !f.Host.Called("UploadVolume") || !strings.Contains(string(f.Host.Data["pool/"+s.VM.SeedVolume()]), "instance-id: "+other) {
		t.Error("a seed of another instance-id was kept")
	}
	f.NoLeaks()
}

func TestSeedRewritesUnconfirmedVolume(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	// A volume from an upload cut short by a crash: not the seed's bytes.
	f.Host.Volumes["pool/"+s.VM.SeedVolume()] = virt.VolumeInfo{Name: s.VM.SeedVolume()}
	if err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s, s.Host)); err != nil {
		t.Fatal(err)
	}
	if !f.Host.Called("UploadVolume") {
		t.Error("an unconfirmed seed volume was trusted")
	}
}

func TestSeedRejectsOtherFormats(t *testing.T) {
	f := servicetest.NewFixture(t)
	f.Secret.Data["format"] = []byte("ignition")
	fs := f.Scope()
	err := servicetest.Reconcile(fs, infrav1.BootstrapDataReadyCondition, seed.New(fs, fs.Host))
	if _, ok := services.AsRequeue(err); !ok {
		t.Fatalf("err = %v, want a requeue", err)
	}
	c := servicetest.WantCondition(t, f.LM, infrav1.BootstrapDataReadyCondition, metav1.ConditionFalse, infrav1.UnsupportedBootstrapFormatReason)
	if !strings.Contains(c.Message, `"ignition"`) {
		t.Errorf("message %q does not name the format", c.Message)
	}
	if f.Host.Called("UploadVolume") {
		t.Error("uploaded a seed of an unsupported format")
	}
	f.NoLeaks()
}

func TestSeedMissingSecret(t *testing.T) {
	f := servicetest.NewFixture(t)
	f.Machine.Spec.Bootstrap.DataSecretName = ptr.To("other")
	fs := f.Scope()
	err := servicetest.Reconcile(fs, infrav1.BootstrapDataReadyCondition, seed.New(fs, fs.Host))
	if rq, ok := services.AsRequeue(err); !ok || rq.After == 0 {
		t.Fatalf("err = %v, want a timed requeue", err)
	}
	servicetest.WantCondition(t, f.LM, infrav1.BootstrapDataReadyCondition, metav1.ConditionFalse, infrav1.BootstrapSecretNotFoundReason)
}

// TestRemovalTakesBootstrapDataOffTheHost: once bootstrap succeeded the
// seed is rewritten with the same instance-id and hostname and no
// user-data, once; before that, and after it, nothing is written.
func TestRemovalTakesBootstrapDataOffTheHost(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	if err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s, s.Host)); err != nil {
		t.Fatal(err)
	}
	succeeded := false
	removal := seed.NewRemoval(s.VM, s.Host, func() bool { return succeeded })
	before := len(f.Host.Data["pool/"+s.VM.SeedVolume()])
	f.Host.Calls = nil
	if _, err := removal.Reconcile(context.Background()); err != nil || f.Host.Called("UploadVolume") {
		t.Fatalf("before bootstrap succeeded: err %v, uploaded %v", err, f.Host.Called("UploadVolume"))
	}
	succeeded = true
	if _, err := removal.Reconcile(context.Background()); err != nil {
		t.Fatal(err)
	}
	iso := string(f.Host.Data["pool/"+s.VM.SeedVolume()])
	if strings.Contains(iso, servicetest.SecretMarker) {
		t.Error("the seed still holds the bootstrap data")
	}
	if len(iso) != before {
		t.Errorf("the rewritten seed has %d bytes, the volume %d: it would be replaced, not overwritten in place", len(iso), before)
	}
	if !strings.Contains(iso, "instance-id: "+s.VM.UUID) || !strings.Contains(iso, "local-hostname: m0") {
		t.Error("the rewritten seed lost its instance-id or hostname: a reboot would bootstrap again")
	}
	if strings.Contains(iso, cloudinit.VendorDataFile) {
		t.Error("the rewritten seed holds vendor-data: it would not be the bytes Emptied looks for")
	}
	if err := s.PatchObject(context.Background()); err != nil {
		t.Fatal(err)
	}
	if !f.Stored().Status.BootstrapDataRemoved {
		t.Error("the removal is not recorded")
	}
	f.Host.Calls = nil
	if _, err := removal.Reconcile(context.Background()); err != nil || len(f.Host.Calls) > 0 {
		t.Errorf("after the removal: err %v, libvirt calls %v", err, f.Host.Calls)
	}
	f.NoLeaks()
}

// TestEmptiedTellsAnEarlierBootstrap: only a seed Removal rewrote counts as
// proof that the bootstrap succeeded once; a missing seed or one still
// holding the bootstrap data does not.
func TestEmptiedTellsAnEarlierBootstrap(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	ctx := context.Background()
	emptied := func(when string, want bool) {
		t.Helper()
		got, err := seed.Emptied(ctx, s.VM, s.Host)
		if err != nil || got != want {
			t.Errorf("%s: Emptied = %v, %v; want %v", when, got, err, want)
		}
	}
	emptied("no seed volume", false)
	if err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, seed.New(s, s.Host)); err != nil {
		t.Fatal(err)
	}
	emptied("seed with the bootstrap data", false)
	if _, err := seed.NewRemoval(s.VM, s.Host, func() bool { return true }).Reconcile(ctx); err != nil {
		t.Fatal(err)
	}
	emptied("seed rewritten without the bootstrap data", true)
	// The status is lost (clusterctl move, a restore): the volume still says it.
	f.LM.Status = infrav1.LibvirtMachineStatus{}
	emptied("after the status was lost", true)
	f.Host.Errs["ReadVolume"] = errors.New("libvirtd gone")
	if _, err := seed.Emptied(ctx, s.VM, s.Host); err == nil {
		t.Error("a failed read was taken for an answer")
	}
}

// TestSeedVendorData: a machine's seed carries the vendor-data that keeps
// its bootstrap sentinel through reboots; the HAProxy VM, whose bootstrap
// nobody checks, gets none.
func TestSeedVendorData(t *testing.T) {
	for _, tc := range []struct {
		name string
		svc  func(*scope.MachineScope) *seed.Service
		want bool
	}{
		{name: "machine", svc: func(s *scope.MachineScope) *seed.Service { return seed.New(s, s.Host) }, want: true},
		{name: "generated user-data", svc: func(s *scope.MachineScope) *seed.Service {
			return seed.NewWithUserData(s.VM, s.Host, []byte("#cloud-config\n"))
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			s := f.Scope()
			if err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, tc.svc(s)); err != nil {
				t.Fatal(err)
			}
			iso := string(f.Host.Data["pool/"+s.VM.SeedVolume()])
			got := strings.Contains(iso, cloudinit.VendorDataFile+";1") && strings.Contains(iso, cloudinit.BootstrapSentinelVendorData)
			if got != tc.want {
				t.Errorf("seed holds the sentinel vendor-data: %v, want %v", got, tc.want)
			}
		})
	}
}

func TestSeedCarriesGeneratedNetworkConfig(t *testing.T) {
	for _, tc := range []struct {
		name    string
		config  func() ([]byte, error)
		wantISO string
		wantErr bool
	}{
		{name: "written next to user-data", config: func() ([]byte, error) { return []byte("version: 1 # capl-network-marker"), nil }, wantISO: "capl-network-marker"},
		{name: "a failure uploads nothing", config: func() ([]byte, error) { return nil, errors.New("no MAC") }, wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			s := f.Scope()
			svc := seed.NewWithUserData(s.VM, s.Host, []byte("#cloud-config\n")).WithNetworkConfig(tc.config)
			err := servicetest.Reconcile(s, infrav1.BootstrapDataReadyCondition, svc)
			if tc.wantErr {
				if err == nil || f.Host.Called("UploadVolume") {
					t.Fatalf("err %v, uploaded %v; want an error and no upload", err, f.Host.Called("UploadVolume"))
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if iso := string(f.Host.Data["pool/"+s.VM.SeedVolume()]); !strings.Contains(iso, tc.wantISO) || !strings.Contains(iso, "network-config") {
				t.Errorf("the seed lacks its network-config")
			}
		})
	}
}
