//go:build release

package config_test

import (
	"archive/tar"
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	appsv1 "k8s.io/api/apps/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// The release directory's test runs only with the build tag release, from
// `make test-release`, after `make release` (which needs the manager image
// of `make image`): CI runs it once that image is built, outside make
// test.

// releaseDir is make release's output, which `make test-release` names.
func releaseDir(t *testing.T) string {
	t.Helper()
	dir := os.Getenv("CAPL_TEST_RELEASE_DIR")
	if dir == "" {
		t.Fatal("CAPL_TEST_RELEASE_DIR is unset: run `make test-release`, which runs make release first")
	}
	return dir
}

// TestReleaseDirectory checks dist/release as a user gets it: every
// asset of a GitHub release there; the manager image archive a valid OCI
// layout whose manifest has the digest of manager-image.digest, which the
// components run; then the real clusterctl, offline, through the
// directory's own clusterctl.yaml: generate provider (the image by
// digest), init --infrastructure libvirt into a real API server, after
// which clusterctl's inventory lists the four providers and the provider's
// objects are there, and generate cluster of every flavour for that
// management cluster (the topology flavour with its ClusterClass from the
// repository).
//
// What it does not prove: that the Deployments run (the API server has no
// nodes), nor cert-manager's installation: the API server gets cert-manager's
// two CRDs that clusterctl's probe creates objects of (Issuer and
// Certificate), so clusterctl takes cert-manager as installed, as it does
// in a cluster that has it.
func TestReleaseDirectory(t *testing.T) {
	if env == nil {
		t.Fatal("needs envtest: run `make test-release`")
	}
	dir := releaseDir(t)
	version := releaseVersion(t, dir)
	t.Logf("release %s in %s", version, dir)

	// The assets.
	var want []string
	for _, glob := range []string{"../templates/cluster-template*.yaml", "../templates/clusterclass-*.yaml"} {
		m, err := filepath.Glob(glob)
		if err != nil || len(m) == 0 {
			t.Fatalf("no %s: %v", glob, err)
		}
		for _, f := range m {
			want = append(want, filepath.Base(f))
		}
	}
	want = append(want, "infrastructure-components.yaml", "metadata.yaml", "manager-image.tar", "manager-image.digest", "clusterctl.yaml")
	for _, f := range want {
		if _, err := os.Stat(filepath.Join(dir, f)); err != nil {
			t.Errorf("the release lacks %s: %v", f, err)
		}
		if strings.HasSuffix(f, ".yaml") && f != "clusterctl.yaml" {
			if _, err := os.Stat(filepath.Join(dir, "repository", "infrastructure-libvirt", version, f)); err != nil {
				t.Errorf("clusterctl's repository lacks %s: %v", f, err)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}

	// The image.
	digest := strings.TrimSpace(string(readFile(t, filepath.Join(dir, "manager-image.digest"))))
	refName := checkImageArchive(t, filepath.Join(dir, "manager-image.tar"), digest)
	image := refName + "@" + digest
	objs, err := plane.DecodeYAML(readFile(t, filepath.Join(dir, "infrastructure-components.yaml")))
	if err != nil {
		t.Fatal(err)
	}
	deployments := ofKind(objs, "Deployment")
	if len(deployments) != 1 {
		t.Fatalf("%d Deployments in infrastructure-components.yaml", len(deployments))
	}
	if got := convert[appsv1.Deployment](t, deployments[0]).Spec.Template.Spec.Containers[0].Image; got != image {
		t.Errorf("infrastructure-components.yaml runs %s, the archive holds %s", got, image)
	}
	t.Logf("manager-image.tar holds %s, which infrastructure-components.yaml runs", image)

	config := filepath.Join(dir, "clusterctl.yaml")
	cc := func(kubeconfig string, args ...string) (stdout, stderr string) {
		t.Helper()
		return clusterctl(t, kubeconfig, append(args, "--config", config)...)
	}
	noCluster := filepath.Join(t.TempDir(), "none")

	// generate provider: the components as init installs them.
	out, _ := cc(noCluster, "generate", "provider", "--infrastructure", "libvirt")
	if !strings.Contains(out, "image: "+image+"\n") {
		t.Errorf("clusterctl generate provider does not run %s", image)
	}
	if strings.Contains(out, "${") {
		t.Error("clusterctl generate provider left a variable")
	}

	// init into the API server.
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	installCertManagerCRDs(ctx, t)
	initOut, initErr := cc(env.Kubeconfig, "init", "--infrastructure", "libvirt")
	t.Logf("clusterctl init --infrastructure libvirt --config %s:\n%s%s", config, initOut, initErr)

	var deployment appsv1.Deployment
	if err := env.Client.Get(ctx, client.ObjectKey{Namespace: namespace, Name: deployments[0].GetName()}, &deployment); err != nil {
		t.Fatalf("after init: %v", err)
	}
	if got := deployment.Spec.Template.Spec.Containers[0].Image; got != image {
		t.Errorf("the installed Deployment runs %s, want %s", got, image)
	}
	var providers unstructured.UnstructuredList
	providers.SetGroupVersionKind(schema.GroupVersionKind{Group: "clusterctl.cluster.x-k8s.io", Version: "v1alpha3", Kind: "ProviderList"})
	if err := env.Client.List(ctx, &providers); err != nil {
		t.Fatal(err)
	}
	installed := map[string]string{}
	for _, p := range providers.Items {
		v, _, _ := unstructured.NestedString(p.Object, "version")
		typ, _, _ := unstructured.NestedString(p.Object, "type")
		installed[typ+" "+p.GetName()] = v
	}
	t.Logf("clusterctl's inventory: %v", installed)
	if installed["InfrastructureProvider infrastructure-libvirt"] != version {
		t.Errorf("the inventory has infrastructure-libvirt at %q, want %s", installed["InfrastructureProvider infrastructure-libvirt"], version)
	}
	for _, p := range []string{"CoreProvider cluster-api", "BootstrapProvider bootstrap-kubeadm", "ControlPlaneProvider control-plane-kubeadm"} {
		if installed[p] == "" {
			t.Errorf("the inventory lacks %s", p)
		}
	}
	var crds apiextensionsv1.CustomResourceDefinitionList
	if err := env.Client.List(ctx, &crds, client.MatchingLabels{providerLabel: provider}); err != nil {
		t.Fatal(err)
	}
	if len(crds.Items) != 4 {
		t.Errorf("%d CRDs labelled %s=%s after init, want 4", len(crds.Items), providerLabel, provider)
	}
	for _, crd := range crds.Items {
		if _, ok := crd.Labels["clusterctl.cluster.x-k8s.io"]; !ok {
			t.Errorf("CRD %s lacks clusterctl's label: not installed by clusterctl", crd.Name)
		}
	}

	// generate cluster: every flavour of the release, for the management
	// cluster init made, as a user runs it next.
	vars := []string{"LIBVIRT_IMAGE_VOLUME=capl-node-v1.36.3.qcow2", "LIBVIRT_CONTROL_PLANE_ENDPOINT_HOST=192.168.1.240"}
	for _, f := range want {
		flavor, ok := strings.CutPrefix(f, "cluster-template")
		if !ok {
			continue
		}
		flavor = strings.TrimPrefix(strings.TrimSuffix(flavor, ".yaml"), "-")
		args := []string{"generate", "cluster", "demo", "--infrastructure", "libvirt", "--kubernetes-version", "v1.36.3", "--target-namespace", "default"}
		if flavor != "" {
			args = append(args, "--flavor", flavor)
		}
		out, _ := clusterctlEnv(t, env.Kubeconfig, vars, append(args, "--config", config)...)
		if i := strings.Index(out, "${"); i >= 0 {
			t.Errorf("flavour %q: a variable left: %q", flavor, out[i:min(len(out), i+60)])
		}
		rendered, err := plane.DecodeYAML([]byte(out))
		if err != nil {
			t.Errorf("flavour %q: %v", flavor, err)
			continue
		}
		var kinds []string
		for _, o := range rendered {
			kinds = append(kinds, o.GetKind())
		}
		if !slices.Contains(kinds, "Cluster") {
			t.Errorf("flavour %q renders no Cluster: %v", flavor, kinds)
		}
		if flavor == "topology" && !slices.Contains(kinds, "ClusterClass") {
			t.Errorf("flavour topology: clusterctl added no ClusterClass from the repository: %v", kinds)
		}
		t.Logf("flavour %q: %d objects (%s)", flavor, len(rendered), strings.Join(kinds, ", "))
	}
}

// releaseVersion is the one version of the provider in the release's
// repository.
func releaseVersion(t *testing.T, dir string) string {
	t.Helper()
	entries, err := os.ReadDir(filepath.Join(dir, "repository", "infrastructure-libvirt"))
	if err != nil || len(entries) != 1 {
		t.Fatalf("want one version in %s/repository/infrastructure-libvirt: %v %v", dir, entries, err)
	}
	return entries[0].Name()
}

// checkImageArchive checks that path is an OCI image layout tarball with
// one image whose manifest has digest, every blob the manifest names there
// with its digest, and returns the image's name.
func checkImageArchive(t *testing.T, path, digest string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string][]byte{}
	tr := tar.NewReader(f)
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatalf("%s: %v", path, err)
		}
		files[strings.TrimPrefix(hdr.Name, "./")] = data
	}
	blob := func(d string) []byte {
		t.Helper()
		hexd, ok := strings.CutPrefix(d, "sha256:")
		data, found := files["blobs/sha256/"+hexd]
		if !ok || !found {
			t.Fatalf("%s: no blob %s", path, d)
		}
		if sum := sha256.Sum256(data); hex.EncodeToString(sum[:]) != hexd {
			t.Fatalf("%s: blob %s has digest sha256:%x", path, d, sum)
		}
		return data
	}
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal(files["index.json"], &index); err != nil {
		t.Fatalf("%s: index.json: %v", path, err)
	}
	if len(index.Manifests) != 1 || index.Manifests[0].Digest != digest {
		t.Fatalf("%s: index.json names %+v, want one image %s", path, index.Manifests, digest)
	}
	var manifest struct {
		Config struct{ Digest string }   `json:"config"`
		Layers []struct{ Digest string } `json:"layers"`
	}
	if err := json.Unmarshal(blob(digest), &manifest); err != nil {
		t.Fatal(err)
	}
	blob(manifest.Config.Digest)
	for _, l := range manifest.Layers {
		blob(l.Digest)
	}
	name := index.Manifests[0].Annotations["io.containerd.image.name"]
	if name == "" {
		name = index.Manifests[0].Annotations["org.opencontainers.image.ref.name"]
	}
	if name == "" {
		t.Fatalf("%s: the image has no name: %v", path, index.Manifests[0].Annotations)
	}
	return name
}

