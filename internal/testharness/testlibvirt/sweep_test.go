package testlibvirt

import (
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestIsTestObject(t *testing.T) {
	for _, tc := range []struct {
		name string
		o    Object
		want bool
	}{
		{"test domain", Object{Kind: KindDomain, Name: "capltest-ab12cd-vm"}, true},
		{"provider name in a test namespace", Object{Kind: KindNetwork, Name: "capl-capltest-ab12cd.cluster"}, true},
		{"volume of a test pool", Object{Kind: KindVolume, Pool: "capltest-ab12cd", Name: "root.qcow2"}, true},
		{"file in a test pool's directory", Object{Kind: KindFile, Pool: "/var/lib/libvirt/capltest-ab12cd", Name: "x"}, true},
		{"owned by a test namespace", Object{Kind: KindDomain, Name: "other", Owner: &virt.Owner{Namespace: "capltest-ab12cd"}}, true},
		{"provider object of a user", Object{Kind: KindDomain, Name: "capl-default.demo-control-plane"}, false},
		{"the provider's pool", Object{Kind: KindVolume, Pool: "capi-libvirt", Name: "capl-image-sha256-00"}, false},
		{"someone else's", Object{Kind: KindNetwork, Name: "default"}, false},
	} {
		if got := isTestObject(tc.o); got != tc.want {
			t.Errorf("%s: isTestObject(%v) = %v, want %v", tc.name, tc.o, got, tc.want)
		}
	}
}

func TestLocalURI(t *testing.T) {
	for uri, want := range map[string]bool{
		"qemu:///system":              true,
		"qemu:///session":             true,
		"qemu+ssh://capl@host/system": false,
		"qemu://host/system":          false,
	} {
		if got := localURI(uri); got != want {
			t.Errorf("localURI(%q) = %v, want %v", uri, got, want)
		}
	}
}
