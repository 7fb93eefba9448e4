package plane

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"fmt"
	"io/fs"
	"maps"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	admissionv1 "k8s.io/api/admissionregistration/v1"
	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/registry"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestPlaneLifecycle runs the real binaries: Start spawns `capl-dev serve`,
// which supervises the manager and kube-controller-manager; a SIGKILLed
// manager or kube-controller-manager is replaced; the plane behaves as a
// management cluster (see checkManagementCluster) and keeps Secrets
// encrypted in etcd (checkEncryptedAtRest); Stop and a second Start keep
// etcd's data and the keys, also after the plane was SIGKILLed; Down stops
// the plane (or what a killed one left) and removes the state directory.
// No VM is created (the libvirt sweep has nothing in scope). It logs the
// plane's start times (cold: new state directory; warm: restart) and the
// memory of its processes.
func TestPlaneLifecycle(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	if os.Getenv("KUBEBUILDER_ASSETS") == "" {
		t.Fatal("KUBEBUILDER_ASSETS is unset: run through `make test`")
	}
	uri := os.Getenv("CAPL_TEST_LIBVIRT_URI")
	if uri == "" {
		t.Fatal("CAPL_TEST_LIBVIRT_URI is unset: run through `make test`")
	}
	bin := t.TempDir()
	for _, pkg := range []string{"cmd/manager", "cmd/capl-dev"} {
		cmd := exec.Command("go", "build", "-o", filepath.Join(bin, filepath.Base(pkg)), "./"+pkg)
		cmd.Dir = filepath.Join("..", "..")
		if out, err := cmd.CombinedOutput(); err != nil {
			t.Fatalf("building %s: %v\n%s", pkg, err, out)
		}
	}
	// Ports of their own for the registry and the libvirt endpoint:
	// another package's plane may hold the default ones.
	ports, err := freePorts(2)
	must(t, err)
	o := Options{
		StateDir: filepath.Join(t.TempDir(), "plane"), LibvirtURI: uri, ManagerBinary: filepath.Join(bin, "manager"), Log: t.Logf,
		RegistryPort: ports[0], RegistryLayouts: []string{testImageLayout(t, testImageName)}, LibvirtTLSPort: ports[1],
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{serveLogName, managerLogName, kcmLogName} {
				t.Logf("%s:\n%s", f, tail(filepath.Join(o.StateDir, f), 40))
			}
		}
	})
	// A Start that fails after spawning serve leaves the plane running (so
	// that a user of `up` can look at it); the test must never.
	t.Cleanup(func() {
		if err := stopServe(context.Background(), o.StateDir); err != nil {
			t.Errorf("stopping the plane: %v", err)
		}
	})
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	started := time.Now()
	p, err := Start(ctx, o, filepath.Join(bin, "capl-dev"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plane started cold (new state directory) in %s", time.Since(started).Round(100*time.Millisecond))
	checkLoopbackOnly(ctx, t, p)

	// Start again attaches to the running plane.
	again, err := Start(ctx, o, filepath.Join(bin, "capl-dev"))
	if err != nil || again.Endpoints.ServePID != p.Endpoints.ServePID {
		t.Fatalf("second Start: %v, serve pid %d, want %d", err, again.Endpoints.ServePID, p.Endpoints.ServePID)
	}

	old, err := p.KillManager()
	if err != nil {
		t.Fatal(err)
	}
	started = time.Now()
	pid, err := p.WaitManagerReady(ctx, old)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("manager pid %d killed, pid %d ready after %s", old, pid, time.Since(started).Round(time.Millisecond))
	if pid == old {
		t.Fatalf("manager pid %d was not replaced", old)
	}
	rss, err := p.ManagerRSSBytes()
	if err != nil || rss == 0 {
		t.Fatalf("manager RSS %d, %v", rss, err)
	}
	// The controllers' metrics appear once their caches synced, which
	// may be after /readyz answers.
	waitFor(ctx, t, time.Minute, "controller_runtime_reconcile_total in the manager's metrics", func() error {
		metrics, err := p.ManagerMetrics(ctx)
		if err == nil && !strings.Contains(metrics, "controller_runtime_reconcile_total") {
			err = fmt.Errorf("not in:\n%.500s", metrics)
		}
		return err
	})
	t.Logf("manager RSS %d MiB", rss>>20)

	// kube-controller-manager is supervised like the manager.
	kcmPID, err := readPID(filepath.Join(o.StateDir, kcmPIDName))
	must(t, err)
	must(t, syscall.Kill(kcmPID, syscall.SIGKILL))
	waitFor(ctx, t, 30*time.Second, "kube-controller-manager restarted", func() error {
		pid, err := readPID(filepath.Join(o.StateDir, kcmPIDName))
		if err == nil && (pid == kcmPID || !processAlive(pid, "kube-controller-manager")) {
			err = fmt.Errorf("pid %d", pid)
		}
		return err
	})

	checkManagementCluster(ctx, t, p)
	checkClusterctlInventory(ctx, t, p)
	marker := checkEncryptedAtRest(ctx, t, p)
	all, err := p.RSSBytes()
	must(t, err)
	var total uint64
	for name, b := range all {
		total += b
		t.Logf("RSS %s: %d MiB", name, b>>20)
	}
	if len(all) != 5 {
		t.Errorf("RSS of %d processes %v, want serve, manager, kube-controller-manager, etcd, kube-apiserver", len(all), all)
	}
	t.Logf("RSS of the plane's %d processes together: %d MiB", len(all), total>>20)
	keys := readKeys(t, o.StateDir)

	// etcd's data survives a restart of the plane.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kept"}, Data: map[string]string{"k": "v"}}
	must(t, p.Client.Create(ctx, cm))
	must(t, p.Stop(ctx))
	// A plane of an older version left a state directory without etcd's
	// certificates (its etcd served plain HTTP); the next start makes them.
	must(t, os.RemoveAll(filepath.Join(o.StateDir, etcdCertsDirName)))
	if _, err := Attach(o.StateDir); err == nil {
		t.Fatal("Attach succeeded on a stopped plane")
	}
	started = time.Now()
	p, err = Start(ctx, o, filepath.Join(bin, "capl-dev"))
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("plane started warm (restart, etcd data kept) in %s", time.Since(started).Round(100*time.Millisecond))
	got := &corev1.ConfigMap{}
	must(t, p.Client.Get(ctx, client.ObjectKeyFromObject(cm), got))
	if got.Data["k"] != "v" {
		t.Fatalf("ConfigMap after restart: %v", got.Data)
	}
	for _, f := range []string{etcdCAName, etcdServerCertName, etcdServerKeyName, etcdClientCertName, etcdClientKeyName} {
		checkMode0600(t, filepath.Join(o.StateDir, etcdCertsDirName, f))
	}
	// The keys are kept, so the Secret encrypted before the restart reads.
	if again := readKeys(t, o.StateDir); again != keys {
		t.Error("the service-account key or encryption configuration changed across a restart")
	}
	secret := &corev1.Secret{}
	must(t, p.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "encrypted"}, secret))
	if !bytes.Equal(secret.Data["value"], marker) {
		t.Errorf("Secret after restart holds %q, want the marker", secret.Data["value"])
	}

	// A plane killed with SIGKILL takes every child with it (etcd,
	// kube-apiserver, the manager, kube-controller-manager); the next
	// Start finds the data etcd had written.
	killPlane := func() {
		t.Helper()
		managerPID, err := p.ManagerPID()
		must(t, err)
		kcmPID, err := readPID(filepath.Join(o.StateDir, kcmPIDName))
		must(t, err)
		controlPlane, err := orphanedControlPlane(o.StateDir)
		must(t, err)
		if len(controlPlane) != 2 {
			t.Fatalf("before SIGKILL of the plane: %d etcd/kube-apiserver found, want 2: %v", len(controlPlane), controlPlane)
		}
		must(t, syscall.Kill(p.Endpoints.ServePID, syscall.SIGKILL))
		pids := []int{p.Endpoints.ServePID, managerPID, kcmPID, controlPlane[0].pid, controlPlane[1].pid}
		for deadline := time.Now().Add(30 * time.Second); slices.ContainsFunc(pids, func(pid int) bool { return processAlive(pid, "") }); {
			if time.Now().After(deadline) {
				t.Fatalf("a process of the plane (serve, manager, kube-controller-manager, etcd, kube-apiserver: %v) is still alive 30 s after SIGKILL of the plane", pids)
			}
			time.Sleep(pollInterval)
		}
	}
	killPlane()
	p, err = Start(ctx, o, filepath.Join(bin, "capl-dev"))
	if err != nil {
		t.Fatal(err)
	}
	must(t, p.Client.Get(ctx, client.ObjectKeyFromObject(cm), got))
	killPlane()

	rep, err := Down(ctx, o)
	if err != nil {
		t.Fatal(err)
	}
	// The only pool recorded is checkManagementCluster's, which never
	// existed: DeletePool takes a missing pool as deleted.
	if len(rep.Domains)+len(rep.Networks)+len(rep.Volumes) > 0 || !slices.Equal(rep.Pools, []string{unusedPool}) {
		t.Errorf("Down of a plane without VMs removed %+v, want only the (missing) pool %s", rep, unusedPool)
	}
	if _, err := os.Stat(o.StateDir); !os.IsNotExist(err) {
		t.Errorf("state dir after Down: %v", err)
	}
	if left, err := orphanedControlPlane(o.StateDir); err != nil || len(left) > 0 {
		t.Errorf("etcd/kube-apiserver left after Down: %v %v", left, err)
	}
}

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

