package vmplan_test

import (
	"context"
	"testing"

	"github.com/google/go-cmp/cmp"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/ipaddress"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/vmplan"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// named is an extra step that only has a name.
type named string

func (n named) Name() string                                     { return string(n) }
func (named) Reconcile(context.Context) (services.Result, error) { return services.Result{}, nil }
func (named) Delete(context.Context) error                       { return nil }

// TestSteps: the VM's steps in the order they create things, the extras
// in their places, each step's condition, and which steps a provisioned
// VM skips.
func TestSteps(t *testing.T) {
	type step struct {
		Name, Condition, PartOf string
		BuildOnly               bool
	}
	const whole = "HAProxy VM x"
	machine := vmplan.Conditions{Address: "A", Disk: "D", Seed: "S", Domain: "V"}
	lb := vmplan.Conditions{Address: "L", Disk: "L", Seed: "L", Domain: "L", PartOf: whole}
	extra := vmplan.Extra{
		Checks:      []services.Step{{Service: named("check")}},
		Addressed:   []services.Step{{Service: named("addressed"), Condition: "E", SkipOnceProvisioned: true}},
		Running:     []services.Step{{Service: named("running"), Condition: "R"}},
		Provisioned: []services.Step{{Service: named("after"), Condition: "B"}},
	}
	for _, tc := range []struct {
		name       string
		conditions vmplan.Conditions
		extra      vmplan.Extra
		want       []step
	}{
		{name: "machine", conditions: machine, extra: extra, want: []step{
			{Name: "check", BuildOnly: true},
			{Name: "identity", Condition: "V"},
			{Name: "host devices", Condition: "V", BuildOnly: true},
			{Name: "address", Condition: "A", BuildOnly: true},
			{Name: "IP address claims", Condition: "A"},
			{Name: "addressed", Condition: "E", BuildOnly: true},
			{Name: "disk", Condition: "D", BuildOnly: true},
			{Name: "data disks", Condition: "D", BuildOnly: true},
			{Name: "seed", Condition: "S", BuildOnly: true},
			{Name: "domain", Condition: "V"},
			{Name: "running", Condition: "R"},
			{Name: "provisioned"},
			{Name: "after", Condition: "B"},
		}},
		{name: "part of a whole, no extras", conditions: lb, want: []step{
			{Name: "identity", Condition: "L", PartOf: whole},
			{Name: "host devices", Condition: "L", PartOf: whole, BuildOnly: true},
			{Name: "address", Condition: "L", PartOf: whole, BuildOnly: true},
			{Name: "IP address claims", Condition: "L", PartOf: whole},
			{Name: "disk", Condition: "L", PartOf: whole, BuildOnly: true},
			{Name: "data disks", Condition: "L", PartOf: whole, BuildOnly: true},
			{Name: "seed", Condition: "L", PartOf: whole, BuildOnly: true},
			{Name: "domain", Condition: "L", PartOf: whole},
			{Name: "provisioned"},
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			s := f.Scope()
			p := vmplan.New(vmplan.Spec{VM: s.VM, Host: f.Host, Owner: s, Conditions: tc.conditions,
				Claims: ipaddress.New(s, f.Host, f.Policy), Seed: seed.New(s, f.Host)})
			var got []step
			for _, st := range p.Steps(tc.extra) {
				got = append(got, step{Name: st.Service.Name(), Condition: st.Condition, PartOf: st.PartOf, BuildOnly: st.SkipOnceProvisioned})
			}
			if diff := cmp.Diff(tc.want, got); diff != "" {
				t.Errorf("steps (-want +got):\n%s", diff)
			}
		})
	}
}

// TestSettled: a provisioned VM skips its build steps; a disposable one
// only while its domain exists, so that a vanished one is made again with
// its volumes in the same reconcile.
func TestSettled(t *testing.T) {
	for _, tc := range []struct {
		name                             string
		provisioned, disposable, present bool
		want                             bool
	}{
		{name: "not provisioned", present: true},
		{name: "provisioned", provisioned: true, want: true},
		{name: "provisioned, domain gone: a terminal failure, not a rebuild", provisioned: true, want: true},
		{name: "disposable, provisioned, domain there", provisioned: true, disposable: true, present: true, want: true},
		{name: "disposable, provisioned, domain gone", provisioned: true, disposable: true},
		{name: "disposable, not provisioned", disposable: true, present: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			f.LM.Status.Domain = &infrav1.DomainStatus{State: "running", MAC: "52:54:00:12:34:56"}
			f.LM.Annotations = map[string]string{"libvirt.infrastructure.cluster.x-k8s.io/mac": "52:54:00:12:34:56"}
			s := f.Scope()
			if tc.provisioned {
				s.SetProvisioned()
			}
			s.VM.Disposable = tc.disposable
			if tc.present {
				f.Host.Domains[s.VM.Domain] = virt.DomainInfo{Name: s.VM.Domain, UUID: servicetest.DomainUUID, Owner: &s.VM.Owner}
			}
			p := vmplan.New(vmplan.Spec{VM: s.VM, Host: f.Host, Owner: s,
				Claims: ipaddress.New(s, f.Host, f.Policy), Seed: seed.New(s, f.Host)})
			if _, err := p.Identity.Reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
			if got := p.Settled(); got != tc.want {
				t.Errorf("Settled() = %v, want %v", got, tc.want)
			}
		})
	}
}
