package controllers_test

import (
	"context"
	"encoding/csv"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	ctrlmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/loadbalancer"
)

// envHAProxyImage overrides where the HAProxy test image is; by default it
// sits next to CAPL_TEST_IMAGE, where images/build.sh puts both.
const envHAProxyImage = "CAPL_TEST_HAPROXY_IMAGE"

// clusterHarness is the management plane of the LibvirtCluster test:
// the LibvirtMachine test's harness (envtest, Cluster API's Cluster and
// Machine controllers, the restartable provider, a real libvirtd with a
// test pool), without its network: clusters here bring their own.
type clusterHarness struct {
	*harness
	lbImage    string
	lbImageSum string
}

func newClusterHarness(t *testing.T) *clusterHarness {
	t.Helper()
	useControllerLog(t)
	h := &clusterHarness{harness: &harness{t: t, ctx: context.Background(), uri: testlibvirt.URI(t), image: testlibvirt.Image(t),
		logs: controllerLog, logPath: controllerLogPath}}
	h.lbImage = os.Getenv(envHAProxyImage)
	if h.lbImage == "" {
		h.lbImage = filepath.Join(filepath.Dir(h.image), "capl-debian-12-haproxy.qcow2")
	}
	var err error
	for _, img := range []struct{ path, sum *string }{{&h.image, &h.imageSum}, {&h.lbImage, &h.lbImageSum}} {
		if *img.sum, err = fileSHA256(*img.path); err != nil {
			t.Fatalf("test image: %v (build it with `make images`)", err)
		}
	}
	h.host = testlibvirt.Client(t, h.uri)
	// Registered first, so it runs last: after the clusters, pool and networks.
	t.Cleanup(func() { testlibvirt.AssertNothingOwned(t, h.uri) })

	h.env, err = testenv.Start()
	must(t, err)
	t.Cleanup(func() { _ = h.env.Stop() })
	h.c = h.env.Client
	capi, err := h.env.StartCAPI()
	must(t, err)
	t.Cleanup(func() { _ = capi.Stop() })

	h.pool = testlibvirt.Pool(t, h.uri, h.host)
	h.poolPath = filepath.Join(testlibvirt.PoolRoot, h.pool)
	h.ns = testlibvirt.Name(t)
	must(t, h.c.Create(h.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.ns}}))
	t.Cleanup(h.stopProvider)
	t.Cleanup(h.cleanup)
	return h
}

// clusterOpts shape a test cluster.
type clusterOpts struct {
	spec infrav1.LibvirtClusterSpec
	// noCluster leaves out the owning Cluster; paused pauses it.
	noCluster, paused bool
	annotations       map[string]string
	finalizers        []string
}

// createCluster creates a LibvirtCluster on the test pool and, unless
// told otherwise, its Cluster.
func (h *clusterHarness) createCluster(name string, o clusterOpts) {
	h.t.Helper()
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name, Annotations: o.annotations, Finalizers: o.finalizers,
		Labels: map[string]string{clusterv1.ClusterNameLabel: name}}, Spec: o.spec}
	lc.Spec.StoragePool = infrav1.StoragePool{Name: h.pool, Path: h.poolPath}
	must(h.t, h.c.Create(h.ctx, lc))
	if !o.noCluster {
		h.createOwner(name, o.paused)
	}
}

func (h *clusterHarness) createOwner(name string, paused bool) {
	h.t.Helper()
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}
	cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtCluster", Name: name}
	cluster.Spec.Paused = ptr.To(paused)
	must(h.t, h.c.Create(h.ctx, cluster))
}

func (h *clusterHarness) lc(name string) *infrav1.LibvirtCluster {
	h.t.Helper()
	lc := &infrav1.LibvirtCluster{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, lc))
	return lc
}

// waitCluster waits until fn accepts the LibvirtCluster and returns it.
func (h *clusterHarness) waitCluster(name, what string, timeout time.Duration, fn func(*infrav1.LibvirtCluster) (bool, string)) *infrav1.LibvirtCluster {
	h.t.Helper()
	var lc *infrav1.LibvirtCluster
	h.waitFor(name+": "+what, timeout, func() (bool, string) {
		lc = &infrav1.LibvirtCluster{}
		if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, lc); err != nil {
			return false, err.Error()
		}
		return fn(lc)
	})
	return lc
}