// unusedPool is the storage pool of checkManagementCluster's
// LibvirtCluster, which the provider never reconciles.
const unusedPool = "capl-plane-test-unused"

// checkManagementCluster shows the plane doing what any management cluster
// does, through the real controllers: kube-controller-manager's namespace,
// service-account and garbage-collector controllers, Cluster API's webhooks
// and its kubeadm bootstrap provider.
func checkManagementCluster(ctx context.Context, t *testing.T, p *Plane) {
	t.Helper()
	scheme, err := manager.NewScheme()
	must(t, err)
	must(t, bootstrapv1.AddToScheme(scheme))
	c, err := client.New(p.Config, client.Options{Scheme: scheme})
	must(t, err)

	// The namespace controller empties and removes a deleted namespace;
	// the service-account controller gave it its default ServiceAccount.
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plane-doomed"}}
	must(t, c.Create(ctx, ns))
	must(t, c.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "content"}}))
	waitFor(ctx, t, time.Minute, "the namespace's default ServiceAccount", func() error {
		return c.Get(ctx, client.ObjectKey{Namespace: ns.Name, Name: "default"}, &corev1.ServiceAccount{})
	})
	must(t, c.Delete(ctx, ns))
	deleted := time.Now()
	waitFor(ctx, t, time.Minute, "namespace deletion", func() error { return gone(ctx, c, ns) })
	t.Logf("namespace deleted in %s", time.Since(deleted).Round(100*time.Millisecond))

	// Cluster API's webhooks: the validating one refuses a
	// MachineDeployment whose selector does not select its template (the
	// CRD's schema cannot say that), the defaulting one fills in a valid
	// one's selector and rollout strategy.
	md := &clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "plane-md"}}
	md.Spec.ClusterName = "plane"
	md.Spec.Template.Spec.ClusterName = "plane"
	md.Spec.Template.Spec.Bootstrap.DataSecretName = ptr.To("plane-bootstrap")
	md.Spec.Template.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachineTemplate", Name: "plane-md"}
	invalid := md.DeepCopy()
	invalid.Spec.Selector.MatchLabels = map[string]string{"role": "a"}
	invalid.Spec.Template.Labels = map[string]string{"role": "b"}
	err = c.Create(ctx, invalid, client.DryRunAll)
	if err == nil || !strings.Contains(err.Error(), "denied the request") || !strings.Contains(err.Error(), "spec.template.metadata.labels") {
		t.Errorf("MachineDeployment whose selector misses its template: %v, want Cluster API's webhook to deny it naming spec.template.metadata.labels", err)
	}
	must(t, c.Create(ctx, md, client.DryRunAll))
	if md.Spec.Selector.MatchLabels[clusterv1.MachineDeploymentNameLabel] != md.Name || md.Spec.Rollout.Strategy.Type != clusterv1.RollingUpdateMachineDeploymentStrategyType {
		t.Errorf("MachineDeployment not defaulted by Cluster API's webhook: selector %v, rollout %+v", md.Spec.Selector, md.Spec.Rollout)
	}

	// Cluster API's kubeadm bootstrap provider renders the KubeadmConfig
	// of a control-plane Machine (the Machine controller makes the Machine
	// its owner) into a bootstrap Secret. The LibvirtCluster is paused, so
	// the provider leaves it alone, and reports provisioned, with an
	// endpoint nothing answers on (TEST-NET-1) and a storage pool of its
	// own, so that Down's sweep has nothing to touch; the Machine's
	// LibvirtMachine does not exist, so no VM is made.
	ns = &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plane-capi"}}
	must(t, c.Create(ctx, ns))
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "plane",
		Annotations: map[string]string{clusterv1.PausedAnnotation: ""}}}
	lc.Spec.LoadBalancer.Type = infrav1.LoadBalancerNone
	lc.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "192.0.2.1", Port: 6443}
	lc.Spec.StoragePool.Name = unusedPool
	must(t, c.Create(ctx, lc))
	lc.Status.Initialization.Provisioned = ptr.To(true)
	must(t, c.Status().Update(ctx, lc))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "plane"}}
	cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtCluster", Name: lc.Name}
	must(t, c.Create(ctx, cluster))
	owned := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "plane-owned",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster", Name: cluster.Name, UID: cluster.UID}}}}
	must(t, c.Create(ctx, owned))
	kc := &bootstrapv1.KubeadmConfig{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "plane-cp-0",
		Labels: map[string]string{clusterv1.ClusterNameLabel: cluster.Name}}}
	must(t, c.Create(ctx, kc))
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "plane-cp-0",
		Labels: map[string]string{clusterv1.MachineControlPlaneLabel: ""}}}
	m.Spec.ClusterName = cluster.Name
	m.Spec.Version = "v1.33.1"
	m.Spec.Bootstrap.ConfigRef = clusterv1.ContractVersionedObjectReference{APIGroup: bootstrapv1.GroupVersion.Group, Kind: "KubeadmConfig", Name: kc.Name}
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachine", Name: "plane-none"}
	must(t, c.Create(ctx, m))
	var dataSecret string
	waitFor(ctx, t, 2*time.Minute, "the KubeadmConfig's dataSecretName", func() error {
		if err := c.Get(ctx, client.ObjectKeyFromObject(kc), kc); err != nil {
			return err
		}
		if dataSecret = kc.Status.DataSecretName; dataSecret == "" {
			return fmt.Errorf("owners %v, conditions %v", kc.OwnerReferences, kc.Status.Conditions)
		}
		return nil
	})
	if len(kc.OwnerReferences) == 0 || kc.OwnerReferences[0].Kind != "Machine" || kc.OwnerReferences[0].Name != m.Name {
		t.Errorf("KubeadmConfig owners %v, want Machine %s", kc.OwnerReferences, m.Name)
	}
	data := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: dataSecret}}
	must(t, c.Get(ctx, client.ObjectKeyFromObject(data), data))
	if !strings.Contains(string(data.Data["value"]), "kubeadm init") {
		t.Errorf("bootstrap Secret %s holds no kubeadm init:\n%.500s", dataSecret, data.Data["value"])
	}
	ca := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: cluster.Name + "-ca"}}
	must(t, c.Get(ctx, client.ObjectKeyFromObject(ca), ca))

	// Deleted with background propagation, the Cluster goes after Cluster
	// API deleted its Machine (and the Machine its KubeadmConfig) and
	// LibvirtCluster; the garbage collector removes what they owned: the ConfigMap, the
	// bootstrap Secret and the certificates the KubeadmConfig made.
	must(t, c.Delete(ctx, cluster, client.PropagationPolicy(metav1.DeletePropagationBackground)))
	deleted = time.Now()
	for _, o := range []client.Object{cluster, m, kc, lc, owned, data, ca} {
		waitFor(ctx, t, 2*time.Minute, fmt.Sprintf("deletion of %T %s", o, o.GetName()), func() error { return gone(ctx, c, o) })
	}
	t.Logf("Cluster and its owned objects deleted in %s", time.Since(deleted).Round(100*time.Millisecond))
}

