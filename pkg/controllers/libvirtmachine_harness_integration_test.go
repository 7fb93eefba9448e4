package controllers_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/netip"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"libvirt.org/go/libvirt"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// secretMarker is planted in every bootstrap Secret; it must never show up
// in a condition, an event or a log line.
const secretMarker = "capl-secret-marker-7f3e9a1c"

// harness is the whole management plane of one test run: envtest, Cluster
// API's Cluster and Machine controllers, the provider's manager (restartable)
// and a real libvirtd with a test pool and NAT network.
type harness struct {
	// booted is set once a scenario booted guests to the end (bootstrap
	// sentinel, a domain destroyed behind the provider's back), which is
	// what emits the Provisioned, TerminalFailure and DomainMissing events.
	booted   bool
	t        *testing.T
	ctx      context.Context
	env      *testenv.Environment
	c        client.Client
	uri      string
	image    string
	imageSum string
	host     *virt.Client // the test's own view of libvirt
	pool     string
	poolPath string
	network  virt.NetworkInfo
	ns       string
	logs     *syncBuffer
	logPath  string

	// options, when set, adjusts the manager options of startProvider.
	options func(*manager.Options)

	mu           sync.Mutex
	provider     *testenv.Provider
	providerConn *virt.Client
}

// syncBuffer collects log output from many goroutines.
type syncBuffer struct {
	mu  sync.Mutex
	buf bytes.Buffer
}

func (b *syncBuffer) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.Write(p)
}

func (b *syncBuffer) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.buf.String()
}

// The controllers' logger is process-wide (ctrl.SetLogger), so every
// harness of the test process shares one log: the leak check of each
// reads all that the controllers logged since the process started.
var (
	controllerLogOnce sync.Once
	controllerLog     = &syncBuffer{}
	controllerLogPath string
)

// useControllerLog starts the process's controller log once, and tells t
// where it is kept (outside t.TempDir, for post-mortems).
func useControllerLog(t *testing.T) {
	t.Helper()
	controllerLogOnce.Do(func() {
		f, err := os.CreateTemp("", "capl-controllers-test-*.log")
		if err != nil {
			t.Fatal(err)
		}
		// Open for the life of the process, as the logger is.
		controllerLogPath = f.Name()
		w := io.MultiWriter(controllerLog, f)
		// Down to V(7), so the leak check sees debug lines too. From V(8) on
		// client-go dumps HTTP bodies, Secrets included (base64), as it
		// does for every controller; nobody runs a manager at that level.
		ctrl.SetLogger(funcr.New(func(prefix, args string) {
			fmt.Fprintf(w, "%s %s %s\n", time.Now().Format("15:04:05.000"), prefix, args)
		}, funcr.Options{Verbosity: 7}))
	})
	t.Logf("controller logs: %s", controllerLogPath)
}

func newHarness(t *testing.T) *harness {
	t.Helper()
	useControllerLog(t)
	h := &harness{t: t, ctx: context.Background(), uri: testlibvirt.URI(t), image: testlibvirt.Image(t), logs: controllerLog, logPath: controllerLogPath}

	sum, err := fileSHA256(h.image)
	if err != nil {
		t.Fatal(err)
	}
	h.imageSum = sum

	h.host = testlibvirt.Client(t, h.uri)
	// Registered first, so it runs last: after machines, pool and network.
	t.Cleanup(func() { testlibvirt.AssertNothingOwned(t, h.uri) })

	h.env, err = testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = h.env.Stop() })
	h.c = h.env.Client
	capi, err := h.env.StartCAPI()
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = capi.Stop() })

	h.pool = testlibvirt.Pool(t, h.uri, h.host)
	h.poolPath = filepath.Join(testlibvirt.PoolRoot, h.pool)
	h.ns = testlibvirt.Name(t)
	if err := h.c.Create(h.ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: h.ns}}); err != nil {
		t.Fatal(err)
	}
	netName := testlibvirt.Name(t)
	h.network, err = h.host.EnsureNetwork(h.ctx, virt.NetworkSpec{Name: netName,
		Owner: virt.Owner{Kind: "LibvirtCluster", Namespace: h.ns, Name: netName, Cluster: netName}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		if err := h.host.DeleteNetwork(context.Background(), netName); err != nil {
			t.Errorf("deleting test network: %v", err)
		}
	})
	t.Cleanup(h.stopProvider)
	t.Cleanup(h.cleanupMachines)
	return h
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	d := sha256.New()
	if _, err := io.Copy(d, f); err != nil {
		return "", err
	}
	return hex.EncodeToString(d.Sum(nil)), nil
}

