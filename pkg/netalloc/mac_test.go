package netalloc

import (
	"bytes"
	"regexp"
	"testing"
)

var qemuMACFormat = regexp.MustCompile(`^52:54:00(:[0-9a-f]{2}){3}$`)

func TestMACFromSeed(t *testing.T) {
	seeds := []string{"", "3f2a9c1e-8d4b-4c2a-9e7f-1b2c3d4e5f60", "3f2a9c1e-8d4b-4c2a-9e7f-1b2c3d4e5f60/1", "machine-a", "machine-b"}
	seen := make(map[string]string)
	for _, seed := range seeds {
		mac := MACFromSeed(seed)
		if !qemuMACFormat.MatchString(mac.String()) {
			t.Errorf("MACFromSeed(%q) = %s, not 52:54:00:xx:xx:xx", seed, mac)
		}
		if mac[0]&0x01 != 0 || mac[0]&0x02 == 0 {
			t.Errorf("MACFromSeed(%q) = %s, want a unicast, locally administered address", seed, mac)
		}
		if again := MACFromSeed(seed); !bytes.Equal(mac, again) {
			t.Errorf("MACFromSeed(%q) = %s, then %s", seed, mac, again)
		}
		if other, dup := seen[mac.String()]; dup {
			t.Errorf("seeds %q and %q both give %s", other, seed, mac)
		}
		seen[mac.String()] = seed
	}
	// Pinned so that a change of derivation, which would re-address every
	// existing guest on its next reconcile, cannot pass unnoticed.
	if got, want := MACFromSeed("machine-a").String(), "52:54:00:f9:c8:c7"; got != want {
		t.Errorf(`MACFromSeed("machine-a") = %s, want %s`, got, want)
	}
}

func TestSameMAC(t *testing.T) {
	tests := []struct {
		a, b string
		want bool
	}{
		{"52:54:00:ab:cd:ef", "52:54:00:ab:cd:ef", true},
		{"52:54:00:AB:CD:EF", "52:54:00:ab:cd:ef", true},
		{"52-54-00-AB-CD-EF", "52:54:00:ab:cd:ef", true},
		{"5254.00ab.cdef", "52:54:00:AB:CD:EF", true},
		{"52:54:00:ab:cd:ef", "52:54:00:ab:cd:ee", false},
		{"52:54:00:ab:cd", "52:54:00:ab:cd", false},
		{"", "", false},
		{"not-a-mac", "not-a-mac", false},
		{"52:54:00:ab:cd:ef", "", false},
	}
	for _, tt := range tests {
		if got := SameMAC(tt.a, tt.b); got != tt.want {
			t.Errorf("SameMAC(%q, %q) = %v, want %v", tt.a, tt.b, got, tt.want)
		}
		if got := SameMAC(tt.b, tt.a); got != tt.want {
			t.Errorf("SameMAC(%q, %q) = %v, want %v", tt.b, tt.a, got, tt.want)
		}
	}
}

func TestParseMAC(t *testing.T) {
	tests := []struct {
		in        string
		want      MAC
		wantError bool
	}{
		{in: "52:54:00:ab:cd:ef", want: "52:54:00:ab:cd:ef"},
		{in: "52:54:00:AB:CD:EF", want: "52:54:00:ab:cd:ef"},
		{in: "52-54-00-AB-CD-EF", want: "52:54:00:ab:cd:ef"},
		{in: "5254.00ab.cdef", want: "52:54:00:ab:cd:ef"},
		{in: "52:54:00:ab:cd", wantError: true},
		{in: "00:00:00:00:fe:80:00:00:00:00:00:00:02:00:5e:10:00:00:00:01", wantError: true}, // 20-byte InfiniBand
		{in: "", wantError: true},
	}
	for _, tt := range tests {
		got, err := ParseMAC(tt.in)
		if (err != nil) != tt.wantError || got != tt.want {
			t.Errorf("ParseMAC(%q) = %q, %v; want %q (error %v)", tt.in, got, err, tt.want, tt.wantError)
		}
		if canon := CanonicalMAC(tt.in); !tt.wantError && canon != tt.want {
			t.Errorf("CanonicalMAC(%q) = %q, want %q", tt.in, canon, tt.want)
		}
	}
	if got := CanonicalMAC("Not-A-MAC"); got != "not-a-mac" {
		t.Errorf("CanonicalMAC of a malformed value = %q, want it lower-cased", got)
	}
	// The scopes read an unset annotation or status field through it.
	if got := CanonicalMAC(""); got != "" {
		t.Errorf("CanonicalMAC(\"\") = %q, want the zero MAC", got)
	}
	if got := MAC("52-54-00-AB-CD-EF").Canonical(); got != "52:54:00:ab:cd:ef" {
		t.Errorf("Canonical = %q", got)
	}
}