// installCertManagerCRDs gives the API server cert-manager's Issuer and
// Certificate kinds, of which clusterctl's probe for an installed
// cert-manager creates objects (its cert-manager-test-resources.yaml).
func installCertManagerCRDs(ctx context.Context, t *testing.T) {
	t.Helper()
	for _, kind := range []string{"Issuer", "Certificate"} {
		plural := strings.ToLower(kind) + "s"
		crd := &apiextensionsv1.CustomResourceDefinition{
			ObjectMeta: metav1.ObjectMeta{Name: plural + ".cert-manager.io"},
			Spec: apiextensionsv1.CustomResourceDefinitionSpec{
				Group: "cert-manager.io",
				Names: apiextensionsv1.CustomResourceDefinitionNames{Kind: kind, ListKind: kind + "List", Plural: plural, Singular: strings.ToLower(kind)},
				Scope: apiextensionsv1.NamespaceScoped,
				Versions: []apiextensionsv1.CustomResourceDefinitionVersion{{
					Name: "v1", Served: true, Storage: true,
					Schema: &apiextensionsv1.CustomResourceValidation{OpenAPIV3Schema: &apiextensionsv1.JSONSchemaProps{
						Type: "object", XPreserveUnknownFields: ptr.To(true),
					}},
				}},
			},
		}
		if err := env.Client.Create(ctx, crd); err != nil {
			t.Fatal(err)
		}
	}
	// Served once established.
	deadline := time.Now().Add(time.Minute)
	for {
		var l unstructured.UnstructuredList
		l.SetGroupVersionKind(schema.GroupVersionKind{Group: "cert-manager.io", Version: "v1", Kind: "CertificateList"})
		if env.Client.List(ctx, &l) == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("cert-manager's CRDs are not served after a minute")
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// clusterctl runs the checkout's bin/clusterctl (make clusterctl) with
// args against kubeconfig, without the version check against GitHub.
func clusterctl(t *testing.T, kubeconfig string, args ...string) (stdout, stderr string) {
	t.Helper()
	return clusterctlEnv(t, kubeconfig, nil, args...)
}

// clusterctlEnv is clusterctl with vars (NAME=value) as the only
// variables besides PATH, HOME and XDG_CONFIG_HOME, both empty
// directories: nothing of the caller's clusterctl configuration applies.
func clusterctlEnv(t *testing.T, kubeconfig string, vars []string, args ...string) (stdout, stderr string) {
	t.Helper()
	bin, err := filepath.Abs(filepath.Join("..", "bin", "clusterctl"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(bin); err != nil {
		t.Fatalf("%v: run `make clusterctl` (make test-release does)", err)
	}
	cmd := exec.Command(bin, args...)
	home := t.TempDir()
	cmd.Env = append([]string{"PATH=" + os.Getenv("PATH"), "HOME=" + home, "XDG_CONFIG_HOME=" + filepath.Join(home, ".config"),
		"KUBECONFIG=" + kubeconfig, "CLUSTERCTL_DISABLE_VERSIONCHECK=true"}, vars...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	if err := cmd.Run(); err != nil {
		t.Fatalf("clusterctl %s: %v\n%s%s", strings.Join(args, " "), err, out.String(), errOut.String())
	}
	return out.String(), errOut.String()
}

func readFile(t *testing.T, path string) []byte {
	t.Helper()
	data, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return data
}