// startProvider starts the provider's manager on a fresh libvirt connection
// (as a restarted process would have), optionally wrapping the Host.
func (h *harness) startProvider(wrap func(virt.Host) virt.Host) *testenv.Provider {
	h.t.Helper()
	conn, err := virt.Dial(h.ctx, h.uri)
	if err != nil {
		h.t.Fatal(err)
	}
	var host virt.Host = conn
	if wrap != nil {
		host = wrap(conn)
	}
	opts, err := testenv.ProviderOptions(h.t.TempDir())
	if err != nil {
		h.t.Fatal(err)
	}
	opts.LibvirtURI = h.uri
	// Volumes named in the tests' image.volume live in the test pool, and
	// the file:// images next to the test image.
	opts.ImagePools = append(opts.ImagePools, h.pool)
	opts.ImageFileDirs = testlibvirt.FilePolicy(h.image).FileDirs
	if h.options != nil {
		h.options(&opts)
	}
	p, err := h.env.StartProvider(opts, manager.Wiring{
		Host: host, HostName: hosts.HostName(h.uri),
		MachineShutdownTimeout: 15 * time.Second, SkipControllerNameValidation: true,
	})
	if err != nil {
		_ = conn.Close()
		h.t.Fatal(err)
	}
	h.mu.Lock()
	h.provider, h.providerConn = p, conn
	h.mu.Unlock()
	return p
}

// stopProvider stops the running provider, if any, and closes its connection.
func (h *harness) stopProvider() {
	h.mu.Lock()
	p, conn := h.provider, h.providerConn
	h.provider, h.providerConn = nil, nil
	h.mu.Unlock()
	if p != nil {
		_ = p.Stop()
	}
	if conn != nil {
		_ = conn.Close()
	}
}

// createCluster creates a Cluster and its LibvirtCluster on the test pool;
// when provisioned, it plays the (not yet written) LibvirtCluster
// controller: status.network and initialization.provisioned are set through
// the status subresource, and the test waits for Cluster API to see them.
func (h *harness) createCluster(name string, provisioned bool) {
	h.t.Helper()
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name,
		Labels: map[string]string{clusterv1.ClusterNameLabel: name},
		// The test plays the cluster's infrastructure manager, so the
		// LibvirtCluster controller leaves it alone.
		Annotations: map[string]string{clusterv1.ManagedByAnnotation: "capl-machine-test"}}}
	lc.Spec.StoragePool = infrav1.StoragePool{Name: h.pool, Path: h.poolPath}
	must(h.t, h.c.Create(h.ctx, lc))
	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}
	cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtCluster", Name: name}
	must(h.t, h.c.Create(h.ctx, cluster))
	if provisioned {
		h.provisionCluster(name)
	}
}

func (h *harness) provisionCluster(name string) {
	h.t.Helper()
	lc := &infrav1.LibvirtCluster{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, lc))
	lc.Status.Network = &infrav1.NetworkStatus{Name: h.network.Name, Bridge: h.network.Bridge, CIDR: h.network.CIDR.String(), Managed: true}
	lc.Status.Initialization.Provisioned = ptr.To(true)
	lc.Status.Ready = true
	must(h.t, h.c.Status().Update(h.ctx, lc))
	h.waitFor("Cluster "+name+" infrastructure provisioned", time.Minute, func() (bool, string) {
		c := &clusterv1.Cluster{}
		if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, c); err != nil {
			return false, err.Error()
		}
		return ptr.Deref(c.Status.Initialization.InfrastructureProvisioned, false), "not yet"
	})
}

func (h *harness) setClusterPaused(name string, paused bool) {
	h.t.Helper()
	c := &clusterv1.Cluster{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, c))
	patch := client.MergeFrom(c.DeepCopy())
	c.Spec.Paused = ptr.To(paused)
	must(h.t, h.c.Patch(h.ctx, c, patch))
}

