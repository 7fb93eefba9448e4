package cloudinit

import (
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// fakeGuest is the part of a guest's file system the vendor-data touches,
// below a temporary root: the scripts run with their absolute paths moved
// there.
type fakeGuest struct {
	t    *testing.T
	root string
	env  []string
}

// step is one thing that happens to a guest: cloud-init running a script,
// the bootstrap, a reboot.
type step func(g *fakeGuest)

const sentinel = "/run/cluster-api/bootstrap-success.complete"

func newFakeGuest(t *testing.T) *fakeGuest {
	root := t.TempDir()
	// A no-op sync: the real one would flush the whole test host.
	bin := filepath.Join(root, "bin")
	must(t, os.MkdirAll(bin, 0o755))
	must(t, os.WriteFile(filepath.Join(bin, "sync"), []byte("#!/bin/sh\ntouch \"$0.ran\"\n"), 0o755))
	must(t, os.MkdirAll(filepath.Join(root, "var/lib/cloud/data"), 0o755))
	must(t, os.MkdirAll(filepath.Join(root, "run"), 0o755))
	return &fakeGuest{t: t, root: root, env: append(os.Environ(), "PATH="+bin+":"+os.Getenv("PATH"))}
}

// rooted moves the guest paths of a script below g.root.
func (g *fakeGuest) rooted(script string) string {
	script = strings.ReplaceAll(script, "/var/lib/", g.root+"/var/lib/")
	return strings.ReplaceAll(script, "/run/cluster-api", g.root+"/run/cluster-api")
}

func (g *fakeGuest) path(guestPath string) string { return filepath.Join(g.root, guestPath) }

func (g *fakeGuest) sh(script string) {
	g.t.Helper()
	cmd := exec.Command("sh", "-c", g.rooted(script))
	cmd.Env = g.env
	if out, err := cmd.CombinedOutput(); err != nil {
		g.t.Fatalf("%v: %s\nscript:\n%s", err, out, g.rooted(script))
	}
}

func instance(id string) step {
	return func(g *fakeGuest) {
		must(g.t, os.WriteFile(g.path("var/lib/cloud/data/instance-id"), []byte(id+"\n"), 0o644))
	}
}

// placeholder is Cluster API's write_files entry, written in cloud-init's
// init stage, before the final stage's scripts.
func placeholder(g *fakeGuest) {
	must(g.t, os.MkdirAll(g.path("run/cluster-api"), 0o755))
	must(g.t, os.WriteFile(g.path("run/cluster-api/placeholder"), []byte("placeholder"), 0o640))
}

func vendorScript(g *fakeGuest) { g.sh(BootstrapSentinelVendorData) }

func perBoot(g *fakeGuest) { g.sh("exec /var/lib/cloud/scripts/per-boot/capl-bootstrap-sentinel") }

// bootstrap is Cluster API's sentinel command after a mkdir -p.
func bootstrap(g *fakeGuest) {
	g.sh("mkdir -p /run/cluster-api && echo success > " + sentinel)
}

func reboot(g *fakeGuest) {
	must(g.t, os.RemoveAll(g.path("run")))
	must(g.t, os.MkdirAll(g.path("run"), 0o755))
}

func TestBootstrapSentinelVendorData(t *testing.T) {
	if !strings.HasPrefix(BootstrapSentinelVendorData, "#!/bin/sh\n") {
		t.Fatal("the vendor-data must be a shell script for cloud-init to run it as it is")
	}
	tests := []struct {
		name            string
		steps           []step
		wantSentinel    bool
		wantPlaceholder bool
	}{
		{name: "first boot, sentinel written through the link",
			steps:        []step{instance("i-1"), placeholder, vendorScript, perBoot, bootstrap},
			wantSentinel: true, wantPlaceholder: true},
		{name: "first boot without a placeholder",
			steps:        []step{instance("i-1"), vendorScript, perBoot, bootstrap},
			wantSentinel: true},
		{name: "reboot after the bootstrap",
			steps:        []step{instance("i-1"), placeholder, vendorScript, perBoot, bootstrap, reboot, perBoot},
			wantSentinel: true, wantPlaceholder: true},
		{name: "per-boot script run twice in one boot",
			steps:        []step{instance("i-1"), vendorScript, perBoot, bootstrap, perBoot},
			wantSentinel: true},
		{name: "sentinel written before the link is moved to the disk",
			steps:        []step{instance("i-1"), vendorScript, bootstrap, perBoot, reboot, perBoot},
			wantSentinel: true},
		{name: "reboot in the middle of the bootstrap",
			steps: []step{instance("i-1"), placeholder, vendorScript, perBoot, reboot, perBoot},
			// The placeholder came before the power cut.
			wantPlaceholder: true},
		{name: "new instance from an image of a bootstrapped guest",
			steps: []step{instance("i-1"), vendorScript, perBoot, bootstrap, instance("i-2"), reboot, vendorScript, perBoot}},
		{name: "new instance without the vendor-data from an image of a bootstrapped guest",
			steps: []step{instance("i-1"), vendorScript, perBoot, bootstrap, instance("i-2"), reboot, perBoot}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			g := newFakeGuest(t)
			for _, s := range tt.steps {
				s(g)
			}
			_, err := os.Stat(g.path(sentinel))
			if gotSentinel := err == nil; gotSentinel != tt.wantSentinel {
				t.Errorf("sentinel present = %v (%v), want %v", gotSentinel, err, tt.wantSentinel)
			}
			_, err = os.Stat(g.path("run/cluster-api/placeholder"))
			if got := err == nil; got != tt.wantPlaceholder {
				t.Errorf("placeholder present = %v (%v), want %v", got, err, tt.wantPlaceholder)
			}
			if _, err := os.Stat(g.path("bin/sync.ran")); err != nil {
				t.Errorf("the vendor-data did not sync: %v", err)
			}
			// Whatever the boots, /run/cluster-api never holds a link
			// into itself.
			entries, _ := os.ReadDir(g.path("run/cluster-api"))
			for _, e := range entries {
				if e.Type()&os.ModeSymlink != 0 {
					t.Errorf("/run/cluster-api holds a link %s", e.Name())
				}
			}
		})
	}
}

// TestBootstrapSentinelVendorDataLinksPerInstance checks where the link
// points and how the directory is protected.
func TestBootstrapSentinelVendorDataLinksPerInstance(t *testing.T) {
	g := newFakeGuest(t)
	for _, s := range []step{instance("i-1"), placeholder, vendorScript, perBoot, bootstrap} {
		s(g)
	}
	dir := g.path("var/lib/capi-libvirt/cluster-api/i-1")
	target, err := os.Readlink(g.path("run/cluster-api"))
	if err != nil || target != dir {
		t.Fatalf("/run/cluster-api links to %q (%v), want %s", target, err, dir)
	}
	info, err := os.Stat(dir)
	must(t, err)
	if perm := info.Mode().Perm(); perm != 0o700 {
		t.Errorf("%s has mode %o, want 700", dir, perm)
	}
	if data, err := os.ReadFile(filepath.Join(dir, "bootstrap-success.complete")); err != nil || string(data) != "success\n" {
		t.Errorf("sentinel on the disk: %q, %v", data, err)
	}
	hook, err := os.Stat(g.path("var/lib/cloud/scripts/per-boot/capl-bootstrap-sentinel"))
	must(t, err)
	if hook.Mode().Perm()&0o100 == 0 {
		t.Errorf("per-boot script mode %o is not executable", hook.Mode().Perm())
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
