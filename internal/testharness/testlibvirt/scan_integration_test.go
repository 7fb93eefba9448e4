package testlibvirt

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// TestCheckNothingOwnedSeesWhatListOwnedCannot leaves, on the real host,
// the leaks pkg/virt's ListOwned is blind to (a domain and a network
// without our metadata, a volume file the pool was never refreshed for, an
// import marker, the directory of a pool whose definition is gone, a file
// in a pool the test still uses) and checks that CheckNothingOwned names
// each of them but not the pool in use, then nothing once they are removed.
func TestCheckNothingOwnedSeesWhatListOwnedCannot(t *testing.T) {
	uri := URI(t)
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	name := Name(t)

	// A domain and a network with our name but no metadata, defined only.
	domXML, err := (&libvirtxml.Domain{Type: "qemu", Name: name + "-vm", Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	dom, err := conn.DomainDefineXML(domXML)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = dom.Undefine(); _ = dom.Free() })
	netXML, err := (&libvirtxml.Network{Name: name + "-net"}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	nw, err := conn.NetworkDefineXML(netXML)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = nw.Undefine(); _ = nw.Free() })

	// A pool of another name whose directory gets two files behind
	// libvirt's back: only the directory listing can see them.
	other := "capl-othertest-" + strings.TrimPrefix(name, "capltest-")
	otherDir := filepath.Join(t.TempDir(), "pool")
	if err := os.Mkdir(otherDir, 0o755); err != nil {
		t.Fatal(err)
	}
	poolXML, err := (&libvirtxml.StoragePool{Type: "dir", Name: other, Target: &libvirtxml.StoragePoolTarget{Path: otherDir}}).Marshal()
	if err != nil {
		t.Fatal(err)
	}
	pool, err := conn.StoragePoolCreateXML(poolXML, 0) // transient: gone when destroyed
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = pool.Destroy(); _ = pool.Free() })
	for _, f := range []string{name + "-root.qcow2", name + "-base.qcow2" + PartialSuffix} {
		if err := os.WriteFile(filepath.Join(otherDir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// A pool of this test, still in use: expected, but not a file in it.
	live := Pool(t, uri, Client(t, uri))
	stray := filepath.Join(PoolRoot, live, "stray.qcow2")
	if err := os.WriteFile(stray, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	// The directory of a test pool whose definition is gone.
	orphanDir := filepath.Join(PoolRoot, name+"-pool")
	if err := os.Mkdir(orphanDir, 0o755); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = os.RemoveAll(orphanDir) })

	err = CheckNothingOwned(uri)
	if err == nil {
		t.Fatal("CheckNothingOwned found nothing")
	}
	for _, want := range []string{
		"domain " + name + "-vm",
		"network " + name + "-net",
		"file " + other + "/" + name + "-root.qcow2",
		"file " + other + "/" + name + "-base.qcow2.partial",
		"file " + PoolRoot + "/" + name + "-pool",
		"file " + live + "/stray.qcow2",
	} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("CheckNothingOwned does not name %q: %v", want, err)
		}
	}
	for _, notWant := range []string{"pool " + live, "file " + PoolRoot + "/" + live + ","} {
		if strings.Contains(err.Error()+",", notWant) {
			t.Errorf("CheckNothingOwned names %q, a pool the test still uses: %v", notWant, err)
		}
	}

	if err := dom.Undefine(); err != nil {
		t.Fatal(err)
	}
	if err := nw.Undefine(); err != nil {
		t.Fatal(err)
	}
	if err := pool.Destroy(); err != nil {
		t.Fatal(err)
	}
	if err := os.RemoveAll(orphanDir); err != nil {
		t.Fatal(err)
	}
	if err := os.Remove(stray); err != nil {
		t.Fatal(err)
	}
	if err := CheckNothingOwned(uri); err != nil {
		t.Errorf("after removing everything: %v", err)
	}
}