// checkClusterctlInventory checks that the plane is a management cluster
// clusterctl recognises: the inventory names the providers it runs, the
// CRDs carry clusterctl's labels, and the real clusterctl binary's move
// (which reads both) runs against it. A LibvirtCluster that leaves as
// clusterctl move takes it (delete-for-move, deleted, finalizers stripped)
// is recorded as moved away, so that Down leaves its libvirt objects alone.
func checkClusterctlInventory(ctx context.Context, t *testing.T, p *Plane) {
	t.Helper()
	providers := &clusterctlv1.ProviderList{}
	must(t, p.Client.List(ctx, providers))
	got := map[string]string{}
	for _, pr := range providers.Items {
		got[pr.Namespace+"/"+pr.Name] = pr.Type + " " + pr.Version
	}
	// The version capl-dev was built with is go.mod's (a test binary
	// carries no module versions to compare with).
	gomod, err := os.ReadFile(filepath.Join("..", "..", "go.mod"))
	must(t, err)
	capi := ""
	if m := regexp.MustCompile(`(?m)^\s*sigs\.k8s\.io/cluster-api (v\S+)$`).FindSubmatch(gomod); m != nil {
		capi = string(m[1])
	}
	want := map[string]string{
		"capi-system/cluster-api":                                 "CoreProvider " + capi,
		"capi-kubeadm-bootstrap-system/bootstrap-kubeadm":         "BootstrapProvider " + capi,
		"capi-kubeadm-control-plane-system/control-plane-kubeadm": "ControlPlaneProvider " + capi,
		"capl-system/infrastructure-libvirt":                      "InfrastructureProvider " + ProviderVersion,
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("clusterctl inventory %v, want %v", got, want)
	}
	for _, name := range []string{"libvirtmachines.infrastructure.cluster.x-k8s.io", "machines.cluster.x-k8s.io", "kubeadmconfigs.bootstrap.cluster.x-k8s.io"} {
		crd := &apiextensionsv1.CustomResourceDefinition{}
		must(t, p.Client.Get(ctx, client.ObjectKey{Name: name}, crd))
		if _, ok := crd.Labels[clusterctlv1.ClusterctlLabel]; !ok || crd.Labels[clusterv1.ProviderNameLabel] == "" {
			t.Errorf("CRD %s labels %v, want %s and %s", name, crd.Labels, clusterctlv1.ClusterctlLabel, clusterv1.ProviderNameLabel)
		}
	}

	clusterctl, err := filepath.Abs(filepath.Join("..", "..", "bin", "clusterctl"))
	must(t, err)
	if _, err := os.Stat(clusterctl); err != nil {
		t.Fatalf("%v: run through `make test`, which builds clusterctl", err)
	}
	ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: "plane-move"}}
	must(t, p.Client.Create(ctx, ns))
	cmd := exec.CommandContext(ctx, clusterctl, "move", "--kubeconfig="+p.Kubeconfig, "--to-kubeconfig="+p.Kubeconfig, "--namespace="+ns.Name, "-v=1")
	cmd.Env = append(os.Environ(), "CLUSTERCTL_DISABLE_VERSIONCHECK=true", "XDG_CONFIG_HOME="+t.TempDir())
	out, err := cmd.CombinedOutput()
	if err != nil || !strings.Contains(string(out), "Moving Cluster API objects") {
		t.Errorf("clusterctl move against the plane: %v\n%s", err, out)
	}

	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: ns.Name, Name: "moved",
		Annotations: map[string]string{clusterv1.PausedAnnotation: ""}, Finalizers: []string{infrav1.ClusterFinalizer}}}
	lc.Spec.LoadBalancer.Type = infrav1.LoadBalancerNone
	lc.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "192.0.2.1", Port: 6443}
	lc.Spec.StoragePool.Name = unusedPool
	must(t, p.Client.Create(ctx, lc))
	patch := client.MergeFrom(lc.DeepCopy())
	lc.Annotations[clusterctlv1.DeleteForMoveAnnotation] = ""
	must(t, p.Client.Patch(ctx, lc, patch))
	must(t, p.Client.Delete(ctx, lc))
	// The provider may have let go of it already (it releases objects
	// deleted for a move).
	patch = client.MergeFrom(lc.DeepCopy())
	lc.Finalizers = nil
	must(t, client.IgnoreNotFound(p.Client.Patch(ctx, lc, patch)))
	waitFor(ctx, t, 30*time.Second, "the moved LibvirtCluster in scope.json", func() error {
		s, err := readScope(p.StateDir)
		if err != nil {
			return err
		}
		for _, m := range s.MovedAway {
			if m.same(MovedObject{Kind: kindLibvirtCluster, Namespace: ns.Name, Name: lc.Name}) {
				return nil
			}
		}
		return fmt.Errorf("moved away: %+v", s.MovedAway)
	})
}

