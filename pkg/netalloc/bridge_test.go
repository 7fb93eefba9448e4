package netalloc

import (
	"fmt"
	"net"
	"strings"
	"testing"
	"unicode"
)

func TestBridgeName(t *testing.T) {
	names := []string{
		"",
		"default",
		"capl-default-my-cluster",
		strings.Repeat("a-very-long-network-name-", 20),
		"名前 with spaces/and:colons",
	}
	seen := make(map[string]string)
	for _, name := range names {
		bridge := BridgeName(name)
		if err := validInterfaceName(bridge); err != "" {
			t.Errorf("BridgeName(%q) = %q: %s", name, bridge, err)
		}
		if !strings.HasPrefix(bridge, "capl") {
			t.Errorf("BridgeName(%q) = %q, want the capl prefix", name, bridge)
		}
		if again := BridgeName(name); again != bridge {
			t.Errorf("BridgeName(%q) = %q, then %q", name, bridge, again)
		}
		if other, dup := seen[bridge]; dup {
			t.Errorf("networks %q and %q share bridge %q", other, name, bridge)
		}
		seen[bridge] = name
	}
}

// validInterfaceName applies the kernel's dev_valid_name rules and returns
// what is wrong, or "".
func validInterfaceName(name string) string {
	switch {
	case name == "" || name == "." || name == "..":
		return "empty or a dot name"
	case len(name) > 15:
		return "longer than 15 bytes"
	case strings.ContainsFunc(name, func(r rune) bool { return r == '/' || r == ':' || unicode.IsSpace(r) }):
		return "contains '/', ':' or whitespace"
	}
	return ""
}

func TestIsBridgeName(t *testing.T) {
	for _, n := range []string{"capi-libvirt", "capltest-abcdef", "default", "x"} {
		if b := BridgeName(n); !IsBridgeName(b) {
			t.Errorf("IsBridgeName(%s) = false", b)
		}
	}
	for _, b := range []string{"br0", "virbr0", "capl", "capl0123456789", "capl0123456789ab", "caplABCDEF01234", "capl0123456789g"} {
		if IsBridgeName(b) {
			t.Errorf("IsBridgeName(%s) = true", b)
		}
	}
}

func TestOnProviderBridge(t *testing.T) {
	holding := func(ip net.IP) (string, error) {
		switch ip.String() {
		case "192.168.150.1":
			return BridgeName("capl-e2e.k8s"), nil
		case "192.168.122.1":
			return "virbr0", nil
		}
		return "", fmt.Errorf("no interface holds %s", ip)
	}
	for _, tc := range []struct {
		name    string
		local   net.IP
		wantErr string
	}{
		{name: "a provider network's gateway", local: net.ParseIP("192.168.150.1")},
		{name: "another libvirt network", local: net.ParseIP("192.168.122.1"), wantErr: "on virbr0, not on the bridge"},
		{name: "no interface", local: net.ParseIP("10.9.9.9"), wantErr: "no interface holds"},
		{name: "no address", wantErr: "no local address"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := OnProviderBridge(tc.local, holding)
			if tc.wantErr == "" && err != nil || tc.wantErr != "" && (err == nil || !strings.Contains(err.Error(), tc.wantErr)) {
				t.Fatalf("OnProviderBridge(%v) = %v, want error %q", tc.local, err, tc.wantErr)
			}
		})
	}
}