// machineOpts shape a test machine.
type machineOpts struct {
	cluster string
	// userData, when set, goes into the bootstrap Secret.
	userData string
	// format of the Secret; empty means cloud-config.
	format string
	// withData sets Machine.spec.bootstrap.dataSecretName at creation.
	withData bool
	// image overrides the default (the test image imported by URL).
	image         *infrav1.ImageSource
	failureDomain string
	// memoryMiB overrides the default 512.
	memoryMiB int32
	// dataDisks are the LibvirtMachine's.
	dataDisks []infrav1.DataDisk
	// annotations and finalizers go onto the LibvirtMachine as it is
	// created.
	annotations map[string]string
	finalizers  []string
}

// bootUserData makes cloud-init write the Node-identity file from the
// rendered instance-id (as a kubelet provider-id template would) and the
// Cluster API bootstrap sentinel.
func bootUserData() string {
	return `## template: jinja
#cloud-config
# ` + secretMarker + `
write_files:
- path: /run/capl-test/provider-id
  content: "libvirt:///{{ ds.meta_data.instance_id }}"
runcmd:
- [sh, -c, "mkdir -p /run/cluster-api && echo success > /run/cluster-api/bootstrap-success.complete"]
`
}

// createMachine creates the bootstrap Secret, the LibvirtMachine and the
// Machine, as a MachineDeployment and a bootstrap provider would.
func (h *harness) createMachine(name string, o machineOpts) {
	h.t.Helper()
	labels := map[string]string{clusterv1.ClusterNameLabel: o.cluster}
	if o.userData == "" {
		o.userData = "#cloud-config\n# " + secretMarker + "\n"
	}
	format := o.format
	if format == "" {
		format = "cloud-config"
	}
	must(h.t, h.c.Create(h.ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name + "-bootstrap", Labels: labels},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"value": []byte(o.userData), "format": []byte(format)},
	}))
	lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name, Labels: labels, Annotations: o.annotations, Finalizers: o.finalizers}}
	lm.Spec.Image = infrav1.ImageSource{URL: "file://" + h.image, Checksum: "sha256:" + h.imageSum}
	if o.image != nil {
		lm.Spec.Image = *o.image
	}
	lm.Spec.VirtualHardware = infrav1.VirtualHardware{CPUs: 1, MemoryMiB: 512, DomainType: infrav1.DomainTypeQEMU,
		CPUMode: infrav1.CPUModeMaximum, TCGTranslationCacheMiB: 128}
	if o.memoryMiB != 0 {
		lm.Spec.MemoryMiB = o.memoryMiB
	}
	lm.Spec.DiskSizeGiB = 4
	lm.Spec.DataDisks = o.dataDisks
	must(h.t, h.c.Create(h.ctx, lm))

	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name, Labels: labels}}
	m.Spec.ClusterName = o.cluster
	m.Spec.FailureDomain = o.failureDomain
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{
		APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachine", Name: name}
	if o.withData {
		m.Spec.Bootstrap.DataSecretName = ptr.To(name + "-bootstrap")
	}
	// No bootstrap provider runs: a Machine without data gets an empty
	// bootstrap (the typed client would drop it), and the test sets
	// dataSecretName later, as a bootstrap provider would.
	u, err := runtime.DefaultUnstructuredConverter.ToUnstructured(m)
	must(h.t, err)
	obj := &unstructured.Unstructured{Object: u}
	obj.SetGroupVersionKind(clusterv1.GroupVersion.WithKind("Machine"))
	if !o.withData {
		must(h.t, unstructured.SetNestedMap(obj.Object, map[string]any{}, "spec", "bootstrap"))
	}
	must(h.t, h.c.Create(h.ctx, obj))
}

// setBootstrapData plays the bootstrap provider.
func (h *harness) setBootstrapData(name string) {
	h.t.Helper()
	m := h.machine(name)
	patch := client.MergeFrom(m.DeepCopy())
	m.Spec.Bootstrap.DataSecretName = ptr.To(name + "-bootstrap")
	must(h.t, h.c.Patch(h.ctx, m, patch))
}

