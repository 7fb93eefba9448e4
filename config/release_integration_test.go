// Package config_test checks what `make release-manifests` builds from this
// directory, infrastructure-components.yaml, against clusterctl's provider
// contract, and the RBAC it grants against a real API server's authorizer.
package config_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"maps"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	authorizationv1 "k8s.io/api/authorization/v1"
	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"

	"sigs.k8s.io/cluster-api/util/contract"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
)

const (
	namespace      = "capl-system"
	providerLabel  = "cluster.x-k8s.io/provider"
	provider       = "infrastructure-libvirt"
	serviceAccount = "system:serviceaccount:capl-system:capl-manager"
)

var env *testenv.Environment

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	var err error
	if env, err = testenv.Start(); err != nil {
		fmt.Println(err)
		os.Exit(1)
	}
	code := m.Run()
	_ = env.Stop()
	os.Exit(code)
}

var (
	releaseOnce sync.Once
	released    []*unstructured.Unstructured
	releaseErr  error
)

// components runs `make release-manifests` into a directory of its own,
// once, and returns the objects of its infrastructure-components.yaml.
func components(t *testing.T) []*unstructured.Unstructured {
	t.Helper()
	if testing.Short() {
		t.Skip("runs make and kustomize (not run with -short)")
	}
	releaseOnce.Do(func() {
		dir, err := os.MkdirTemp("", "capl-release-")
		if err != nil {
			releaseErr = err
			return
		}
		defer os.RemoveAll(dir)
		wd, _ := os.Getwd()
		start := time.Now()
		out, err := exec.Command("make", "-C", filepath.Dir(wd), "release-manifests", "RELEASE_DIR="+dir).CombinedOutput()
		if err != nil {
			releaseErr = fmt.Errorf("make release-manifests: %v\n%s", err, out)
			return
		}
		fmt.Printf("BENCH make release-manifests took %v\n", time.Since(start).Round(time.Millisecond))
		for _, f := range []string{"metadata.yaml", "cluster-template.yaml", "cluster-template-topology.yaml", "cluster-template-kube-vip.yaml", "clusterclass-libvirt.yaml"} {
			if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
				releaseErr = fmt.Errorf("release-manifests did not write %s: %w", f, err)
				return
			}
		}
		data, err := os.ReadFile(filepath.Join(dir, "infrastructure-components.yaml"))
		if err != nil {
			releaseErr = err
			return
		}
		released, releaseErr = plane.DecodeYAML(data)
		if releaseErr == nil {
			releaseErr = checkVariables(data)
		}
	})
	if releaseErr != nil {
		t.Fatal(releaseErr)
	}
	return released
}

// checkVariables requires a default for every clusterctl variable, so that
// `clusterctl init` needs none set, and LIBVIRT_URI among them. An empty
// default (${X:=}) is none: clusterctl reports such a variable missing.
func checkVariables(data []byte) error {
	vars := regexp.MustCompile(`\$\{([A-Za-z0-9_]+)(:=[^}]*)?\}`).FindAllSubmatch(data, -1)
	uri := false
	for _, v := range vars {
		if len(v[2]) <= len(":=") {
			return fmt.Errorf("variable %s has no default (clusterctl takes an empty one for none)", v[1])
		}
		uri = uri || string(v[0]) == "${LIBVIRT_URI:=qemu:///system}"
	}
	if !uri {
		return errors.New("no ${LIBVIRT_URI:=qemu:///system}")
	}
	return nil
}

func ofKind(objs []*unstructured.Unstructured, kind string) []*unstructured.Unstructured {
	var out []*unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func convert[T any](t *testing.T, u *unstructured.Unstructured) *T {
	t.Helper()
	obj := new(T)
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, obj); err != nil {
		t.Fatal(err)
	}
	return obj
}

