package controllers_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
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

func must(t testing.TB, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
