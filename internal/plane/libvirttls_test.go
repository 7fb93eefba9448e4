package plane

import (
	"bytes"
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestLibvirtEndpointAllow(t *testing.T) {
	e := &libvirtEndpoint{onBridge: func(ip net.IP) (string, error) {
		switch ip.String() {
		case "192.168.150.1":
			return "capl0123456789a", nil
		case "10.0.0.5":
			return "eth0", nil
		case "192.168.122.1":
			return "virbr0", nil
		}
		return "", fmt.Errorf("no interface holds %s", ip)
	}}
	tcp := func(ip string) net.Addr { return &net.TCPAddr{IP: net.ParseIP(ip), Port: 16514} }
	for _, tc := range []struct {
		name, local, remote string
		allowed             bool
	}{
		{name: "loopback", local: "127.0.0.1", remote: "127.0.0.1", allowed: true},
		{name: "a guest on a provider bridge", local: "192.168.150.1", remote: "192.168.150.10", allowed: true},
		{name: "the LAN", local: "10.0.0.5", remote: "10.0.0.9"},
		{name: "another libvirt network", local: "192.168.122.1", remote: "192.168.122.50"},
		{name: "an address no interface holds", local: "172.16.0.1", remote: "172.16.0.2"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := e.allow(tcp(tc.local), tcp(tc.remote))
			if (err == nil) != tc.allowed {
				t.Fatalf("allow(%s ← %s) = %v, want allowed %v", tc.local, tc.remote, err, tc.allowed)
			}
		})
	}
}

func TestLocalLibvirtSocket(t *testing.T) {
	for _, tc := range []struct {
		uri, socket string
		ok          bool
	}{
		{uri: "qemu:///system", socket: "/var/run/libvirt/libvirt-sock", ok: true},
		{uri: "qemu+unix:///system?socket=/run/test/libvirt-sock", socket: "/run/test/libvirt-sock", ok: true},
		{uri: "qemu:///session"},
		{uri: "qemu+ssh://root@host/system"},
		{uri: "qemu+tcp://10.0.0.2/system"},
	} {
		socket, ok := localLibvirtSocket(tc.uri)
		if socket != tc.socket || ok != tc.ok {
			t.Errorf("localLibvirtSocket(%q) = %q, %v; want %q, %v", tc.uri, socket, ok, tc.socket, tc.ok)
		}
	}
}

// TestLibvirtEndpoint drives the real libvirtd through the endpoint with
// libvirt's own TLS client (qemu+tls://, pkipath), as a manager in a pod
// does, and checks that other certificates are turned away and that a
// restarted plane keeps the authority its clients trust.
func TestLibvirtEndpoint(t *testing.T) {
	if testing.Short() {
		if testprereq.InCI() {
			t.Fatal("CI=true with -short: CI runs make test, whose libvirtd this test needs")
		}
		t.Skip("integration test (make test-unit runs -short)")
	}
	uri := os.Getenv("CAPL_TEST_LIBVIRT_URI")
	if uri == "" {
		t.Fatal("CAPL_TEST_LIBVIRT_URI is unset: run through `make test`")
	}
	ports, err := freePorts(1)
	must(t, err)
	o := Options{StateDir: t.TempDir(), LibvirtURI: uri, LibvirtTLSPort: ports[0]}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	serveCtx, stop := context.WithCancel(ctx)
	clientDir, err := serveLibvirtTLS(serveCtx, o)
	must(t, err)
	if clientDir == "" {
		t.Fatalf("serveLibvirtTLS(%s) serves nothing", uri)
	}
	for _, f := range []string{"cacert.pem", "clientcert.pem", "clientkey.pem", "../cakey.pem"} {
		st, err := os.Stat(filepath.Join(clientDir, f))
		must(t, err)
		if st.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", f, st.Mode().Perm())
		}
	}
	tlsURI := func(pki string) string {
		return fmt.Sprintf("qemu+tls://127.0.0.1:%d/system?pkipath=%s", o.LibvirtTLSPort, pki)
	}
	dial := func(pki string) error {
		c, err := virt.Dial(ctx, tlsURI(pki), virt.WithReconnectBudget(0))
		if err != nil {
			return err
		}
		defer c.Close()
		mem, err := c.HostMemory(ctx)
		if err == nil && mem == 0 {
			err = errors.New("host memory 0")
		}
		return err
	}
	if err := dial(clientDir); err != nil {
		t.Fatalf("libvirt over the endpoint with the plane's client credentials: %v", err)
	}

	// A client certificate of another authority, and the server's own
	// kind of certificate from the right one, are both refused. The
	// client's CA bundle holds both authorities, so that libvirt's client
	// accepts its own certificate and the endpoint is the one to refuse it.
	other, err := newAuthority("someone-else")
	must(t, err)
	foreign, err := other.libvirtCertificate(x509.ExtKeyUsageClientAuth, libvirtClientName)
	must(t, err)
	ca, err := loadOrCreateLibvirtAuthority(filepath.Dir(clientDir))
	must(t, err)
	serverKind, err := ca.libvirtCertificate(x509.ExtKeyUsageServerAuth, "127.0.0.1")
	must(t, err)
	for name, pair := range map[string]keyPair{"another authority's client certificate": foreign, "a server certificate": serverKind} {
		dir := t.TempDir()
		bundle := append(append([]byte{}, ca.certPEM...), other.certPEM...)
		for f, content := range map[string][]byte{"cacert.pem": bundle, "clientcert.pem": pair.cert, "clientkey.pem": pair.key} {
			must(t, os.WriteFile(filepath.Join(dir, f), content, 0o600))
		}
		if err := dial(dir); err == nil {
			t.Errorf("%s: libvirt answered", name)
		} else {
			t.Logf("%s: refused: %v", name, firstLine(err.Error()))
		}
	}

	// A restarted plane keeps its authority: the same client credentials
	// reach libvirt again.
	before, err := os.ReadFile(filepath.Join(clientDir, "clientcert.pem"))
	must(t, err)
	stop()
	waitFor(ctx, t, 10*time.Second, "the endpoint's port to be free", func() error {
		l, err := net.Listen("tcp", fmt.Sprintf(":%d", o.LibvirtTLSPort))
		if err == nil {
			_ = l.Close()
		}
		return err
	})
	again, err := serveLibvirtTLS(ctx, o)
	must(t, err)
	after, err := os.ReadFile(filepath.Join(again, "clientcert.pem"))
	must(t, err)
	if again != clientDir || !bytes.Equal(before, after) {
		t.Fatalf("the restarted endpoint issued new client credentials (%s)", again)
	}
	if err := dial(again); err != nil {
		t.Fatalf("libvirt over the restarted endpoint: %v", err)
	}
}

func firstLine(s string) string {
	line, _, _ := strings.Cut(s, "\n")
	return line
}