func (h *harness) machine(name string) *clusterv1.Machine {
	h.t.Helper()
	m := &clusterv1.Machine{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, m))
	return m
}

func (h *harness) lm(name string) *infrav1.LibvirtMachine {
	h.t.Helper()
	lm := &infrav1.LibvirtMachine{}
	must(h.t, h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, lm))
	return lm
}

// waitCondition waits until the LibvirtMachine's condition has status and
// reason, and returns the machine.
func (h *harness) waitCondition(name, condType string, status metav1.ConditionStatus, reason string, timeout time.Duration) *infrav1.LibvirtMachine {
	h.t.Helper()
	var lm *infrav1.LibvirtMachine
	h.waitFor(fmt.Sprintf("%s %s=%s/%s", name, condType, status, reason), timeout, func() (bool, string) {
		lm = &infrav1.LibvirtMachine{}
		if err := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, lm); err != nil {
			return false, err.Error()
		}
		c := conditions.Get(lm, condType)
		if c == nil {
			return false, "condition absent"
		}
		return c.Status == status && c.Reason == reason, fmt.Sprintf("%s/%s: %s", c.Status, c.Reason, c.Message)
	})
	return lm
}

// waitFor polls fn every 200ms until it reports done or timeout passes.
func (h *harness) waitFor(what string, timeout time.Duration, fn func() (bool, string)) {
	h.t.Helper()
	deadline := time.Now().Add(timeout)
	last := ""
	for {
		done, state := fn()
		if done {
			return
		}
		last = state
		if time.Now().After(deadline) {
			h.t.Fatalf("timed out after %s waiting for %s; last: %s", timeout, what, last)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// deleteMachine deletes the Machine (Cluster API deletes the LibvirtMachine
// first) and waits until both are gone.
func (h *harness) deleteMachine(name string, timeout time.Duration) {
	h.t.Helper()
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: h.ns, Name: name}}
	if err := h.c.Delete(h.ctx, m); err != nil && !apierrors.IsNotFound(err) {
		h.t.Fatal(err)
	}
	h.waitFor("deletion of "+name, timeout, func() (bool, string) {
		errLM := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &infrav1.LibvirtMachine{})
		errM := h.c.Get(h.ctx, client.ObjectKey{Namespace: h.ns, Name: name}, &clusterv1.Machine{})
		return apierrors.IsNotFound(errLM) && apierrors.IsNotFound(errM), fmt.Sprintf("LibvirtMachine: %v, Machine: %v", errLM, errM)
	})
}

// assertClean fails when anything of the named machine is left in libvirt:
// its domain, overlay, data disks, seed, console log or DHCP host entry.
func (h *harness) assertClean(name, mac string) {
	h.t.Helper()
	domain := naming.DomainName(h.ns, name)
	if _, err := h.host.DomainInfo(h.ctx, domain); !virt.IsNotFound(err) {
		h.t.Errorf("domain %s left behind (err %v)", domain, err)
	}
	for _, vol := range h.poolVolumes() {
		if naming.IsDataDiskVolumeOf(domain, vol) {
			h.t.Errorf("data disk %s left behind", vol)
		}
	}
	for _, vol := range []string{naming.OverlayVolumeName(domain), naming.SeedVolumeName(domain), naming.ConsoleLogVolumeName(domain)} {
		if _, err := h.host.VolumeInfo(h.ctx, h.pool, vol); !virt.IsNotFound(err) {
			h.t.Errorf("volume %s left behind (err %v)", vol, err)
		}
	}
	entries, err := h.host.Reservations(h.ctx, h.network.Name)
	if err != nil {
		h.t.Fatal(err)
	}
	for _, e := range entries {
		if mac != "" && netalloc.SameMAC(e.MAC.String(), mac) {
			h.t.Errorf("reservation %s→%s left behind", e.MAC, e.IP)
		}
	}
}

// assertNoLibvirtObjects checks that nothing was created for a machine.
func (h *harness) assertNoLibvirtObjects(name string) {
	h.t.Helper()
	lm := h.lm(name)
	if lm.Status.Domain != nil && lm.Status.Domain.MAC != "" {
		h.t.Errorf("%s chose a MAC while it should wait", name)
	}
	h.assertClean(name, "")
}