// TestComponentsFollowClusterctlContract checks the clusterctl provider
// contract: one Namespace holding every namespaced object, the provider
// label on everything, CRDs named and labelled for Cluster API's contract
// v1beta2, and cert-manager wiring that matches the webhook Service.
func TestComponentsFollowClusterctlContract(t *testing.T) {
	objs := components(t)
	if ns := ofKind(objs, "Namespace"); len(ns) != 1 || ns[0].GetName() != namespace {
		t.Errorf("want exactly one Namespace %s, got %d", namespace, len(ns))
	}
	clusterScoped := []string{"Namespace", "CustomResourceDefinition", "ClusterRole", "ClusterRoleBinding", "MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"}
	for _, o := range objs {
		if o.GetLabels()[providerLabel] != provider {
			t.Errorf("%s %s lacks %s=%s", o.GetKind(), o.GetName(), providerLabel, provider)
		}
		if !slices.Contains(clusterScoped, o.GetKind()) && o.GetNamespace() != namespace {
			t.Errorf("%s %s is in namespace %q", o.GetKind(), o.GetName(), o.GetNamespace())
		}
		if !strings.HasPrefix(o.GetName(), "capl-") && o.GetKind() != "CustomResourceDefinition" {
			t.Errorf("%s %s lacks the capl- prefix", o.GetKind(), o.GetName())
		}
	}

	crds := ofKind(objs, "CustomResourceDefinition")
	var names []string
	for _, u := range crds {
		names = append(names, u.GetName())
		if v := u.GetLabels()["cluster.x-k8s.io/v1beta2"]; v != "v1alpha1" {
			t.Errorf("CRD %s: contract label cluster.x-k8s.io/v1beta2=%q, want v1alpha1", u.GetName(), v)
		}
		if a := u.GetAnnotations()["cert-manager.io/inject-ca-from"]; a != "capl-system/capl-serving-cert" {
			t.Errorf("CRD %s: inject-ca-from %q", u.GetName(), a)
		}
	}
	var want []string
	for _, kind := range []string{"LibvirtCluster", "LibvirtClusterTemplate", "LibvirtMachine", "LibvirtMachineTemplate"} {
		want = append(want, contract.CalculateCRDName(infrav1.GroupVersion.Group, kind))
	}
	slices.Sort(names)
	if !slices.Equal(names, want) {
		t.Errorf("CRDs %v, want %v", names, want)
	}

	// The webhook Service, the certificate's DNS names, the Secret the
	// Deployment mounts and the CA injection all name each other.
	cert := ofKind(objs, "Certificate")
	if len(cert) != 1 {
		t.Fatalf("%d Certificates", len(cert))
	}
	dns, _, _ := unstructured.NestedStringSlice(cert[0].Object, "spec", "dnsNames")
	if !slices.Equal(dns, []string{"capl-webhook-service.capl-system.svc", "capl-webhook-service.capl-system.svc.cluster.local"}) {
		t.Errorf("certificate DNS names %v", dns)
	}
	secret, _, _ := unstructured.NestedString(cert[0].Object, "spec", "secretName")
	deployments := ofKind(objs, "Deployment")
	if len(deployments) != 1 {
		t.Fatalf("%d Deployments", len(deployments))
	}
	if !strings.Contains(fmt.Sprint(deployments[0].Object), "secretName:"+secret) {
		t.Errorf("the Deployment does not mount the certificate's Secret %s", secret)
	}
	// The metrics Service reaches the Deployment's diagnostics port.
	var metricsService *corev1.Service
	for _, u := range ofKind(objs, "Service") {
		if u.GetName() == "capl-controller-manager-metrics-service" {
			metricsService = convert[corev1.Service](t, u)
		}
	}
	deployment := convert[appsv1.Deployment](t, deployments[0])
	switch {
	case metricsService == nil:
		t.Error("no metrics Service capl-controller-manager-metrics-service")
	case len(metricsService.Spec.Ports) != 1 || metricsService.Spec.Ports[0].Name != "https-metrics" || metricsService.Spec.Ports[0].Port != 8443 ||
		metricsService.Spec.Ports[0].TargetPort.String() != "metrics":
		t.Errorf("metrics Service ports %+v, want https-metrics 8443 → metrics", metricsService.Spec.Ports)
	case !maps.Equal(metricsService.Spec.Selector, deployment.Spec.Selector.MatchLabels):
		t.Errorf("metrics Service selects %v, the Deployment's pods are %v", metricsService.Spec.Selector, deployment.Spec.Selector.MatchLabels)
	}
	metricsPort := false
	for _, p := range deployment.Spec.Template.Spec.Containers[0].Ports {
		metricsPort = metricsPort || p.Name == "metrics" && p.ContainerPort == 8443
	}
	if !metricsPort {
		t.Error("the manager container has no port metrics 8443 (--diagnostics-address)")
	}
	for _, kind := range []string{"MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"} {
		configs := ofKind(objs, kind)
		if len(configs) != 1 {
			t.Fatalf("%d %ss", len(configs), kind)
		}
		if a := configs[0].GetAnnotations()["cert-manager.io/inject-ca-from"]; a != "capl-system/capl-serving-cert" {
			t.Errorf("%s inject-ca-from %q", kind, a)
		}
		hooks, _, _ := unstructured.NestedSlice(configs[0].Object, "webhooks")
		if len(hooks) != 4 {
			t.Errorf("%s has %d webhooks, want one per kind", kind, len(hooks))
		}
		for _, h := range hooks {
			svc, _, _ := unstructured.NestedMap(h.(map[string]any), "clientConfig", "service")
			if svc["name"] != "capl-webhook-service" || svc["namespace"] != namespace {
				t.Errorf("%s webhook calls service %v", kind, svc)
			}
		}
	}
}

