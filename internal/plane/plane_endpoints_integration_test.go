package plane

import (
	"context"
	"crypto/tls"
	"fmt"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/registry"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// checkLoopbackOnly shows that guests, which reach the host through their
// network's gateway, cannot reach the plane: every TCP socket its
// processes listen on (the manager's and Cluster API's webhook servers,
// etcd's client and peer URLs, kube-apiserver, health and metrics) is
// bound to a loopback address, read from /proc/net/tcp{,6}; every port
// the webhook configurations call answers on 127.0.0.1 and refuses the
// host's other addresses.
func checkLoopbackOnly(ctx context.Context, t *testing.T, p *Plane) {
	t.Helper()
	pids, err := p.PIDs()
	must(t, err)
	listening := map[uint16]string{}
	registryPort := registryPortOf(t, p)
	for name, pid := range pids {
		addrs, err := listeningAddresses(pid)
		must(t, err)
		for _, a := range addrs {
			listening[a.Port()] = name
			if a.Port() == registryPort || int(a.Port()) == p.Endpoints.LibvirtTLSPort {
				continue // every address; checkRegistry and checkLibvirtEndpoint show they answer the host alone
			}
			if !a.Addr().IsLoopback() {
				t.Errorf("%s (pid %d) listens on %s, which is not a loopback address", name, pid, a)
			}
		}
	}
	webhookPorts := map[uint16]bool{}
	for _, u := range webhookURLs(ctx, t, p.Client) {
		port, err := strconv.ParseUint(u.Port(), 10, 16)
		must(t, err)
		if u.Hostname() != "127.0.0.1" {
			t.Errorf("a webhook configuration calls %s, not 127.0.0.1", u)
		}
		webhookPorts[uint16(port)] = true
	}
	if !webhookPorts[uint16(p.Endpoints.WebhookPort)] || len(webhookPorts) < 2 {
		t.Errorf("webhook configurations call ports %v, want the manager's %d and Cluster API's", webhookPorts, p.Endpoints.WebhookPort)
	}
	others := hostAddresses(t)
	for port := range webhookPorts {
		if listening[port] == "" {
			t.Errorf("no process of the plane listens on webhook port %d", port)
		}
		conn, err := net.DialTimeout("tcp", tcpAddress("127.0.0.1", int(port)), 5*time.Second)
		if err != nil {
			t.Errorf("webhook port %d on 127.0.0.1: %v", port, err)
		} else {
			_ = conn.Close()
		}
		for _, a := range others {
			if conn, err := net.DialTimeout("tcp", tcpAddress(a.String(), int(port)), 5*time.Second); err == nil {
				_ = conn.Close()
				t.Errorf("webhook port %d (%s) answers on the host's address %s", port, listening[port], a)
			}
		}
	}
	t.Logf("the plane listens on %d loopback ports; webhook ports %v refuse %v", len(listening), slices.Sorted(maps.Keys(webhookPorts)), others)
	if listening[registryPort] != "serve" {
		t.Errorf("the registry's port %d is not the plane's (%q)", registryPort, listening[registryPort])
	}
	checkRegistry(ctx, t, p, others)
	if port := uint16(p.Endpoints.LibvirtTLSPort); port == 0 || listening[port] != "serve" {
		t.Errorf("the libvirt endpoint's port %d is not the plane's (%q)", port, listening[port])
	}
	checkLibvirtEndpoint(ctx, t, p, others)
}

// checkLibvirtEndpoint shows the plane's libvirt endpoint lets libvirt's
// own TLS client in on loopback with the credentials of endpoints.json,
// and completes no handshake on the host's other addresses (they are no
// provider network's bridge).
func checkLibvirtEndpoint(ctx context.Context, t *testing.T, p *Plane, others []netip.Addr) {
	t.Helper()
	dir := p.Endpoints.LibvirtClientDir
	uri := fmt.Sprintf("qemu+tls://127.0.0.1:%d/system?pkipath=%s", p.Endpoints.LibvirtTLSPort, dir)
	c, err := virt.Dial(ctx, uri, virt.WithReconnectBudget(0))
	if err != nil {
		t.Fatalf("libvirt through the plane's endpoint (%s): %v", uri, err)
	}
	mem, err := c.HostMemory(ctx)
	_ = c.Close()
	if err != nil || mem == 0 {
		t.Fatalf("libvirt through the plane's endpoint: host memory %d, %v", mem, err)
	}
	cert, err := tls.LoadX509KeyPair(filepath.Join(dir, "clientcert.pem"), filepath.Join(dir, "clientkey.pem"))
	must(t, err)
	for _, a := range others {
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", tcpAddress(a.String(), p.Endpoints.LibvirtTLSPort),
			&tls.Config{Certificates: []tls.Certificate{cert}, InsecureSkipVerify: true}) //nolint:gosec // only whether a handshake happens matters
		if err == nil {
			_ = conn.Close()
			t.Errorf("the libvirt endpoint completed a handshake on the host's address %s", a)
		}
	}
	t.Logf("libvirt endpoint on port %d: libvirt's client in on loopback (%d MiB of host memory), no handshake on %v", p.Endpoints.LibvirtTLSPort, mem>>20, others)
}

