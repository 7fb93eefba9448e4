package manager_test

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/cluster-api/util/flags"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/yaml"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// rbacDir is the release RBAC, before kustomize prefixes its names and
// moves it to the provider's namespace: the ServiceAccount "manager" of
// namespace "system" and what it is bound to.
const rbacDir = "../../config/rbac"

// TestMetricsServedToServiceAccounts runs the manager as it runs in its
// pod: built by pkg/manager, authenticated as the ServiceAccount the
// release RBAC of config/rbac binds, with leader election and the secure
// diagnostics endpoint (the defaults of --diagnostics-address and
// --insecure-diagnostics). /metrics answers a ServiceAccount that the
// metrics reader ClusterRole is bound to with the provider's metrics,
// refuses a request without a token (401) and a ServiceAccount without the
// role (403). The endpoint checks tokens with TokenReviews and access with
// SubjectAccessReviews as the manager's ServiceAccount, which the release
// RBAC must grant.
func TestMetricsServedToServiceAccounts(t *testing.T) {
	if testing.Short() && !testprereq.InCI() {
		t.Skip("integration test: not run with -short outside CI")
	}
	uri := testlibvirt.URI(t)
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	cs, err := kubernetes.NewForConfig(env.Config)
	if err != nil {
		t.Fatal(err)
	}

	for _, ns := range []string{"system", "monitoring"} {
		if err := env.Client.Create(ctx, &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{Name: ns}}); err != nil {
			t.Fatal(err)
		}
	}
	applyReleaseRBAC(ctx, t, env.Client)
	for _, sa := range []string{"prometheus", "nosy"} {
		if err := env.Client.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Namespace: "monitoring", Name: sa}}); err != nil {
			t.Fatal(err)
		}
	}
	if err := env.Client.Create(ctx, &rbacv1.ClusterRoleBinding{
		ObjectMeta: metav1.ObjectMeta{Name: "prometheus-reads-capl-metrics"},
		RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: "metrics-reader"},
		Subjects:   []rbacv1.Subject{{Kind: rbacv1.ServiceAccountKind, Namespace: "monitoring", Name: "prometheus"}},
	}); err != nil {
		t.Fatal(err)
	}
	// A machine for capl_machines to count (no Machine owns it: the
	// controller leaves it pending).
	lm := &infrav1.LibvirtMachine{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "metrics"},
		Spec:       infrav1.LibvirtMachineSpec{Image: infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "capl-test.qcow2"}}},
	}
	if err := env.Client.Create(ctx, lm); err != nil {
		t.Fatal(err)
	}

	// The manager with the pod's identity: its ServiceAccount's token.
	asManager := rest.AnonymousClientConfig(env.Config)
	asManager.BearerToken = serviceAccountToken(ctx, t, cs, "system", "manager")
	opts, err := testenv.ProviderOptions(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts.LibvirtURI = uri
	opts.Diagnostics = flags.ManagerOptions{DiagnosticsAddress: freeAddress(t), TLSMinVersion: "VersionTLS12"}
	opts.LeaderElect, opts.LeaderElectionNamespace, opts.LeaderElectionID = true, "system", "controller-leader-election-capl"
	opts.LeaseDuration, opts.RenewDeadline, opts.RetryPeriod = 15*time.Second, 10*time.Second, 2*time.Second
	// New's wiring on a connection of the test's: New would refuse the
	// controllers' names, which another test of this process registered.
	host := testlibvirt.Client(t, uri)
	mgr, err := manager.NewWithWiring(asManager, opts, manager.Wiring{Host: host, HostName: hosts.HostName(uri), SkipControllerNameValidation: true})
	if err != nil {
		t.Fatal(err)
	}
	mgrCtx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() { done <- mgr.Start(mgrCtx) }()
	defer func() {
		stop()
		if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
			t.Errorf("manager stopped with %v", err)
		}
	}()
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatal("the manager's cache did not sync with the release RBAC")
	}

	url := "https://" + opts.Diagnostics.DiagnosticsAddress + "/metrics"
	scraper := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{
		// The endpoint's certificate is self-signed, as in the pod.
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // a test on loopback
	}}
	scrape := func(token string) (int, string) {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			t.Fatal(err)
		}
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := scraper.Do(req)
		if err != nil {
			return 0, err.Error()
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(body)
	}

	prometheus := serviceAccountToken(ctx, t, cs, "monitoring", "prometheus")
	want := []string{
		`capl_machines{namespace="default",state="pending"} 1`,
		`capl_libvirt_host_connected{credentials="",host=`,
		`capl_image_import_bytes_total `,
		`controller_runtime_reconcile_total{`,
	}
	var code int
	var body string
	// The endpoint starts with the manager; the counted machine arrives
	// with its cache.
	for deadline := time.Now().Add(time.Minute); ; {
		code, body = scrape(prometheus)
		if code == http.StatusOK && containsAll(body, want) {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("/metrics with the metrics reader's token: %d, want 200 with %q; body:\n%s", code, want, body)
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Logf("/metrics as monitoring/prometheus: %d, %d bytes; capl lines:\n%s", code, len(body), caplLines(body))

	if code, body := scrape(""); code != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: %d, want 401; body: %s", code, body)
	}
	if code, body := scrape(serviceAccountToken(ctx, t, cs, "monitoring", "nosy")); code != http.StatusForbidden {
		t.Errorf("/metrics with a token lacking the metrics reader role: %d, want 403; body: %s", code, body)
	}
}

// applyReleaseRBAC creates every object of config/rbac's kustomization as
// the files have it.
func applyReleaseRBAC(ctx context.Context, t *testing.T, c client.Client) {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(rbacDir, "kustomization.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var kustomization struct {
		Resources []string `json:"resources"`
	}
	if err := yaml.Unmarshal(data, &kustomization); err != nil {
		t.Fatal(err)
	}
	if len(kustomization.Resources) == 0 {
		t.Fatal("config/rbac lists no resources")
	}
	for _, f := range kustomization.Resources {
		data, err := os.ReadFile(filepath.Join(rbacDir, f))
		if err != nil {
			t.Fatal(err)
		}
		objs, err := plane.DecodeYAML(data)
		if err != nil {
			t.Fatalf("%s: %v", f, err)
		}
		for _, o := range objs {
			if err := c.Create(ctx, o); err != nil {
				t.Fatalf("%s: %s %s: %v", f, o.GetKind(), o.GetName(), err)
			}
		}
	}
}

// serviceAccountToken is a token of the ServiceAccount namespace/name, as
// the kubelet mounts one into a pod.
func serviceAccountToken(ctx context.Context, t *testing.T, cs kubernetes.Interface, namespace, name string) string {
	t.Helper()
	tr, err := cs.CoreV1().ServiceAccounts(namespace).CreateToken(ctx, name, &authenticationv1.TokenRequest{
		Spec: authenticationv1.TokenRequestSpec{ExpirationSeconds: ptr.To[int64](3600)},
	}, metav1.CreateOptions{})
	if err != nil {
		t.Fatalf("token of %s/%s: %v", namespace, name, err)
	}
	return tr.Status.Token
}

func containsAll(s string, subs []string) bool {
	for _, sub := range subs {
		if !strings.Contains(s, sub) {
			return false
		}
	}
	return true
}

// caplLines are the provider's own samples of a scrape.
func caplLines(body string) string {
	var out []string
	for _, l := range strings.Split(body, "\n") {
		if strings.HasPrefix(l, "capl_") {
			out = append(out, l)
		}
	}
	return strings.Join(out, "\n")
}
