package devplane

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"
)

// TestPlaneLifecycle runs the real binaries: Start spawns `capl-dev serve`,
// which supervises the manager; a SIGKILLed manager is replaced; Stop and a
// second Start keep etcd's data, also after the plane was SIGKILLed; Down
// stops the plane (or what a killed one left) and removes the state
// directory. No VM is created (the libvirt sweep has nothing in scope).
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
	o := Options{StateDir: filepath.Join(t.TempDir(), "plane"), LibvirtURI: uri, ManagerBinary: filepath.Join(bin, "manager"), Log: t.Logf}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{serveLogName, managerLogName} {
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
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	p, err := Start(ctx, o, filepath.Join(bin, "capl-dev"))
	if err != nil {
		t.Fatal(err)
	}

	// Start again attaches to the running plane.
	again, err := Start(ctx, o, filepath.Join(bin, "capl-dev"))
	if err != nil || again.Endpoints.ServePID != p.Endpoints.ServePID {
		t.Fatalf("second Start: %v, serve pid %d, want %d", err, again.Endpoints.ServePID, p.Endpoints.ServePID)
	}

	old, err := p.KillManager()
	if err != nil {
		t.Fatal(err)
	}
	started := time.Now()
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
	metrics, err := p.ManagerMetrics(ctx)
	if err != nil || !strings.Contains(metrics, "controller_runtime_reconcile_total") {
		t.Fatalf("manager metrics (%v) lack controller_runtime_reconcile_total:\n%.500s", err, metrics)
	}
	t.Logf("manager RSS %d MiB", rss>>20)

	// etcd's data survives a restart of the plane.
	cm := &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "kept"}, Data: map[string]string{"k": "v"}}
	must(t, p.Client.Create(ctx, cm))
	must(t, p.Stop(ctx))
	if _, err := Attach(o.StateDir); err == nil {
		t.Fatal("Attach succeeded on a stopped plane")
	}
	p, err = Start(ctx, o, filepath.Join(bin, "capl-dev"))
	if err != nil {
		t.Fatal(err)
	}
	got := &corev1.ConfigMap{}
	must(t, p.Client.Get(ctx, client.ObjectKeyFromObject(cm), got))
	if got.Data["k"] != "v" {
		t.Fatalf("ConfigMap after restart: %v", got.Data)
	}

	// A plane killed with SIGKILL leaves etcd and kube-apiserver behind
	// (the manager dies with it); the next Start stops them and finds the
	// data, and so does Down.
	killPlane := func() {
		t.Helper()
		managerPID, err := p.ManagerPID()
		must(t, err)
		must(t, syscall.Kill(p.Endpoints.ServePID, syscall.SIGKILL))
		for deadline := time.Now().Add(30 * time.Second); processAlive(managerPID, "") || processAlive(p.Endpoints.ServePID, ""); {
			if time.Now().After(deadline) {
				t.Fatalf("plane pid %d or manager pid %d still alive after SIGKILL of the plane", p.Endpoints.ServePID, managerPID)
			}
			time.Sleep(pollInterval)
		}
		left, err := orphanedControlPlane(o.StateDir)
		must(t, err)
		if len(left) != 2 {
			t.Fatalf("after SIGKILL of the plane: %d orphaned etcd/kube-apiserver found, want 2: %v", len(left), left)
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
	if !rep.Empty() {
		t.Errorf("Down of a plane without clusters removed %+v", rep)
	}
	if _, err := os.Stat(o.StateDir); !os.IsNotExist(err) {
		t.Errorf("state dir after Down: %v", err)
	}
	if left, err := orphanedControlPlane(o.StateDir); err != nil || len(left) > 0 {
		t.Errorf("etcd/kube-apiserver left after Down: %v %v", left, err)
	}
}