// checkEncryptedAtRest creates a Secret and a ConfigMap holding random
// markers and reads etcd's data directory byte by byte: the ConfigMap's
// marker is there in clear (so the search works), the Secret's is not, and
// values encrypted with the plane's key are. It returns the Secret's marker.
func checkEncryptedAtRest(ctx context.Context, t *testing.T, p *Plane) []byte {
	t.Helper()
	secretMarker := []byte("secret-marker-" + rand.Text())
	plainMarker := []byte("configmap-marker-" + rand.Text())
	must(t, p.Client.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "encrypted"},
		Data: map[string][]byte{"value": secretMarker}}))
	must(t, p.Client.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "plain"},
		Data: map[string]string{"value": string(plainMarker)}}))
	found := map[string]bool{}
	waitFor(ctx, t, 30*time.Second, "the ConfigMap's marker in etcd's files", func() error {
		found = map[string]bool{}
		err := filepath.WalkDir(filepath.Join(p.StateDir, etcdDirName), func(path string, d fs.DirEntry, err error) error {
			if err != nil || d.IsDir() {
				return err
			}
			data, err := os.ReadFile(path)
			if err != nil {
				return err
			}
			for name, m := range map[string][]byte{"secret": secretMarker, "configmap": plainMarker, "prefix": []byte(encryptedValuePrefix)} {
				found[name] = found[name] || bytes.Contains(data, m)
			}
			return nil
		})
		if err == nil && !found["configmap"] {
			err = errors.New("not written yet")
		}
		return err
	})
	if found["secret"] {
		t.Error("the Secret's value is in clear in etcd's data directory")
	}
	if !found["prefix"] {
		t.Errorf("no value in etcd's data directory starts with %q", encryptedValuePrefix)
	}
	return secretMarker
}

