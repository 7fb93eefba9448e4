package virt

import (
	"errors"
	"fmt"
	"testing"

	"libvirt.org/go/libvirt"
)

func TestIsNotFound(t *testing.T) {
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"ours wrapped", fmt.Errorf("guest file: %w", ErrNotFound), true},
		{"no domain", fmt.Errorf("x: %w", libvirt.Error{Code: libvirt.ERR_NO_DOMAIN}), true},
		{"no volume", libvirt.Error{Code: libvirt.ERR_NO_STORAGE_VOL}, true},
		{"no network", libvirt.Error{Code: libvirt.ERR_NO_NETWORK}, true},
		{"other libvirt", libvirt.Error{Code: libvirt.ERR_OPERATION_INVALID}, false},
		{"other", errors.New("boom"), false},
	}
	for _, tt := range tests {
		if got := IsNotFound(tt.err); got != tt.want {
			t.Errorf("%s: IsNotFound = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestTypedErrors(t *testing.T) {
	start := &DomainStartError{Name: "d", Message: "no space left on device",
		cause: libvirt.Error{Code: libvirt.ERR_INTERNAL_ERROR, Message: "no space left on device"}}
	tests := []struct {
		name   string
		err    error
		target error
	}{
		{"checksum", &ChecksumError{Source: "s", Expected: "a", Actual: "b"}, ErrChecksumMismatch},
		{"replaced", &DomainReplacedError{Name: "d"}, ErrDomainReplaced},
		{"start", start, ErrDomainStart},
		{"start no space", wrapNoSpace("", start), ErrPoolFull},
		{"pool full", wrapNoSpace("p", libvirt.Error{Code: libvirt.ERR_INTERNAL_ERROR, Message: "write: No space left on device"}), ErrPoolFull},
	}
	for _, tt := range tests {
		if !errors.Is(tt.err, tt.target) {
			t.Errorf("%s: %v is not %v", tt.name, tt.err, tt.target)
		}
	}
	var lerr libvirt.Error
	if !errors.As(wrapNoSpace("", start), &lerr) {
		t.Error("libvirt's error is not reachable through the wrapping")
	}
	if err := wrapNoSpace("p", errors.New("other")); errors.Is(err, ErrPoolFull) {
		t.Error("unrelated error became ErrPoolFull")
	}
}

func TestIsConnFailure(t *testing.T) {
	dead := &connState{}
	dead.dead.Store(true)
	live := &connState{}
	tests := []struct {
		name string
		st   *connState
		err  error
		want bool
	}{
		{"close callback fired", dead, errors.New("anything"), true},
		{"no connect", live, libvirt.Error{Code: libvirt.ERR_NO_CONNECT}, true},
		{"rpc", live, libvirt.Error{Code: libvirt.ERR_RPC}, true},
		{"socket closed", live, libvirt.Error{Code: libvirt.ERR_INTERNAL_ERROR, Message: "client socket is closed"}, true},
		{"broken pipe", live, fmt.Errorf("x: %w", libvirt.Error{Code: libvirt.ERR_SYSTEM_ERROR, Message: "Cannot write data: Broken pipe"}), true},
		{"not found", live, libvirt.Error{Code: libvirt.ERR_NO_DOMAIN}, false},
		{"plain", live, errors.New("boom"), false},
	}
	for _, tt := range tests {
		if got := isConnFailure(tt.st, tt.err); got != tt.want {
			t.Errorf("%s: isConnFailure = %v, want %v", tt.name, got, tt.want)
		}
	}
}

func TestStateString(t *testing.T) {
	tests := []struct {
		state      libvirt.DomainState
		reason     int
		wantState  string
		wantReason string
	}{
		{libvirt.DOMAIN_RUNNING, int(libvirt.DOMAIN_RUNNING_BOOTED), "running", "booted"},
		{libvirt.DOMAIN_SHUTOFF, int(libvirt.DOMAIN_SHUTOFF_DESTROYED), "shutoff", "destroyed"},
		{libvirt.DOMAIN_SHUTOFF, int(libvirt.DOMAIN_SHUTOFF_FAILED), "shutoff", "failed"},
		{libvirt.DOMAIN_CRASHED, int(libvirt.DOMAIN_CRASHED_PANICKED), "crashed", "panicked"},
		{libvirt.DOMAIN_PAUSED, int(libvirt.DOMAIN_PAUSED_IOERROR), "paused", "ioerror"},
		{libvirt.DOMAIN_RUNNING, 99, "running", "reason-99"},
		{libvirt.DomainState(42), 0, "unknown", "reason-0"},
	}
	for _, tt := range tests {
		s, r := stateString(tt.state, tt.reason)
		if s != tt.wantState || r != tt.wantReason {
			t.Errorf("%d/%d: got %s/%s, want %s/%s", tt.state, tt.reason, s, r, tt.wantState, tt.wantReason)
		}
	}
}
