package identity_test

import (
	"context"
	"testing"

	"github.com/google/uuid"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/identity"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestIdentity: a VM keeps the UUID and MAC its domain has, whatever its
// UID and status say; only a VM with no domain of its own gets a new one.
func TestIdentity(t *testing.T) {
	const (
		oldUUID = "8a2e5a48-7f1c-4a1f-9a3b-0c1d2e3f4a5b"
		oldMAC  = "52:54:00:12:34:56"
	)
	ours := func(uid string) *virt.Owner {
		return &virt.Owner{Kind: "LibvirtMachine", Namespace: "ns", Name: "m0", UID: uid}
	}
	for _, tc := range []struct {
		name string
		// providerID and mac are what the object says; domain is libvirt's.
		providerID  string
		mac         string
		seen        bool
		disposable  bool
		domain      *virt.DomainInfo
		wantUUID    string // "" for a new random one
		wantMAC     netalloc.MAC
		wantDefined bool
		wantFound   bool
		wantCalls   int
	}{
		{name: "new machine", wantCalls: 1},
		{name: "moved: new UID, no status, providerID kept", providerID: oldUUID,
			domain:   &virt.DomainInfo{UUID: oldUUID, MAC: oldMAC, Owner: ours("old-uid")},
			wantUUID: oldUUID, wantMAC: oldMAC, wantDefined: true, wantFound: true, wantCalls: 1},
		{name: "restored before providerID was persisted", domain: &virt.DomainInfo{UUID: oldUUID, MAC: oldMAC, Owner: ours("old-uid")},
			wantUUID: oldUUID, wantMAC: oldMAC, wantDefined: true, wantFound: true, wantCalls: 1},
		{name: "a domain of our name that is another object's",
			domain:    &virt.DomainInfo{UUID: oldUUID, MAC: oldMAC, Owner: &virt.Owner{Kind: "LibvirtMachine", Namespace: "other", Name: "m0"}},
			wantCalls: 1},
		{name: "replaced behind our back: the UUID stays ours", providerID: "11111111-2222-4333-8444-555555555555",
			domain:   &virt.DomainInfo{UUID: oldUUID, MAC: oldMAC, Owner: ours("")},
			wantUUID: "11111111-2222-4333-8444-555555555555", wantCalls: 1},
		{name: "moved: identity in spec and annotations, no status: the domain is looked up", providerID: oldUUID, mac: oldMAC,
			domain:   &virt.DomainInfo{UUID: oldUUID, MAC: oldMAC, Owner: ours("old-uid")},
			wantUUID: oldUUID, wantMAC: oldMAC, wantDefined: true, wantFound: true, wantCalls: 1},
		{name: "known and seen: no libvirt call", providerID: oldUUID, mac: oldMAC, seen: true, wantUUID: oldUUID, wantMAC: oldMAC, wantDefined: true},
		{name: "disposable, known and seen: the domain is looked up", providerID: oldUUID, mac: oldMAC, seen: true, disposable: true,
			domain:   &virt.DomainInfo{UUID: oldUUID, MAC: oldMAC, Owner: ours("")},
			wantUUID: oldUUID, wantMAC: oldMAC, wantDefined: true, wantFound: true, wantCalls: 1},
		{name: "disposable, known and seen, vanished: not found", providerID: oldUUID, mac: oldMAC, seen: true, disposable: true,
			wantUUID: oldUUID, wantMAC: oldMAC, wantDefined: true, wantCalls: 1},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			f.LM.Spec.ProviderID = ""
			if tc.providerID != "" {
				f.LM.Spec.ProviderID = infrav1.ProviderIDPrefix + tc.providerID
			}
			if tc.mac != "" {
				f.LM.Annotations = map[string]string{"libvirt.infrastructure.cluster.x-k8s.io/mac": tc.mac}
			}
			if tc.seen {
				f.LM.Status.Domain = &infrav1.DomainStatus{State: "running", MAC: tc.mac}
			}
			s := f.Scope()
			if tc.domain != nil {
				f.Host.Domains[s.VM.Domain] = *tc.domain
			}
			s.VM.Disposable = tc.disposable
			f.Host.Calls = nil
			id := identity.New(s.VM, s.Host)
			if _, err := id.Reconcile(context.Background()); err != nil {
				t.Fatal(err)
			}
			got := s.VM.UUID
			if tc.wantUUID != "" && got != tc.wantUUID {
				t.Errorf("UUID %q, want %q", got, tc.wantUUID)
			}
			if _, err := uuid.Parse(got); err != nil || (tc.wantUUID == "" && got == oldUUID) {
				t.Errorf("UUID %q: want a new one (%v)", got, err)
			}
			if s.VM.MAC != tc.wantMAC {
				t.Errorf("MAC %q, want %q", s.VM.MAC, tc.wantMAC)
			}
			if id.DomainDefined() != tc.wantDefined {
				t.Errorf("domain defined %v, want %v", id.DomainDefined(), tc.wantDefined)
			}
			if id.Found() != tc.wantFound {
				t.Errorf("found %v, want %v", id.Found(), tc.wantFound)
			}
			if len(f.Host.Calls) != tc.wantCalls {
				t.Errorf("libvirt calls %v, want %d", f.Host.Calls, tc.wantCalls)
			}
		})
	}
}