// TestRBAC checks the manager's permissions twice: by reading the rules
// (no wildcards, nothing written outside the provider's own kinds and
// events, nothing cluster-wide beyond what the controllers read) and by
// asking the API server's authorizer, with the manifests' RBAC installed,
// what the manager's ServiceAccount may do.
func TestRBAC(t *testing.T) {
	if env == nil {
		t.Skip("integration test: needs envtest (not run with -short)")
	}
	objs := components(t)
	read := []string{"get", "list", "watch"}
	write := []string{"patch", "update"}
	// allowed is every verb each cluster-wide resource may have.
	allowed := map[string][]string{
		"/events":                          {"create", "patch"},
		"/secrets":                         {"get"}, // bootstrap data, read uncached (the manager's client does not cache Secrets)
		"cluster.x-k8s.io/clusters":        read,
		"cluster.x-k8s.io/clusters/status": read,
		"cluster.x-k8s.io/machines":        read,
		"cluster.x-k8s.io/machines/status": read,
	}
	for _, r := range []string{"libvirtclusters", "libvirtmachines"} {
		for _, sub := range []string{"", "/status", "/finalizers"} {
			allowed["infrastructure.cluster.x-k8s.io/"+r+sub] = append(slices.Clone(read), write...)
		}
	}
	for _, r := range []string{"libvirtclustertemplates", "libvirtmachinetemplates"} {
		allowed["infrastructure.cluster.x-k8s.io/"+r] = read
	}
	// The machine templates' capacity, for the autoscaler.
	allowed["infrastructure.cluster.x-k8s.io/libvirtmachinetemplates/status"] = []string{"patch"}
	// Machines' addresses from IPAM pools: the claims they own, the
	// addresses the pools make.
	allowed["ipam.cluster.x-k8s.io/ipaddressclaims"] = append(slices.Clone(read), "create", "delete")
	allowed["ipam.cluster.x-k8s.io/ipaddresses"] = read
	// The diagnostics endpoint checks the tokens of /metrics requests and
	// whether their holders may read it.
	allowed["authentication.k8s.io/tokenreviews"] = []string{"create"}
	allowed["authorization.k8s.io/subjectaccessreviews"] = []string{"create"}

	roles := map[string]*rbacv1.ClusterRole{}
	for _, u := range ofKind(objs, "ClusterRole") {
		roles[u.GetName()] = convert[rbacv1.ClusterRole](t, u)
	}
	if len(roles) != 2 || roles["capl-manager-role"] == nil || roles["capl-metrics-reader"] == nil {
		t.Fatalf("ClusterRoles %v, want the manager's and the metrics reader", slices.Collect(maps.Keys(roles)))
	}
	// The metrics reader may read /metrics, nothing else.
	if rules := roles["capl-metrics-reader"].Rules; len(rules) != 1 || !slices.Equal(rules[0].NonResourceURLs, []string{"/metrics"}) ||
		!slices.Equal(rules[0].Verbs, []string{"get"}) || len(rules[0].Resources) != 0 {
		t.Errorf("metrics reader rules %+v, want get on /metrics only", rules)
	}
	for _, rule := range roles["capl-manager-role"].Rules {
		if len(rule.NonResourceURLs) > 0 || len(rule.ResourceNames) > 0 {
			t.Errorf("unexpected rule %+v", rule)
		}
		for _, g := range rule.APIGroups {
			for _, r := range rule.Resources {
				for _, v := range rule.Verbs {
					if !slices.Contains(allowed[g+"/"+r], v) {
						t.Errorf("ClusterRole grants %s on %s/%s, which the controllers do not need", v, g, r)
					}
				}
			}
		}
	}
	for _, u := range ofKind(objs, "Role") {
		for _, rule := range convert[rbacv1.Role](t, u).Rules {
			for _, g := range rule.APIGroups {
				for _, r := range rule.Resources {
					if g+"/"+r != "coordination.k8s.io/leases" && g+"/"+r != "/events" {
						t.Errorf("Role %s grants %v on %s/%s; leader election needs leases and events", u.GetName(), rule.Verbs, g, r)
					}
				}
			}
		}
	}

	// Install the RBAC and ask the authorizer.
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, kind := range []string{"Namespace", "ServiceAccount", "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"} {
		for _, o := range ofKind(objs, kind) {
			if err := env.Client.Create(ctx, o.DeepCopy()); err != nil {
				t.Fatalf("%s %s: %v", kind, o.GetName(), err)
			}
		}
	}
	type access struct{ verb, group, resource, subresource, namespace string }
	var need []access
	for gr, verbs := range allowed {
		g, r, _ := strings.Cut(gr, "/")
		r, sub, _ := strings.Cut(r, "/")
		for _, v := range verbs {
			need = append(need, access{v, g, r, sub, "default"})
		}
	}
	for i, a := range need {
		if a.group == "authentication.k8s.io" || a.group == "authorization.k8s.io" {
			need[i].namespace = "" // cluster-scoped
		}
	}
	need = append(need,
		access{"create", "coordination.k8s.io", "leases", "", namespace},
		access{"update", "coordination.k8s.io", "leases", "", namespace})
	forbidden := []access{
		{"list", "", "secrets", "", "default"},
		{"watch", "", "secrets", "", "default"},
		{"create", "", "secrets", "", "default"},
		{"delete", "", "secrets", "", "default"},
		{"list", "", "nodes", "", ""},
		{"get", "", "configmaps", "", "default"},
		{"create", "", "pods", "", "default"},
		{"update", "cluster.x-k8s.io", "clusters", "", "default"},
		{"delete", "cluster.x-k8s.io", "machines", "", "default"},
		{"create", "infrastructure.cluster.x-k8s.io", "libvirtmachines", "", "default"},
		{"delete", "infrastructure.cluster.x-k8s.io", "libvirtclusters", "", "default"},
		{"update", "infrastructure.cluster.x-k8s.io", "libvirtmachinetemplates", "", "default"},
		{"create", "coordination.k8s.io", "leases", "", "default"},
		{"create", "rbac.authorization.k8s.io", "clusterrolebindings", "", ""},
		{"patch", "admissionregistration.k8s.io", "validatingwebhookconfigurations", "", ""},
		{"update", "apiextensions.k8s.io", "customresourcedefinitions", "", ""},
		{"create", "ipam.cluster.x-k8s.io", "ipaddresses", "", "default"},
		{"update", "ipam.cluster.x-k8s.io", "ipaddressclaims", "", "default"},
	}
	check := func(a access, want bool) {
		sar := &authorizationv1.SubjectAccessReview{Spec: authorizationv1.SubjectAccessReviewSpec{
			User:   serviceAccount,
			Groups: []string{"system:serviceaccounts", "system:serviceaccounts:" + namespace, "system:authenticated"},
			ResourceAttributes: &authorizationv1.ResourceAttributes{
				Verb: a.verb, Group: a.group, Resource: a.resource, Subresource: a.subresource, Namespace: a.namespace,
			},
		}}
		if err := env.Client.Create(ctx, sar); err != nil {
			t.Fatal(err)
		}
		if sar.Status.Allowed != want {
			t.Errorf("%s may %s %s/%s/%s in %q: %v, want %v (%s)", serviceAccount, a.verb, a.group, a.resource, a.subresource, a.namespace,
				sar.Status.Allowed, want, sar.Status.Reason)
		}
	}
	for _, a := range need {
		check(a, true)
	}
	for _, a := range forbidden {
		check(a, false)
	}
	t.Logf("%d permissions granted and %d refused as expected", len(need), len(forbidden))
}