// testImageName is the image TestPlaneLifecycle has the plane push into
// its registry at start.
const testImageName = "example.com/capl/plane-test:v1"

// testImageLayout writes a random image named name into an OCI image
// layout, as images/oci names the images it writes.
func testImageLayout(t *testing.T, name string) string {
	t.Helper()
	img, err := random.Image(1024, 2)
	must(t, err)
	dir := t.TempDir()
	l, err := layout.Write(dir, empty.Index)
	must(t, err)
	must(t, l.AppendImage(img, layout.WithAnnotations(map[string]string{"io.containerd.image.name": name})))
	return dir
}

// registryPortOf is the port of the plane's registry.
func registryPortOf(t *testing.T, p *Plane) uint16 {
	t.Helper()
	u, err := url.Parse(p.Endpoints.RegistryURL)
	if err != nil || u.Port() == "" {
		t.Fatalf("the plane serves no registry (endpoints.json registryURL %q, %v)", p.Endpoints.RegistryURL, err)
	}
	port, err := strconv.ParseUint(u.Port(), 10, 16)
	must(t, err)
	return uint16(port)
}

// checkRegistry shows the plane's registry serves on loopback the image
// the plane pushed at start, and refuses pulls and pushes arriving on
// the host's other addresses (they are no provider network's bridge).
func checkRegistry(ctx context.Context, t *testing.T, p *Plane, others []netip.Addr) {
	t.Helper()
	repo, tag, err := registry.MirrorPath(testImageName)
	must(t, err)
	port := int(registryPortOf(t, p))
	get := func(host, path string) (*http.Response, error) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+tcpAddress(host, port)+path, nil)
		if err != nil {
			return nil, err
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			_ = resp.Body.Close()
		}
		return resp, err
	}
	resp, err := get("127.0.0.1", "/v2/"+repo+"/manifests/"+tag)
	must(t, err)
	if resp.StatusCode != http.StatusOK {
		t.Errorf("the registry answered HTTP %d for %s, which the plane pushed at start", resp.StatusCode, testImageName)
	}
	for _, a := range others {
		resp, err := get(a.String(), "/v2/")
		if err != nil {
			t.Errorf("the registry on %s: %v", a, err)
			continue
		}
		if resp.StatusCode != http.StatusForbidden {
			t.Errorf("the registry answered HTTP %d on the host's address %s, want 403", resp.StatusCode, a)
		}
	}
	t.Logf("registry on port %d: %s served on loopback, refused on %v", port, testImageName, others)
}

// webhookURLs are the URLs of every installed webhook configuration.
func webhookURLs(ctx context.Context, t *testing.T, c client.Client) []*url.URL {
	t.Helper()
	var mutating admissionv1.MutatingWebhookConfigurationList
	var validating admissionv1.ValidatingWebhookConfigurationList
	must(t, c.List(ctx, &mutating))
	must(t, c.List(ctx, &validating))
	var raw []*string
	for _, m := range mutating.Items {
		for _, w := range m.Webhooks {
			raw = append(raw, w.ClientConfig.URL)
		}
	}
	for _, v := range validating.Items {
		for _, w := range v.Webhooks {
			raw = append(raw, w.ClientConfig.URL)
		}
	}
	var out []*url.URL
	for _, r := range raw {
		if r == nil {
			t.Error("a webhook configuration calls a Service, not a URL")
			continue
		}
		u, err := url.Parse(*r)
		must(t, err)
		out = append(out, u)
	}
	return out
}

// hostAddresses are the host's unicast addresses other than loopback ones
// (its uplink, libvirt networks' gateways: what guests reach) but those on
// the bridges of provider networks, where the registry and the libvirt
// endpoint answer guests by design. A host
// without any fails the test when CI=true, since the dial then proves
// nothing.
func hostAddresses(t *testing.T) []netip.Addr {
	t.Helper()
	addrs, err := net.InterfaceAddrs()
	must(t, err)
	var out []netip.Addr
	for _, a := range addrs {
		prefix, err := netip.ParsePrefix(a.String())
		if err != nil || prefix.Addr().IsLoopback() || prefix.Addr().IsLinkLocalUnicast() {
			continue
		}
		// A provider network's gateway (another package's test or an
		// e2e may have one up) is where the registry and the libvirt
		// endpoint answer guests, by design.
		if netalloc.OnProviderBridge(net.IP(prefix.Addr().AsSlice()), netalloc.InterfaceHolding) == nil {
			continue
		}
		out = append(out, prefix.Addr())
	}
	if len(out) == 0 && testprereq.InCI() {
		t.Error("the host has no non-loopback address to dial the webhook ports on")
	}
	return out
}
