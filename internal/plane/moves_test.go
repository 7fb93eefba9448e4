package plane

import (
	"os"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestSweepLeavesHandedOverNamespaces(t *testing.T) {
	s := Scope{Namespaces: []string{"e2e", "kept"}, MovedAway: []MovedObject{{Kind: kindLibvirtMachine, Namespace: "e2e", Name: "m"}}}
	for _, tc := range []struct {
		obj  virt.OwnedObject
		want bool
	}{
		// Everything of the moved namespace, also what the plane never saw.
		{virt.OwnedObject{Kind: virt.OwnedDomain, Name: "capl-e2e.m", Owner: &virt.Owner{Namespace: "e2e"}}, false},
		{virt.OwnedObject{Kind: virt.OwnedDomain, Name: "capl-e2e.new", Owner: &virt.Owner{Namespace: "e2e"}}, false},
		{virt.OwnedObject{Kind: virt.OwnedVolume, Name: "capl-e2e.new-root.qcow2"}, false},
		{virt.OwnedObject{Kind: virt.OwnedNetwork, Name: "capl-e2e.k8s", Owner: &virt.Owner{Namespace: "e2e"}}, false},
		// The plane's other namespaces are still its own.
		{virt.OwnedObject{Kind: virt.OwnedDomain, Name: "capl-kept.m", Owner: &virt.Owner{Namespace: "kept"}}, true},
		{virt.OwnedObject{Kind: virt.OwnedVolume, Name: "capl-kept.m-seed.iso"}, true},
	} {
		if got := s.contains(tc.obj); got != tc.want {
			t.Errorf("contains(%s %s) = %v, want %v", tc.obj.Kind, tc.obj.Name, got, tc.want)
		}
	}
}

func TestMovedAwayRecord(t *testing.T) {
	dir := t.TempDir()
	m := MovedObject{Kind: kindLibvirtMachine, Namespace: "e2e", Name: "m", Since: time.Now()}
	must(t, addScope(dir, Scope{Namespaces: []string{"e2e"}, Pools: []string{"p"}}))
	must(t, recordMovedAway(dir, m))
	must(t, recordMovedAway(dir, m))
	read := func() Scope {
		s, err := readScope(dir)
		must(t, err)
		return s
	}
	if s := read(); len(s.MovedAway) != 1 || !s.MovedAway[0].same(m) || len(s.Namespaces) != 1 {
		t.Fatalf("after recording %+v twice: %+v", m, s)
	}
	live := []MovedObject{{Kind: kindLibvirtMachine, Namespace: "e2e", Name: "m"}}
	// A list taken before the object left still shows it: it stays moved.
	must(t, recordScope(dir, Scope{}, live, m.Since.Add(-time.Second)))
	if s := read(); len(s.MovedAway) != 1 {
		t.Fatalf("a list older than the move brought it back: %+v", s)
	}
	// Another kind of the same name is another object.
	must(t, recordScope(dir, Scope{}, []MovedObject{{Kind: kindLibvirtCluster, Namespace: "e2e", Name: "m"}}, time.Now()))
	if s := read(); len(s.MovedAway) != 1 {
		t.Fatalf("a LibvirtCluster of the same name brought the machine back: %+v", s)
	}
	// Seen in the plane after it left: it was moved back.
	must(t, recordScope(dir, Scope{}, live, time.Now()))
	if s := read(); len(s.MovedAway) != 0 || len(s.Pools) != 1 {
		t.Fatalf("moved back, still recorded as moved away: %+v", s)
	}
}

// TestProviderVersionIsTheRelease keeps the version the plane's inventory
// records equal to the release the Makefile packages.
func TestProviderVersionIsTheRelease(t *testing.T) {
	data, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	must(t, err)
	m := regexp.MustCompile(`(?m)^RELEASE_VERSION \?= (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("no RELEASE_VERSION ?= in the Makefile")
	}
	if string(m[1]) != ProviderVersion {
		t.Errorf("ProviderVersion %s, the Makefile releases %s", ProviderVersion, m[1])
	}
}
