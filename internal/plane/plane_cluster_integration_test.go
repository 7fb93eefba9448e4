package plane

import (
	"bytes"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

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
