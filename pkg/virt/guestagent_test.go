package virt

import (
	"encoding/json"
	"errors"
	"net/netip"
	"reflect"
	"testing"

	"libvirt.org/go/libvirt"
)

func TestAgentRequestJSON(t *testing.T) {
	tests := []struct {
		name string
		req  agentRequest
		want string
	}{
		{"exec with stdin", agentRequest{Execute: "guest-exec", Arguments: execArgs{Path: "/bin/cat", Arg: []string{"-"}, InputData: []byte("hi\n"), CaptureOutput: true}},
			`{"execute":"guest-exec","arguments":{"path":"/bin/cat","arg":["-"],"input-data":"aGkK","capture-output":true}}`},
		{"exec without args", agentRequest{Execute: "guest-exec", Arguments: execArgs{Path: "true", CaptureOutput: true}},
			`{"execute":"guest-exec","arguments":{"path":"true","capture-output":true}}`},
		{"status", agentRequest{Execute: "guest-exec-status", Arguments: pidArgs{PID: 42}},
			`{"execute":"guest-exec-status","arguments":{"pid":42}}`},
		{"open", agentRequest{Execute: "guest-file-open", Arguments: fileOpenArgs{Path: "/etc/hostname", Mode: "r"}},
			`{"execute":"guest-file-open","arguments":{"path":"/etc/hostname","mode":"r"}}`},
		{"write", agentRequest{Execute: "guest-file-write", Arguments: fileWriteArgs{Handle: 7, Buf: []byte{0, 1, 2}}},
			`{"execute":"guest-file-write","arguments":{"handle":7,"buf-b64":"AAEC"}}`},
		{"no arguments", agentRequest{Execute: "guest-ping"}, `{"execute":"guest-ping"}`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			b, err := json.Marshal(tt.req)
			if err != nil {
				t.Fatal(err)
			}
			if string(b) != tt.want {
				t.Errorf("got  %s\nwant %s", b, tt.want)
			}
		})
	}
}

func TestExecStatusResult(t *testing.T) {
	tests := []struct {
		name  string
		reply string
		want  ExecResult
	}{
		{"exit code and output", `{"exited":true,"exitcode":3,"out-data":"b3V0","err-data":"ZXJy"}`, ExecResult{ExitCode: 3, Stdout: []byte("out"), Stderr: []byte("err")}},
		{"killed by signal", `{"exited":true,"signal":9}`, ExecResult{ExitCode: 137}},
		{"success without output", `{"exited":true,"exitcode":0}`, ExecResult{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var st execStatus
			if err := json.Unmarshal([]byte(tt.reply), &st); err != nil {
				t.Fatal(err)
			}
			if got := st.result(); !reflect.DeepEqual(got, tt.want) {
				t.Errorf("got %+v, want %+v", got, tt.want)
			}
		})
	}
}

func TestClassifyAgentError(t *testing.T) {
	tests := []struct {
		name        string
		err         error
		unavailable bool
		notFound    bool
	}{
		{"not connected", libvirt.Error{Code: libvirt.ERR_AGENT_UNRESPONSIVE, Message: "Guest agent is not responding: QEMU guest agent is not connected"}, true, false},
		{"timeout", libvirt.Error{Code: libvirt.ERR_AGENT_COMMAND_TIMEOUT}, true, false},
		{"domain stopped", libvirt.Error{Code: libvirt.ERR_OPERATION_INVALID, Message: "domain is not running"}, true, false},
		{"missing file", libvirt.Error{Code: libvirt.ERR_INTERNAL_ERROR, Message: "unable to execute QEMU agent command 'guest-file-open': Failed to open file '/x': No such file or directory"}, false, true},
		{"missing domain", libvirt.Error{Code: libvirt.ERR_NO_DOMAIN}, false, true},
		{"other", libvirt.Error{Code: libvirt.ERR_INTERNAL_ERROR, Message: "Permission denied"}, false, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := classifyAgentError("d", "cmd", tt.err)
			if got := errors.Is(err, ErrAgentUnavailable); got != tt.unavailable {
				t.Errorf("ErrAgentUnavailable = %v, want %v (%v)", got, tt.unavailable, err)
			}
			if got := IsNotFound(err); got != tt.notFound {
				t.Errorf("IsNotFound = %v, want %v (%v)", got, tt.notFound, err)
			}
			var lerr libvirt.Error
			if !errors.As(err, &lerr) {
				t.Errorf("libvirt's error is not reachable: %v", err)
			}
		})
	}
}

func TestGuestInterfaces(t *testing.T) {
	in := []libvirt.DomainInterface{
		{Name: "lo", Hwaddr: "00:00:00:00:00:00", Addrs: []libvirt.DomainIPAddress{{Type: libvirt.IP_ADDR_TYPE_IPV4, Addr: "127.0.0.1", Prefix: 8}}},
		{Name: "eth0", Hwaddr: "52:54:00:AB:CD:EF", Addrs: []libvirt.DomainIPAddress{
			{Type: libvirt.IP_ADDR_TYPE_IPV4, Addr: "192.168.122.10", Prefix: 24},
			{Type: libvirt.IP_ADDR_TYPE_IPV6, Addr: "fe80::5054:ff:feab:cdef%eth0", Prefix: 64},
			{Type: libvirt.IP_ADDR_TYPE_IPV4, Addr: "garbage", Prefix: 24},
			{Type: libvirt.IP_ADDR_TYPE_IPV4, Addr: "10.0.0.1", Prefix: 99},
		}},
	}
	want := []GuestInterface{
		{Name: "lo", MAC: "00:00:00:00:00:00", Addresses: []netip.Prefix{netip.MustParsePrefix("127.0.0.1/8")}},
		{Name: "eth0", MAC: "52:54:00:ab:cd:ef", Addresses: []netip.Prefix{
			netip.PrefixFrom(netip.MustParseAddr("192.168.122.10"), 24),
			netip.PrefixFrom(netip.MustParseAddr("fe80::5054:ff:feab:cdef"), 64),
		}},
	}
	if got := guestInterfaces(in); !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v\nwant %+v", got, want)
	}
}
