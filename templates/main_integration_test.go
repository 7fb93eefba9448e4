// Package templates_test renders the cluster templates and the ClusterClass
// the way users do (`make clusterctl-override`, then the real clusterctl's
// `generate cluster`, offline) and hands the result to a real API server
// running Cluster API's CRDs and webhooks (core, kubeadm control plane and
// bootstrap) and the provider's, and to Cluster API's ClusterClass and
// topology controllers.
package templates_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr/funcr"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
)

// releaseVersion is the version `make clusterctl-override` installs.
const releaseVersion = "v0.1.0"

var (
	env *testenv.Environment
	c   client.Client
)

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	// Controller logs go to a file; failures point at it.
	logFile, err := os.CreateTemp("", "capl-templates-test-*.log")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer logFile.Close()
	ctrl.SetLogger(funcr.New(func(prefix, args string) {
		fmt.Fprintf(logFile, "%s %s %s\n", time.Now().Format("15:04:05.000"), prefix, args)
	}, funcr.Options{Verbosity: 2}))
	fmt.Printf("controller logs: %s\n", logFile.Name())
	if env, err = testenv.Start(plane.WithProviderWebhooks(), plane.WithClusterAPIWebhooks()); err != nil {
		fmt.Println(err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	start := time.Now()
	mgr, err := env.StartManager(plane.ProviderWebhooks(nil), plane.ClusterAPIWebhooks, plane.ClusterAPITopology)
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer func() { _ = mgr.Stop() }()
	fmt.Printf("BENCH webhooks and topology controllers ready in %v\n", time.Since(start).Round(time.Millisecond))
	if c, err = env.NewClient(); err != nil {
		fmt.Println(err)
		return 1
	}
	code := m.Run()
	if xdgConfig != "" {
		_ = os.RemoveAll(filepath.Dir(xdgConfig))
	}
	if code == 0 {
		_ = os.Remove(logFile.Name())
	}
	return code
}

func requireEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("integration test: needs envtest (not run with -short)")
	}
}

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return c
}

// root is the checkout.
func root() string {
	wd, _ := os.Getwd()
	return filepath.Dir(wd)
}

var (
	overrideOnce sync.Once
	xdgConfig    string
	overrideErr  error
)

// clusterctlConfig runs `make clusterctl-override` into a directory of its
// own, once, and returns the XDG config home to run clusterctl with: its
// cluster-api/clusterctl.yaml registers the provider, whose repository is
// the override directory.
func clusterctlConfig(t *testing.T) string {
	t.Helper()
	overrideOnce.Do(func() {
		dir, err := os.MkdirTemp("", "capl-clusterctl-")
		if err != nil {
			overrideErr = err
			return
		}
		xdgConfig = filepath.Join(dir, "xdg")
		start := time.Now()
		cmd := exec.Command("make", "-C", root(), "clusterctl-override",
			"RELEASE_DIR="+filepath.Join(dir, "out"), "RELEASE_VERSION="+releaseVersion,
			"CLUSTERCTL_CONFIG_DIR="+filepath.Join(xdgConfig, "cluster-api"))
		if out, err := cmd.CombinedOutput(); err != nil {
			overrideErr = fmt.Errorf("make clusterctl-override: %v\n%s", err, out)
			return
		}
		fmt.Printf("BENCH make clusterctl-override took %v\n", time.Since(start).Round(time.Millisecond))
	})
	if overrideErr != nil {
		t.Fatal(overrideErr)
	}
	return xdgConfig
}

// clusterctl runs bin/clusterctl with args, offline (no management
// cluster, no version check) and with exactly vars as its environment
// besides PATH and HOME, so that the caller's LIBVIRT_ variables do not
// leak in.
func clusterctl(t *testing.T, vars map[string]string, args ...string) []byte {
	t.Helper()
	bin := filepath.Join(root(), "bin", "clusterctl")
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run `make clusterctl` (make test does)", err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = []string{
		"PATH=" + os.Getenv("PATH"),
		"HOME=" + t.TempDir(),
		"XDG_CONFIG_HOME=" + clusterctlConfig(t),
		"KUBECONFIG=" + filepath.Join(t.TempDir(), "none"),
		"CLUSTERCTL_DISABLE_VERSIONCHECK=true",
	}
	for k, v := range vars {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		t.Fatalf("clusterctl %s: %v\n%s", strings.Join(args, " "), err, stderr.String())
	}
	return out
}

// generate renders flavor ("" is the default) for a cluster named name in
// namespace with vars, as `clusterctl generate cluster` does.
func generate(t *testing.T, flavor, name, namespace string, vars map[string]string) []*unstructured.Unstructured {
	t.Helper()
	args := []string{"generate", "cluster", name, "--infrastructure", "libvirt:" + releaseVersion,
		"--kubernetes-version", "v1.33.1", "--control-plane-machine-count", "3", "--worker-machine-count", "2",
		"--target-namespace", namespace}
	if flavor != "" {
		args = append(args, "--flavor", flavor)
	}
	out := clusterctl(t, vars, args...)
	if i := bytes.Index(out, []byte("${")); i >= 0 {
		t.Fatalf("unsubstituted variable in the output: %q", out[i:min(len(out), i+60)])
	}
	objs, err := plane.DecodeYAML(out)
	if err != nil {
		t.Fatal(err)
	}
	return objs
}
