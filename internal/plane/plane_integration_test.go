package plane

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
