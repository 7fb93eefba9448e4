package domain_test

import (
	"context"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestDomainDefinesAndStarts(t *testing.T) {
	f := servicetest.NewFixture(t)
	f.LM.Spec.DomainType, f.LM.Spec.TCGTranslationCacheMiB = infrav1.DomainTypeQEMU, 128
	s, p := servicetest.Provision(t, f)
	if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain); err != nil {
		t.Fatal(err)
	}
	spec := f.Host.Specs[s.VM.Domain]
	if spec.UUID != s.VM.UUID || spec.MAC != s.VM.MAC || spec.Network != "net" || spec.CPUMode != "maximum" ||
		spec.TCGCacheMiB != 128 || spec.SeedISOPath == "" || spec.DiskPath == "" || spec.Owner.Kind != "LibvirtMachine" {
		t.Errorf("domain spec = %+v", spec)
	}
	if f.Host.Domains[s.VM.Domain].State != "running" {
		t.Error("domain not started")
	}
	if f.LM.Spec.ProviderID != "libvirt:///"+s.VM.UUID {
		t.Errorf("providerID = %q", f.LM.Spec.ProviderID)
	}
	servicetest.WantCondition(t, f.LM, infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason)
}

func TestDomainStartFailureCarriesLibvirtMessage(t *testing.T) {
	f := servicetest.NewFixture(t)
	s, p := servicetest.Provision(t, f)
	f.Host.Errs["StartDomain"] = &virt.DomainStartError{Name: s.VM.Domain, Message: "Cannot get interface MTU on 'br9': No such device"}
	if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain); err == nil {
		t.Fatal("no error")
	}
	c := servicetest.WantCondition(t, f.LM, infrav1.DomainReadyCondition, metav1.ConditionFalse, infrav1.DomainFailedToStartReason)
	if !strings.Contains(c.Message, "No such device") {
		t.Errorf("message %q lacks libvirt's reason", c.Message)
	}
}

func TestDomainTerminalFailures(t *testing.T) {
	for _, tc := range []struct {
		name   string
		break_ func(f *servicetest.Fixture, s *scope.MachineScope)
		reason string
	}{
		{"vanished", func(f *servicetest.Fixture, s *scope.MachineScope) { delete(f.Host.Domains, s.VM.Domain) }, infrav1.DomainMissingReason},
		{"replaced", func(f *servicetest.Fixture, s *scope.MachineScope) {
			d := f.Host.Domains[s.VM.Domain]
			d.UUID = "00000000-0000-0000-0000-000000000001"
			f.Host.Domains[s.VM.Domain] = d
		}, infrav1.DomainMissingReason},
		{"cannot restart", func(f *servicetest.Fixture, s *scope.MachineScope) {
			d := f.Host.Domains[s.VM.Domain]
			d.State, d.Reason = "shutoff", "crashed"
			f.Host.Domains[s.VM.Domain] = d
			f.Host.Errs["StartDomain"] = &virt.DomainStartError{Name: s.VM.Domain, Message: "disk gone"}
		}, infrav1.DomainCrashedReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			s, p := servicetest.Provision(t, f)
			if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain); err != nil {
				t.Fatal(err)
			}
			s.SetProvisioned()
			tc.break_(f, s)
			err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain)
			te, ok := services.AsTerminal(err)
			if !ok || te.FailureReason != scope.FailureReasonUpdate {
				t.Fatalf("err = %v, want a terminal UpdateError", err)
			}
			servicetest.WantCondition(t, f.LM, infrav1.DomainReadyCondition, metav1.ConditionFalse, tc.reason)
			if f.Host.Called("EnsureDomain") && len(f.Host.Specs) > 1 {
				t.Error("a replacement domain was defined")
			}
		})
	}
}

func TestDomainRestartsAfterStopAndReportsDrift(t *testing.T) {
	f := servicetest.NewFixture(t)
	s, p := servicetest.Provision(t, f)
	if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain); err != nil {
		t.Fatal(err)
	}
	s.SetProvisioned()
	d := f.Host.Domains[s.VM.Domain]
	d.State, d.Reason, d.VCPUs = "shutoff", "shutdown", 4
	f.Host.Domains[s.VM.Domain] = d
	if err := servicetest.Reconcile(s, infrav1.DomainReadyCondition, p.Domain); err != nil {
		t.Fatal(err)
	}
	if f.Host.Domains[s.VM.Domain].State != "running" {
		t.Error("stopped domain not restarted")
	}
	c := servicetest.WantCondition(t, f.LM, infrav1.DomainReadyCondition, metav1.ConditionTrue, infrav1.HardwareDriftReason)
	if !strings.Contains(c.Message, "4 vCPUs") {
		t.Errorf("drift message %q", c.Message)
	}
	if len(f.Host.Specs) != 1 {
		t.Error("drift recreated the domain")
	}
}

func TestDomainDeleteLeavesForeignDomain(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	f.Host.Domains[s.VM.Domain] = virt.DomainInfo{Name: s.VM.Domain, UUID: "00000000-0000-0000-0000-000000000001", State: "running"}
	if err := domain.New(s.VM, s.Host, domain.Parts{}, domain.Options{ShutdownTimeout: time.Second}).Delete(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, ok := f.Host.Domains[s.VM.Domain]; !ok {
		t.Error("deleted a domain that is not ours")
	}
}