// waitClusterCondition waits for the LibvirtCluster's condition to have
// status and reason.
func (h *clusterHarness) waitClusterCondition(name, condType string, status metav1.ConditionStatus, reason string, timeout time.Duration) *infrav1.LibvirtCluster {
	h.t.Helper()
	return h.waitCluster(name, fmt.Sprintf("%s=%s/%s", condType, status, reason), timeout, func(lc *infrav1.LibvirtCluster) (bool, string) {
		c := conditions.Get(lc, condType)
		if c == nil {
			return false, "condition absent"
		}
		return c.Status == status && c.Reason == reason, fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message)
	})
}

// deleteAndWait deletes obj and waits until it is gone.
func (h *clusterHarness) deleteAndWait(obj client.Object, timeout time.Duration) {
	h.t.Helper()
	if err := h.c.Delete(h.ctx, obj); err != nil && !apierrors.IsNotFound(err) {
		h.t.Fatal(err)
	}
	h.waitFor(fmt.Sprintf("deletion of %T %s", obj, obj.GetName()), timeout, func() (bool, string) {
		err := h.c.Get(h.ctx, client.ObjectKeyFromObject(obj), obj)
		return apierrors.IsNotFound(err), fmt.Sprint(err)
	})
}

// readyzUserData starts a stand-in API server: python3 answering GET
// /readyz over TLS on 6443 with the guest's hostname (its Machine's name),
// under a systemd unit the test can stop and start through the guest agent.
const readyzUserData = `#cloud-config
write_files:
- path: /usr/local/bin/capl-readyz.py
  content: |
    import http.server, socket, ssl
    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            body = (socket.gethostname() + "\n").encode()
            self.send_response(200 if self.path == "/readyz" else 404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)
        def log_message(self, *args):
            pass
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain("/etc/capl-readyz/tls.crt", "/etc/capl-readyz/tls.key")
    srv = http.server.ThreadingHTTPServer(("", 6443), Handler)
    srv.socket = ctx.wrap_socket(srv.socket, server_side=True)
    srv.serve_forever()
- path: /etc/systemd/system/capl-readyz.service
  content: |
    [Unit]
    Description=Stand-in API server answering /readyz over TLS on 6443
    [Service]
    ExecStart=/usr/bin/python3 /usr/local/bin/capl-readyz.py
    Restart=no
runcmd:
- [sh, -c, "mkdir -p /etc/capl-readyz && openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 -subj /CN=$(hostname) -keyout /etc/capl-readyz/tls.key -out /etc/capl-readyz/tls.crt"]
- [systemctl, daemon-reload]
- [systemctl, start, capl-readyz.service]
- [sh, -c, "mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete"]
`

// createControlPlaneMachine creates a control-plane Machine of cluster with
// its bootstrap Secret and LibvirtMachine, booting the base image with the
// stand-in API server.
func (h *clusterHarness) createControlPlaneMachine(cluster, name string) {
	h.t.Helper()
	labels := map[string]string{clusterv1.ClusterNameLabel: cluster}
	must(h.t, h.c.Create(h.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name + "-bootstrap", Labels: labels},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"value": []byte(readyzUserData), "format": []byte("cloud-config")},
	}))
	// The LibvirtMachine carries only the cluster label, as with
	// MachineDeployments: the controller learns it is a control-plane
	// machine from its Machine.
	lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name, Labels: labels}}
	lm.Spec.Image = infrav1.ImageSource{URL: "file://" + h.image, Checksum: "sha256:" + h.imageSum}
	lm.Spec.VirtualHardware = tcgHardware()
	lm.Spec.DiskSizeGiB = 4
	must(h.t, h.c.Create(h.ctx, lm))
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name,
		Labels: map[string]string{clusterv1.ClusterNameLabel: cluster, clusterv1.MachineControlPlaneLabel: ""}}}
	m.Spec.ClusterName = cluster
	m.Spec.Bootstrap.DataSecretName = ptr.To(name + "-bootstrap")
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachine", Name: name}
	must(h.t, h.c.Create(h.ctx, m))
}

// tcgHardware is the shape of every test VM: TCG, as CI has no usable KVM,
// with the TCG profile's CPU model, whose TLS and boot cost less than
// maximum's on slow hosts (docs/tcg.md).
func tcgHardware() infrav1.VirtualHardware {
	return infrav1.VirtualHardware{CPUs: 1, MemoryMiB: 512, DomainType: infrav1.DomainTypeQEMU,
		CPUMode: infrav1.CPUModeCustom, CPUModel: devplane.TCGCPUModel, TCGTranslationCacheMiB: 128}
}

