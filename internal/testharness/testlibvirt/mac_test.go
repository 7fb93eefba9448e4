package testlibvirt

import (
	"bytes"
	"net"
	"regexp"
	"testing"
)

var qemuMACFormat = regexp.MustCompile(`^52:54:00(:[0-9a-f]{2}){3}$`)

func TestNewMAC(t *testing.T) {
	first, err := NewMAC()
	if err != nil {
		t.Fatal(err)
	}
	second, err := NewMAC()
	if err != nil {
		t.Fatal(err)
	}
	for _, mac := range []net.HardwareAddr{first, second} {
		if !qemuMACFormat.MatchString(mac.String()) {
			t.Errorf("NewMAC() = %s, not 52:54:00:xx:xx:xx", mac)
		}
	}
	// Fails spuriously once in 2^24 runs.
	if bytes.Equal(first, second) {
		t.Errorf("two NewMAC() calls both returned %s", first)
	}
}