// poolVolumes lists the test pool's volume names through a connection of
// its own.
func (h *harness) poolVolumes() []string {
	h.t.Helper()
	conn, err := libvirt.NewConnect(h.uri)
	must(h.t, err)
	defer conn.Close()
	pool, err := conn.LookupStoragePoolByName(h.pool)
	must(h.t, err)
	defer pool.Free()
	must(h.t, pool.Refresh(0))
	names, err := pool.ListStorageVolumes()
	must(h.t, err)
	sort.Strings(names)
	return names
}

// leaseIP is the address dnsmasq leased to mac, if any.
func (h *harness) leaseIP(mac string) (netip.Addr, bool) {
	addrs, err := h.host.Addresses(h.ctx, virt.AddressQuery{Network: h.network.Name, MAC: netalloc.MAC(mac)})
	if err != nil {
		return netip.Addr{}, false
	}
	for _, a := range addrs {
		if a.Source == virt.AddressSourceLease {
			return a.IP, true
		}
	}
	return netip.Addr{}, false
}

// destroyBehindOurBack destroys and undefines a domain outside the provider.
func (h *harness) destroyBehindOurBack(domain string) {
	h.t.Helper()
	conn, err := libvirt.NewConnect(h.uri)
	must(h.t, err)
	defer conn.Close()
	dom, err := conn.LookupDomainByName(domain)
	must(h.t, err)
	defer dom.Free()
	if err := dom.Destroy(); err != nil {
		h.t.Logf("destroy: %v", err)
	}
	must(h.t, dom.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM))
}

// assertNoSecretLeaks checks events and controller logs for bootstrap data.
func (h *harness) assertNoSecretLeaks() {
	h.t.Helper()
	events := &corev1.EventList{}
	must(h.t, h.c.List(h.ctx, events, client.InNamespace(h.ns)))
	for _, ev := range events.Items {
		if strings.Contains(ev.Message, secretMarker) || strings.Contains(ev.Reason, secretMarker) {
			h.t.Errorf("event %s/%s leaks bootstrap data", ev.Reason, ev.Name)
		}
	}
	logs := h.logs.String()
	for _, needle := range leakNeedles() {
		if strings.Contains(logs, needle) {
			h.t.Errorf("controller logs leak bootstrap data %q (see %s)", needle, h.logPath)
		}
	}
	lms := &infrav1.LibvirtMachineList{}
	must(h.t, h.c.List(h.ctx, lms, client.InNamespace(h.ns)))
	for _, lm := range lms.Items {
		for _, c := range lm.Status.Conditions {
			if strings.Contains(c.Message, secretMarker) {
				h.t.Errorf("condition %s of %s leaks bootstrap data", c.Type, lm.Name)
			}
		}
	}
	h.t.Logf("checked %d events and %d bytes of logs for bootstrap data", len(events.Items), len(h.logs.String()))

	// Transitions were recorded as events.
	seen := map[string]bool{}
	for _, ev := range events.Items {
		if ev.InvolvedObject.Kind == "LibvirtMachine" {
			seen[ev.Reason] = true
		}
	}
	reasons := []string{"DomainDefined", "DomainStarted", infrav1.ImageNotFoundReason, infrav1.UnsupportedBootstrapFormatReason}
	if h.booted {
		reasons = append(reasons, "Provisioned", "TerminalFailure", infrav1.DomainMissingReason)
	}
	for _, reason := range reasons {
		if !seen[reason] {
			h.t.Errorf("no %s event on any LibvirtMachine", reason)
		}
	}
}

