package testlibvirt

import (
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
)

// Testbed is hack/testbed-hosts.sh's homelab on this machine: libvirt
// hosts, each a libvirtd in its own network and mount namespace, whose br0
// bridges share one LAN (10.231.0.0/24) with a DHCP and DNS router.
type Testbed struct {
	t      testing.TB
	script string
	dir    string
}

// StartTestbed brings up hosts (needs root) with its state in a fresh
// directory, and after the test tears everything down and checks that
// nothing is left: no namespace, link or directory.
func StartTestbed(t testing.TB, hosts ...string) *Testbed {
	t.Helper()
	if os.Geteuid() != 0 {
		testprereq.Missing(t, "the multi-host testbed needs root (network namespaces, bridges)")
	}
	_, self, _, _ := runtime.Caller(0)
	dir, err := os.MkdirTemp("", "capl-testbed-")
	if err != nil {
		t.Fatal(err)
	}
	tb := &Testbed{t: t, script: filepath.Join(filepath.Dir(self), "..", "..", "..", "hack", "testbed-hosts.sh"), dir: dir}
	t.Cleanup(tb.down)
	tb.must(append([]string{"up"}, hosts...)...)
	return tb
}

// URI is host's libvirt URI.
func (tb *Testbed) URI(host string) string { return tb.must("uri", host) }

// SSHURI is host's libvirt URI over SSH, as root.
func (tb *Testbed) SSHURI(host string) string { return tb.must("ssh-uri", host) }

// SSHCredentials are the private key the hosts' sshds let root in with
// and the hosts' keys (known_hosts). The test is skipped when the hosts
// run no sshd (openssh-server is not installed: hack/prepare-host.sh
// installs it).
func (tb *Testbed) SSHCredentials() (privateKey, knownHosts []byte) {
	tb.t.Helper()
	knownHosts = []byte(tb.must("known-hosts"))
	if len(knownHosts) == 0 {
		testprereq.Missing(tb.t, "the test bed's hosts run no sshd: install openssh-server (hack/prepare-host.sh)")
	}
	privateKey, err := os.ReadFile(tb.must("ssh-key"))
	if err != nil {
		tb.t.Fatal(err)
	}
	return privateKey, append(knownHosts, '\n')
}

// TLSURI is host's libvirt URI over TLS.
func (tb *Testbed) TLSURI(host string) string { return tb.must("tls-uri", host) }

// TLSCredentials are the client certificate and key the hosts' libvirtds
// accept (signed by the test bed's CA) and that CA's certificate, which
// signed the hosts' server certificates too.
func (tb *Testbed) TLSCredentials() (cert, key, ca []byte) {
	tb.t.Helper()
	dir := tb.must("tls-client")
	read := func(name string) []byte {
		data, err := os.ReadFile(filepath.Join(dir, name))
		if err != nil {
			tb.t.Fatal(err)
		}
		return data
	}
	return read("clientcert.pem"), read("clientkey.pem"), read("cacert.pem")
}

// Stop stops host's libvirtd (its guests keep running).
func (tb *Testbed) Stop(host string) { tb.must("stop", host) }

// Start starts host's libvirtd again.
func (tb *Testbed) Start(host string) { tb.must("start", host) }

// Unplug takes host off the LAN, its daemons and guests running: to the
// manager it is a host that lost power, whose connections end only when
// keepalive gives up.
func (tb *Testbed) Unplug(host string) { tb.must("unplug", host) }

// Plug puts host back on the LAN.
func (tb *Testbed) Plug(host string) { tb.must("plug", host) }

func (tb *Testbed) run(args ...string) (string, error) {
	cmd := exec.Command(tb.script, args...)
	cmd.Env = append(os.Environ(), "CAPL_TESTBED_DIR="+tb.dir)
	out, err := cmd.CombinedOutput()
	return strings.TrimSpace(string(out)), err
}

func (tb *Testbed) must(args ...string) string {
	tb.t.Helper()
	out, err := tb.run(args...)
	if err != nil {
		tb.t.Fatalf("hack/testbed-hosts.sh %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return out
}

func (tb *Testbed) down() {
	if out, err := tb.run("down"); err != nil {
		tb.t.Errorf("testbed down: %v\n%s", err, out)
	}
	if _, err := os.Stat(tb.dir); !os.IsNotExist(err) {
		tb.t.Errorf("testbed directory %s left behind (%v)", tb.dir, err)
	}
	netns, _ := exec.Command("ip", "netns", "list").CombinedOutput()
	if strings.Contains(string(netns), "capl-host-") || strings.Contains(string(netns), "capl-lan") {
		tb.t.Errorf("testbed network namespaces left behind:\n%s", netns)
	}
	if out, err := exec.Command("ip", "link", "show", "capl-lan").CombinedOutput(); err == nil {
		tb.t.Errorf("testbed link capl-lan left behind:\n%s", out)
	}
}