// libvirtMachine reads a LibvirtMachine; nil when it is gone.
func (h *clusterHarness) libvirtMachine(name string) *infrav1.LibvirtMachine {
	lm := &infrav1.LibvirtMachine{}
	if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, lm); err != nil {
		return nil
	}
	return lm
}

// readyz asks the endpoint's /readyz over a fresh TLS connection and
// returns the body: the hostname of the API server HAProxy picked.
func readyz(endpoint string) (string, error) {
	return devplane.Readyz(context.Background(), endpoint)
}

// answers sends n requests through the endpoint and counts the answers per
// hostname; failed requests count under "error".
func answers(endpoint string, n int) map[string]int {
	out := map[string]int{}
	for range n {
		host, err := readyz(endpoint)
		if err != nil {
			host = "error"
		}
		out[host]++
	}
	return out
}

// haproxyServer is one server of the control-plane backend as HAProxy's
// `show stat` reports it.
type haproxyServer struct {
	Status string // UP, DOWN, "UP 1/2"…
	Weight string
}

// haproxyServers reads the running HAProxy's servers through the guest
// agent of the VM.
func (h *clusterHarness) haproxyServers(domain string) (map[string]haproxyServer, error) {
	out, err := loadbalancer.Stats(h.ctx, h.host, domain, "show stat")
	if err != nil {
		return nil, err
	}
	rows, err := csv.NewReader(strings.NewReader(strings.TrimPrefix(out, "# "))).ReadAll()
	if err != nil || len(rows) == 0 {
		return nil, fmt.Errorf("parsing show stat: %v: %q", err, out)
	}
	col := map[string]int{}
	for i, name := range rows[0] {
		col[name] = i
	}
	servers := map[string]haproxyServer{}
	for _, r := range rows[1:] {
		if len(r) < len(rows[0]) || r[col["pxname"]] != "control-plane" || r[col["svname"]] == "FRONTEND" || r[col["svname"]] == "BACKEND" {
			continue
		}
		servers[r[col["svname"]]] = haproxyServer{Status: r[col["status"]], Weight: r[col["weight"]]}
	}
	return servers, nil
}

// haproxyInfo reads `show info` of the running HAProxy.
func (h *clusterHarness) haproxyInfo(domain string) map[string]string {
	h.t.Helper()
	out, err := loadbalancer.Stats(h.ctx, h.host, domain, "show info")
	must(h.t, err)
	return loadbalancer.ParseInfo(out)
}

// reconciles is how many reconciles the LibvirtCluster controllers of
// this process have finished, from controller-runtime's metrics.
func reconciles(t *testing.T) float64 {
	t.Helper()
	families, err := ctrlmetrics.Registry.Gather()
	must(t, err)
	total := 0.0
	for _, f := range families {
		if f.GetName() != "controller_runtime_reconcile_total" {
			continue
		}
		for _, m := range f.GetMetric() {
			for _, l := range m.GetLabel() {
				if l.GetName() == "controller" && l.GetValue() == "libvirtcluster" {
					total += m.GetCounter().GetValue()
				}
			}
		}
	}
	return total
}

// cleanup deletes what a failed scenario left: Machines, LibvirtClusters
// and Clusters of the test namespace, with a provider running.
func (h *clusterHarness) cleanup() {
	ctx := context.Background()
	h.mu.Lock()
	running := h.provider != nil
	h.mu.Unlock()
	if !running {
		h.startProvider(nil)
	}
	for _, list := range []client.ObjectList{&clusterv1.MachineList{}, &infrav1.LibvirtClusterList{}, &clusterv1.ClusterList{}} {
		if err := h.c.List(ctx, list, client.InNamespace(h.ns)); err != nil {
			continue
		}
		objs, _ := metaItems(list)
		for _, o := range objs {
			_ = h.c.Delete(ctx, o)
		}
	}
	deadline := time.Now().Add(4 * time.Minute)
	for time.Now().Before(deadline) {
		left := &infrav1.LibvirtClusterList{}
		machines := &infrav1.LibvirtMachineList{}
		if h.c.List(ctx, left, client.InNamespace(h.ns)) == nil && h.c.List(ctx, machines, client.InNamespace(h.ns)) == nil &&
			len(left.Items) == 0 && len(machines.Items) == 0 {
			return
		}
		time.Sleep(time.Second)
	}
	h.t.Errorf("objects of namespace %s still there after cleanup", h.ns)
}

// metaItems returns the members of a list.
func metaItems(list client.ObjectList) ([]client.Object, error) {
	objs, err := apimeta.ExtractList(list)
	if err != nil {
		return nil, err
	}
	out := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(client.Object))
	}
	return out, nil
}
