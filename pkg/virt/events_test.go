package virt

import (
	"testing"

	"libvirt.org/go/libvirt"
)

func TestLifecycleKind(t *testing.T) {
	tests := []struct {
		event      libvirt.DomainEventType
		detail     int
		wantKind   EventKind
		wantDetail string
	}{
		{libvirt.DOMAIN_EVENT_STARTED, int(libvirt.DOMAIN_EVENT_STARTED_BOOTED), EventDomainStarted, ""},
		{libvirt.DOMAIN_EVENT_STOPPED, int(libvirt.DOMAIN_EVENT_STOPPED_SHUTDOWN), EventDomainStopped, "shutdown"},
		{libvirt.DOMAIN_EVENT_STOPPED, int(libvirt.DOMAIN_EVENT_STOPPED_DESTROYED), EventDomainStopped, "destroyed"},
		{libvirt.DOMAIN_EVENT_STOPPED, int(libvirt.DOMAIN_EVENT_STOPPED_CRASHED), EventDomainCrashed, "crashed"},
		{libvirt.DOMAIN_EVENT_STOPPED, int(libvirt.DOMAIN_EVENT_STOPPED_FAILED), EventDomainCrashed, "failed"},
		{libvirt.DOMAIN_EVENT_SHUTDOWN, 0, EventDomainShutdown, ""},
		{libvirt.DOMAIN_EVENT_CRASHED, 0, EventDomainCrashed, "guest-panic"},
		{libvirt.DOMAIN_EVENT_SUSPENDED, int(libvirt.DOMAIN_EVENT_SUSPENDED_IOERROR), EventDomainPaused, "ioerror"},
		{libvirt.DOMAIN_EVENT_DEFINED, 0, EventDomainDefined, ""},
		{libvirt.DOMAIN_EVENT_UNDEFINED, 0, EventDomainUndefined, ""},
		{libvirt.DOMAIN_EVENT_PMSUSPENDED, 0, "", ""},
	}
	for _, tt := range tests {
		kind, detail := lifecycleKind(&libvirt.DomainEventLifecycle{Event: tt.event, Detail: tt.detail})
		if kind != tt.wantKind || detail != tt.wantDetail {
			t.Errorf("event %d/%d: got %q %q, want %q %q", tt.event, tt.detail, kind, detail, tt.wantKind, tt.wantDetail)
		}
	}
}
