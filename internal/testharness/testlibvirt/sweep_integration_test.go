package testlibvirt

import (
	"bufio"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"testing"

	"libvirt.org/go/libvirt"
	"libvirt.org/go/libvirtxml"
)

// envHoldLock makes the test binary a process that holds the host lock
// named in it until killed (TestHelperHoldHostLock).
const envHoldLock = "CAPL_TESTLIBVIRT_HOLD_LOCK"

// TestHelperHoldHostLock is not a test: TestSweepRemovesWhatKilledRunsLeft
// runs the test binary with envHoldLock set as another test process.
func TestHelperHoldHostLock(t *testing.T) {
	lock := os.Getenv(envHoldLock)
	if lock == "" {
		t.Skip("the other test process of TestSweepRemovesWhatKilledRunsLeft")
	}
	held, _, err := claimHost(lock, URI(t), func(Object) bool { return false })
	if err != nil {
		t.Fatal(err)
	}
	defer held.Close()
	os.Stdout.WriteString("held\n")
	_, _ = io.Copy(io.Discard, os.Stdin) // until killed
}

// TestSweepRemovesWhatKilledRunsLeft leaves on the real host what a killed
// run leaves (a domain, a network, a pool with a volume and a file libvirt
// does not know, a directory in PoolRoot), and checks that a claim removes
// none of it while another test process holds the lock, and all of it once
// that process has been killed.
func TestSweepRemovesWhatKilledRunsLeft(t *testing.T) {
	uri := URI(t)
	lock := filepath.Join(t.TempDir(), "host.lock")
	name := Name(t)
	mine := func(o Object) bool { return ours(o, []string{name}) }
	t.Cleanup(func() { _, _ = sweep(uri, mine) })
	leave(t, uri, name)
	left := scanMine(t, uri, mine)
	if len(left) != 7 {
		t.Fatalf("left %v, want a domain, a network, a pool with a volume and a file, and two directories in %s", left, PoolRoot)
	}

	other := exec.Command(os.Args[0], "-test.run=^TestHelperHoldHostLock$")
	other.Env = append(os.Environ(), envHoldLock+"="+lock)
	other.Stderr = os.Stderr
	stdin, err := other.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	defer stdin.Close()
	stdout, err := other.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := other.Start(); err != nil {
		t.Fatal(err)
	}
	if line, err := bufio.NewReader(stdout).ReadString('\n'); line != "held\n" {
		_ = other.Process.Kill()
		t.Fatalf("the other test process said %q (%v), want held", line, err)
	}

	held, swept, err := claimHost(lock, uri, mine)
	if err != nil {
		t.Fatal(err)
	}
	_ = held.Close()
	if len(swept) > 0 || !slices.Equal(scanMine(t, uri, mine), left) {
		t.Errorf("with another test process running the claim removed %v; want nothing", swept)
	}

	if err := other.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = other.Wait()
	held, swept, err = claimHost(lock, uri, mine)
	if err != nil {
		t.Fatalf("claim after the other process was killed: %v (removed %v)", err, swept)
	}
	_ = held.Close()
	if rest := scanMine(t, uri, mine); len(rest) > 0 {
		t.Errorf("after the other process was killed the claim removed %v and left %v", swept, rest)
	}
	t.Logf("removed %v", swept)
}

// leave makes, named after name, what a killed run leaves behind.
func leave(t *testing.T, uri, name string) {
	t.Helper()
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	define := func(what string, doc interface{ Marshal() (string, error) }, def func(string) error) {
		xml, err := doc.Marshal()
		if err == nil {
			err = def(xml)
		}
		if err != nil {
			t.Fatalf("%s: %v", what, err)
		}
	}
	define("domain", &libvirtxml.Domain{Type: "qemu", Name: name + "-vm", Memory: &libvirtxml.DomainMemory{Value: 64, Unit: "MiB"},
		OS: &libvirtxml.DomainOS{Type: &libvirtxml.DomainOSType{Type: "hvm"}}}, func(x string) error {
		d, err := conn.DomainDefineXML(x)
		if err == nil {
			_ = d.Free()
		}
		return err
	})
	define("network", &libvirtxml.Network{Name: name + "-net"}, func(x string) error {
		n, err := conn.NetworkDefineXML(x)
		if err == nil {
			_ = n.Free()
		}
		return err
	})
	dir := filepath.Join(PoolRoot, name+"-pool")
	var pool *libvirt.StoragePool
	define("pool", &libvirtxml.StoragePool{Type: "dir", Name: name + "-pool", Target: &libvirtxml.StoragePoolTarget{Path: dir}}, func(x string) error {
		pool, err = conn.StoragePoolDefineXML(x, 0)
		if err != nil {
			return err
		}
		if err := pool.Build(0); err != nil {
			return err
		}
		return pool.Create(0)
	})
	defer pool.Free()
	define("volume", &libvirtxml.StorageVolume{Name: "root.qcow2", Capacity: &libvirtxml.StorageVolumeSize{Value: 1, Unit: "MiB"},
		Target: &libvirtxml.StorageVolumeTarget{Format: &libvirtxml.StorageVolumeTargetFormat{Type: "qcow2"}}}, func(x string) error {
		v, err := pool.StorageVolCreateXML(x, 0)
		if err == nil {
			_ = v.Free()
		}
		return err
	})
	for path, content := range map[string]string{
		filepath.Join(dir, "seed.iso.partial"):           "behind libvirt's back",
		filepath.Join(PoolRoot, name+"-stray", "a-file"): "a pool directory whose pool is gone",
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(content), 0o600); err != nil {
			t.Fatal(err)
		}
	}
}

// scanMine lists the objects on the host that mine picks.
func scanMine(t *testing.T, uri string, mine func(Object) bool) []Object {
	t.Helper()
	objs, err := Scan(uri, PoolRoot)
	if err != nil {
		t.Fatal(err)
	}
	var out []Object
	for _, o := range objs {
		if mine(o) {
			out = append(out, o)
		}
	}
	return out
}