// readKeys checks that the plane's keys are 0600 and returns them.
func readKeys(t *testing.T, dir string) string {
	t.Helper()
	var all string
	for _, f := range []string{serviceAccountKeyName, encryptionConfigName} {
		path := filepath.Join(dir, f)
		fi, err := os.Stat(path)
		must(t, err)
		if fi.Mode().Perm() != 0o600 {
			t.Errorf("%s has mode %v, want 0600", path, fi.Mode().Perm())
		}
		data, err := os.ReadFile(path)
		must(t, err)
		all += string(data)
	}
	return all
}

// gone is nil once obj no longer exists.
func gone(ctx context.Context, c client.Client, obj client.Object) error {
	err := c.Get(ctx, client.ObjectKeyFromObject(obj), obj)
	switch {
	case apierrors.IsNotFound(err):
		return nil
	case err != nil:
		return err
	default:
		return fmt.Errorf("still there (deletion %v, finalizers %v)", obj.GetDeletionTimestamp(), obj.GetFinalizers())
	}
}

// waitFor polls check until it returns nil, failing the test after timeout.
func waitFor(ctx context.Context, t *testing.T, timeout time.Duration, what string, check func() error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	for {
		err := check()
		if err == nil {
			return
		}
		select {
		case <-ctx.Done():
			t.Fatalf("%s: not after %s: %v", what, timeout, err)
		case <-time.After(pollInterval):
		}
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