// cleanupMachines deletes every Machine left by a failed test, then
// destroys any domain of the test namespace the provider did not remove.
func (h *harness) cleanupMachines() {
	ctx := context.Background()
	machines := &clusterv1.MachineList{}
	if err := h.c.List(ctx, machines, client.InNamespace(h.ns)); err == nil && len(machines.Items) > 0 {
		h.mu.Lock()
		running := h.provider != nil
		h.mu.Unlock()
		if !running {
			h.startProvider(nil)
		}
		for i := range machines.Items {
			_ = h.c.Delete(ctx, &machines.Items[i])
		}
		deadline := time.Now().Add(3 * time.Minute)
		for time.Now().Before(deadline) {
			left := &infrav1.LibvirtMachineList{}
			if err := h.c.List(ctx, left, client.InNamespace(h.ns)); err != nil || len(left.Items) == 0 {
				break
			}
			time.Sleep(time.Second)
		}
	}
	conn, err := libvirt.NewConnect(h.uri)
	if err != nil {
		return
	}
	defer conn.Close()
	doms, err := conn.ListAllDomains(0)
	if err != nil {
		return
	}
	for i := range doms {
		name, _ := doms[i].GetName()
		if strings.HasPrefix(name, naming.DomainName(h.ns, "")) {
			h.t.Errorf("force-removing domain %s left by the test", name)
			_ = doms[i].Destroy()
			_ = doms[i].UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM)
		}
		_ = doms[i].Free()
	}
}

// hookHost wraps the real Host to act around the create steps: simulate a
// crash right after a step succeeded in libvirt, or restart libvirtd before
// a step runs.
type hookHost struct {
	virt.Host
	before func(ctx context.Context, method, object string)
	after  func(ctx context.Context, method string, err error) error
}

func (w *hookHost) run(ctx context.Context, method, object string, fn func() error) error {
	if w.before != nil {
		w.before(ctx, method, object)
	}
	err := fn()
	if w.after != nil {
		err = w.after(ctx, method, err)
	}
	return err
}

func (w *hookHost) ReserveAddress(ctx context.Context, network string, r virt.Reservation) (ip netip.Addr, err error) {
	err = w.run(ctx, "ReserveAddress", r.MAC.String(), func() error { ip, err = w.Host.ReserveAddress(ctx, network, r); return err })
	return ip, err
}

func (w *hookHost) ImportImage(ctx context.Context, img virt.ImageImport) (info virt.VolumeInfo, err error) {
	err = w.run(ctx, "ImportImage", img.Volume, func() error { info, err = w.Host.ImportImage(ctx, img); return err })
	return info, err
}

func (w *hookHost) EnsureOverlay(ctx context.Context, spec virt.OverlaySpec) (info virt.VolumeInfo, err error) {
	err = w.run(ctx, "EnsureOverlay", spec.Name, func() error { info, err = w.Host.EnsureOverlay(ctx, spec); return err })
	return info, err
}

func (w *hookHost) UploadVolume(ctx context.Context, pool, name string, data []byte) (info virt.VolumeInfo, err error) {
	err = w.run(ctx, "UploadVolume", name, func() error { info, err = w.Host.UploadVolume(ctx, pool, name, data); return err })
	return info, err
}

func (w *hookHost) EnsureDomain(ctx context.Context, spec virt.DomainSpec) (info virt.DomainInfo, err error) {
	err = w.run(ctx, "EnsureDomain", spec.Name, func() error { info, err = w.Host.EnsureDomain(ctx, spec); return err })
	return info, err
}

func (w *hookHost) StartDomain(ctx context.Context, name string) error {
	return w.run(ctx, "StartDomain", name, func() error { return w.Host.StartDomain(ctx, name) })
}

var errSimulatedCrash = errors.New("simulated crash of the manager")

// restartLibvirtd stops libvirtd and starts it again; running guests keep
// running (QEMU does not depend on libvirtd). It runs on a reconcile's
// goroutine, so it reports errors instead of failing the test itself.
func restartLibvirtd(uri string) (time.Duration, error) {
	start := time.Now()
	if _, err := testlibvirt.StopLibvirtd(time.Minute); err != nil {
		return 0, err
	}
	if err := testlibvirt.StartLibvirtd(); err != nil {
		return 0, err
	}
	if err := testlibvirt.WaitLibvirtd(uri, time.Minute); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}

// leakNeedles are the marker and what it looks like inside base64 at each
// of the three alignments (with the unstable edge characters cut off).
func leakNeedles() []string {
	out := []string{secretMarker}
	for pad := range 3 {
		enc := base64.StdEncoding.EncodeToString(append(make([]byte, pad), secretMarker...))
		out = append(out, enc[4:len(enc)-4])
	}
	return out
}

func median(ds []time.Duration) time.Duration {
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
