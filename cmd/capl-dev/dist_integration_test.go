package main

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
)

// EnvDist names the `make dist` directory; `make test` sets it.
const EnvDist = "CAPL_TEST_DIST"

// TestDistRunsWithoutCheckout copies the `make dist` directory somewhere
// else and runs `capl-dev up --no-demo` and `capl-dev down` from there in a
// mount namespace where the checkout and Go's module cache are empty
// tmpfs mounts, with no Go on PATH and no KUBEBUILDER_ASSETS: the plane must
// find its binaries next to capl-dev and its manifests inside it.
func TestDistRunsWithoutCheckout(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a management plane")
	}
	uri := testlibvirt.URI(t)
	dist := os.Getenv(EnvDist)
	if dist == "" {
		t.Fatalf("%s is unset: run the test through `make test`, which runs `make dist`", EnvDist)
	}
	if _, err := exec.LookPath("unshare"); err != nil {
		t.Fatalf("unshare (util-linux) is needed to hide the checkout: %v", err)
	}
	checkout, err := filepath.Abs(filepath.Join("..", ".."))
	must(t, err)
	modCache := goEnv(t, "GOMODCACHE")
	goBin := filepath.Dir(goPath(t))

	dir := filepath.Join(t.TempDir(), "capl")
	run(t, exec.Command("cp", "-a", dist, dir))
	state := filepath.Join(t.TempDir(), "state")
	// /usr/bin and /bin only: Go lives in /usr/local/go/bin here.
	env := []string{"PATH=/usr/sbin:/usr/bin:/sbin:/bin", "HOME=" + t.TempDir()}
	if strings.HasPrefix(goBin, "/usr/bin") || strings.HasPrefix(goBin, "/bin") {
		t.Fatalf("go is in %s, which the test's PATH keeps: it cannot show that capl-dev runs without Go", goBin)
	}
	// hidden runs a command of the copied directory with the checkout and
	// the module cache hidden. The plane `up` starts stays in that mount
	// namespace after up returns.
	hidden := func(ctx context.Context, args ...string) ([]byte, error) {
		script := fmt.Sprintf(`mount -t tmpfs capl-hidden %q && mount -t tmpfs capl-hidden %q && cd %q && exec "$@"`, checkout, modCache, dir)
		cmd := exec.CommandContext(ctx, "unshare", append([]string{"--mount", "--propagation", "private", "sh", "-c", script, "sh"}, args...)...)
		cmd.Env = env
		var out bytes.Buffer
		cmd.Stdout, cmd.Stderr = &out, &out
		err := cmd.Run()
		return out.Bytes(), err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// The same namespace setup with a command that must fail: proves the
	// checkout really is hidden from what runs there.
	if out, err := hidden(ctx, "test", "-e", filepath.Join(checkout, "go.mod")); err == nil {
		t.Fatalf("the checkout's go.mod is visible inside the namespace: %s", out)
	}
	if out, err := hidden(ctx, "sh", "-c", "command -v go"); err == nil {
		t.Fatalf("go is on the namespace's PATH: %s", out)
	}

	t.Cleanup(func() {
		// Whatever happened, the plane goes (a second down is a no-op).
		out, err := exec.Command(filepath.Join(dir, "capl-dev"), "down", "--state-dir="+state, "--libvirt-uri="+uri).CombinedOutput()
		if err != nil {
			t.Errorf("cleanup down: %v\n%s", err, out)
		}
	})
	out, err := hidden(ctx, "./capl-dev", "up", "--no-demo", "--state-dir="+state, "--libvirt-uri="+uri)
	t.Logf("capl-dev up --no-demo:\n%s", out)
	if err != nil {
		t.Fatalf("capl-dev up --no-demo from %s: %v (serve.log: %s)", dir, err, readFile(filepath.Join(state, "serve.log")))
	}
	if !strings.Contains(string(out), "management plane ready") {
		t.Errorf("up did not report the plane ready")
	}
	// The plane runs what the directory holds.
	for _, b := range []string{"kube-apiserver", "etcd", "kube-controller-manager", "manager"} {
		if !processRuns(t, filepath.Join(dir, b)) {
			t.Errorf("no process runs %s", filepath.Join(dir, b))
		}
	}
	out, err = hidden(ctx, "./capl-dev", "down", "--state-dir="+state, "--libvirt-uri="+uri)
	t.Logf("capl-dev down:\n%s", out)
	if err != nil {
		t.Fatalf("capl-dev down: %v", err)
	}
	for _, b := range []string{"kube-apiserver", "etcd", "kube-controller-manager", "manager", "capl-dev"} {
		if processRuns(t, filepath.Join(dir, b)) {
			t.Errorf("%s still runs after down", filepath.Join(dir, b))
		}
	}
}

// TestProductCodeImportsNoTestHarness: the binaries users run link none of
// the packages written for tests, ours or controller-runtime's envtest
// (the plane runs etcd and kube-apiserver itself). Cluster API's own
// packages link gomega's matchers; that is theirs, not a harness.
func TestProductCodeImportsNoTestHarness(t *testing.T) {
	if testing.Short() {
		t.Skip("runs go list")
	}
	// Everything under internal/testharness, and envtest with its sub-packages.
	harnesses := []string{"/internal/testharness", "sigs.k8s.io/controller-runtime/pkg/envtest"}
	for _, cmd := range []string{"./cmd/capl-dev", "./cmd/manager"} {
		out, err := exec.Command(goPath(t), "list", "-deps", filepath.Join("..", "..", cmd)).Output()
		must(t, err)
		for _, dep := range strings.Fields(string(out)) {
			for _, h := range harnesses {
				if strings.Contains(dep, h) {
					t.Errorf("%s imports the test harness %s", cmd, dep)
				}
			}
		}
	}
}

// processRuns tells whether a process runs the executable path (a
// zombie, which PID 1 here may never reap, does not count).
func processRuns(t *testing.T, path string) bool {
	t.Helper()
	entries, err := os.ReadDir("/proc")
	must(t, err)
	for _, e := range entries {
		exe, err := os.Readlink(filepath.Join("/proc", e.Name(), "exe"))
		if err != nil || exe != path {
			continue
		}
		stat, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err == nil && !strings.Contains(string(stat), ") Z ") {
			return true
		}
	}
	return false
}

func goPath(t *testing.T) string {
	t.Helper()
	p, err := exec.LookPath("go")
	must(t, err)
	return p
}

func goEnv(t *testing.T, name string) string {
	t.Helper()
	out, err := exec.Command(goPath(t), "env", name).Output()
	must(t, err)
	return strings.TrimSpace(string(out))
}

func run(t *testing.T, cmd *exec.Cmd) {
	t.Helper()
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("%s: %v\n%s", strings.Join(cmd.Args, " "), err, out)
	}
}

func readFile(path string) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	return string(data)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
