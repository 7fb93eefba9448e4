package main

import (
	"archive/tar"
	"compress/gzip"
	"context"
	"encoding/json"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// managerBinary is the manager of `make dist` when the test runs through
// make, else one built here next to capl-dev.
func managerBinary(t *testing.T) string {
	t.Helper()
	if dist := os.Getenv(EnvDist); dist != "" {
		return filepath.Join(dist, "manager")
	}
	path := filepath.Join(capldev(t), "manager")
	if _, err := os.Stat(path); err == nil {
		return path
	}
	cmd := exec.Command(goPath(t), "build", "-o", path, "./cmd/manager")
	cmd.Dir = filepath.Join("..", "..")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the manager: %v\n%s", err, out)
	}
	return path
}

// TestCLIPlaneWithoutVMs drives a plane without VMs through capl-dev as a
// person would: up --no-demo, get clusters and status with no cluster,
// get kubeconfig of a cluster's kubeconfig Secret printed and merged into
// a temporary HOME (and, as under sudo, chowned to SUDO_UID), a cluster
// from the template applied server-side as create cluster applies it and
// again with other sizes (the replicas follow, a scale in between is
// undone), get clusters, get nodes and status of it (also as JSON and
// YAML), orphans, doctor, logs, the
// warning about a plane older than its binary and start --restart, stop
// and start (etcd's objects kept), delete cluster, down. The plane's
// libvirt is libvirt's in-process test driver (test:///default): nothing
// on the host's libvirtd is touched, and no VM is made.
func TestCLIPlaneWithoutVMs(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a management plane")
	}
	needRoot(t, "a merge under sudo chowns the file it creates to SUDO_UID, and doctor's root check must pass")
	assets := os.Getenv(plane.AssetsEnv)
	if assets == "" {
		t.Fatalf("%s is unset: run through `make test`, which builds kube-apiserver and etcd (hack/envtest.sh)", plane.AssetsEnv)
	}
	bin := capldev(t)
	manager := managerBinary(t)
	state := filepath.Join(t.TempDir(), "plane")
	uri := "test:///default"
	global := []string{"--state-dir=" + state, "--libvirt-uri=" + uri}
	cli := func(env []string, args ...string) result {
		t.Helper()
		return runCLI(t, env, append(global, args...)...)
	}
	t.Cleanup(func() {
		if t.Failed() {
			for _, f := range []string{"serve.log", "manager.log"} {
				data, _ := os.ReadFile(filepath.Join(state, f))
				t.Logf("%s:\n%s", f, tailLines(string(data), 40))
			}
		}
		// Whatever happened, the plane goes (a second down is a no-op).
		if r := cli(nil, "down"); r.code != 0 {
			t.Errorf("cleanup down: %s%s", r.stdout, r.stderr)
		}
	})

	r := cli(nil, "up", "--no-demo", "--manager="+manager, "--assets="+assets)
	r.expect(t, "up --no-demo", 0, []string{"host checked", "management plane ready"}, nil)
	t.Logf("up --no-demo took %s", r.took.Round(time.Second))
	if t.Failed() {
		t.FailNow()
	}
	cli(nil, "get", "clusters").expect(t, "get clusters, none", 0, []string{"No clusters found."}, nil)
	cli(nil, "status").expect(t, "status, none", 0, []string{"Plane " + state + ": running", "libvirt " + uri, "No clusters found."}, nil)

	p, err := plane.Attach(state)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()

	// A kubeconfig Secret as the control-plane provider writes it.
	kubeconfig := testKubeconfig(t, "w1", "https://192.0.2.10:6443")
	must(t, p.Client.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "w1-kubeconfig", Labels: map[string]string{clusterv1.ClusterNameLabel: "w1"}},
		Type:       clusterv1.ClusterSecretType,
		Data:       map[string][]byte{"value": kubeconfig},
	}))
	r = cli(nil, "get", "kubeconfig", "w1")
	r.expect(t, "get kubeconfig", 0, nil, nil)
	if r.stdout != string(kubeconfig) {
		t.Errorf("get kubeconfig printed\n%s\nwant\n%s", r.stdout, kubeconfig)
	}
	home := t.TempDir()
	// KUBECONFIG emptied: a merge would go to its first file.
	cli([]string{"HOME=" + home, "KUBECONFIG=", "SUDO_USER=", "SUDO_UID=", "SUDO_GID="}, "get", "kubeconfig", "w1", "--merge").
		expect(t, "get kubeconfig --merge", 0, []string{"context capl-w1"}, nil)
	merged := filepath.Join(home, ".kube", "config")
	checkMerged(t, merged, "capl-w1", "https://192.0.2.10:6443", os.Getuid())
	// As under sudo: SUDO_USER's file, chowned to them.
	other := filepath.Join(t.TempDir(), "config")
	cli([]string{"SUDO_USER=nobody", "SUDO_UID=65534", "SUDO_GID=65534"}, "get", "kubeconfig", "w1", "--merge", "--kubeconfig="+other).
		expect(t, "get kubeconfig --merge under sudo", 0, []string{"context capl-w1"}, nil)
	checkMerged(t, other, "capl-w1", "https://192.0.2.10:6443", 65534)
	cli(nil, "get", "kubeconfig", "nope").expect(t, "get kubeconfig of no cluster", 1, nil, []string{"no cluster default/nope"})

	// A cluster from the template as create cluster applies it,
	// server-side (create cluster itself seeds the images into libvirt,
	// which the test driver cannot take; TestCLI runs it on real VMs).
	// The manager's libvirt is the test driver, where the images do not
	// exist: no VM is ever made, the objects are real.
	images := t.TempDir()
	for _, f := range []string{"capl-node-v1.36.3.qcow2", "capl-debian-12-haproxy.qcow2"} {
		must(t, os.WriteFile(filepath.Join(images, f), []byte(f), 0o600))
	}
	templates, err := filepath.Abs(filepath.Join("..", "..", "templates"))
	must(t, err)
	apply := func(workers int32, staged bool) {
		t.Helper()
		co := devplane.ClusterOptions{Namespace: "default", Name: "conv", ControlPlane: 1, Workers: workers, KubernetesVersion: "v1.36.3",
			Template: filepath.Join(templates, "cluster-template.yaml"), CNI: filepath.Join(templates, "cni-flannel.yaml"),
			ImageDir: images, DomainType: "qemu"}.TCGTuning()
		co.StagedWorkers = staged
		imgs, err := devplane.ImageVolumes(co)
		must(t, err)
		objs, err := devplane.RenderCluster(co, devplane.ClusterVariables(co, imgs))
		must(t, err)
		cni, err := devplane.CNIObjects(co)
		must(t, err)
		must(t, devplane.ApplyClusterServerSide(ctx, p.Client, cni, objs))
	}
	replicas := func() (cp, workers int32) {
		t.Helper()
		kcp := &controlplanev1.KubeadmControlPlane{}
		must(t, p.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "conv-control-plane"}, kcp))
		md := &clusterv1.MachineDeployment{}
		must(t, p.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "conv-md-0"}, md))
		return ptr.Deref(kcp.Spec.Replicas, -1), ptr.Deref(md.Spec.Replicas, -1)
	}
	// New under TCG: the workers are staged behind the control plane.
	apply(1, true)
	if cp, w := replicas(); cp != 1 || w != 0 {
		t.Errorf("after the first apply: control plane %d, workers %d; want 1 and 0 (staged)", cp, w)
	}
	// Applied again with other sizes, as a second create does: the
	// replicas follow.
	apply(2, false)
	if _, w := replicas(); w != 2 {
		t.Errorf("after applying 2 workers: %d", w)
	}
	// A scale in between is undone: the command says what the cluster is.
	md := &clusterv1.MachineDeployment{}
	must(t, p.Client.Get(ctx, client.ObjectKey{Namespace: "default", Name: "conv-md-0"}, md))
	patch := client.MergeFrom(md.DeepCopy())
	md.Spec.Replicas = ptr.To[int32](5)
	must(t, p.Client.Patch(ctx, md, patch))
	apply(2, false)
	if _, w := replicas(); w != 2 {
		t.Errorf("after a scale to 5 and applying 2 workers: %d", w)
	}
	cli(nil, "get", "clusters").expect(t, "get clusters", 0, []string{"NAMESPACE", "default", "conv"}, nil)
	var listed struct {
		Clusters []struct{ Namespace, Name string }
	}
	r = cli(nil, "get", "clusters", "-o", "json")
	r.expect(t, "get clusters -o json", 0, nil, nil)
	if err := json.Unmarshal([]byte(r.stdout), &listed); err != nil || len(listed.Clusters) != 1 || listed.Clusters[0].Name != "conv" {
		t.Errorf("get clusters -o json: %v\n%s", err, r.stdout)
	}
	cli(nil, "get", "clusters", "-o", "yaml").expect(t, "get clusters -o yaml", 0, []string{"clusters:\n- ", "name: conv\n"}, nil)
	// The test driver makes no VM: the cluster's machines have no domain.
	cli(nil, "get", "nodes", "conv").expect(t, "get nodes conv", 0, []string{"No VMs found."}, nil)
	cli(nil, "get", "nodes", "-o", "json").expect(t, "get nodes -o json", 0, []string{`"nodes": []`}, nil)
	cli(nil, "get", "nodes", "nope").expect(t, "get nodes of no cluster", 1, nil, []string{"no cluster default/nope"})
	cli(nil, "status", "conv", "-o", "yaml").expect(t, "status conv -o yaml", 0, []string{"clusters:\n- ", "name: conv\n", "libvirtCluster:", "machineDeployments:", "kind: KubeadmControlPlane"}, nil)
	r = cli(nil, "status", "-o", "json")
	r.expect(t, "status -o json", 0, []string{`"plane": {`, `"libvirtURI": "` + uri + `"`}, nil)
	if !json.Valid([]byte(r.stdout)) {
		t.Errorf("status -o json is no JSON:\n%s", r.stdout)
	}
	cli(nil, "status", "conv").expect(t, "status conv", 0, []string{"Cluster default/conv", "conditions:", "LibvirtCluster conv",
		"KubeadmControlPlane conv-control-plane", "MachineDeployment conv-md-0"}, nil)
	cli(nil, "status", "nope").expect(t, "status of no cluster", 1, nil, []string{"no cluster default/nope"})

	cli(nil, "orphans").expect(t, "orphans", 0, []string{"no orphans"}, nil)
	cli(nil, "doctor", "--no-demo").expect(t, "doctor with the plane running", 0, []string{"running as root", "answers at " + uri}, nil)

	logs := t.TempDir()
	cli(nil, "logs", logs).expect(t, "logs", 0, []string{"wrote " + logs}, nil)
	files := tarballFiles(t, logs)
	for _, want := range []string{"plane/serve.log", "plane/manager.log", "plane/kube-controller-manager.log", "status.txt", "objects/clusters.yaml",
		"objects/kubeadmcontrolplanes.yaml", "objects/libvirtclusters.yaml", "events.txt"} {
		if files[want] == "" && !hasKey(files, want) {
			t.Errorf("the logs bundle lacks %s (has %v)", want, keys(files))
		}
	}
	if !strings.Contains(files["objects/clusters.yaml"], "name: conv") {
		t.Errorf("objects/clusters.yaml lacks the cluster:\n%s", files["objects/clusters.yaml"])
	}
	for name := range files {
		if strings.Contains(name, "kubeconfig") || strings.HasSuffix(name, ".key") {
			t.Errorf("the logs bundle holds %s", name)
		}
	}
	if errs, ok := files["errors.txt"]; ok {
		t.Logf("the bundle's errors.txt (no VM: nothing to read from one):\n%s", errs)
	}

	// A build that changed nothing (go build touches an up-to-date
	// output, as every make up does): no warning.
	self := filepath.Join(bin, "capl-dev")
	future := time.Now().Add(time.Hour)
	must(t, os.Chtimes(self, future, future))
	if r := cli(nil, "status"); strings.Contains(r.stderr, "older build") {
		t.Errorf("status after a build that changed nothing warns: %s", r.stderr)
	}
	// A rebuilt binary (other bytes, written beside and renamed over, as
	// go build does): the running plane is named older, with the command
	// that restarts it.
	data, err := os.ReadFile(self)
	must(t, err)
	must(t, os.WriteFile(self+".new", append(data, 0), 0o755))
	must(t, os.Rename(self+".new", self))
	cli(nil, "status").expect(t, "status after a rebuild", 0, nil, []string{"the management plane runs an older build", "capl-dev start --restart --state-dir=" + state})
	before := p.Endpoints.ServePID
	cli(nil, "start", "--restart").expect(t, "start --restart", 0, []string{"restarting the management plane", "management plane ready"}, nil)
	p, err = plane.Attach(state)
	must(t, err)
	if p.Endpoints.ServePID == before {
		t.Errorf("start --restart kept the plane's pid %d", before)
	}
	r = cli(nil, "status")
	r.expect(t, "status after start --restart", 0, []string{"Cluster default/conv"}, nil)
	if strings.Contains(r.stderr, "older build") {
		t.Errorf("the restarted plane is still called older: %s", r.stderr)
	}

	cli(nil, "stop").expect(t, "stop", 0, []string{"stopping the management plane"}, nil)
	if processRuns(t, filepath.Join(bin, "capl-dev")) {
		t.Errorf("the plane (pid %d) still runs after stop", p.Endpoints.ServePID)
	}
	cli(nil, "status").expect(t, "status when stopped", 1, nil, []string{"not running", "capl-dev start"})
	cli(nil, "start").expect(t, "start", 0, []string{"management plane ready"}, nil)
	cli(nil, "get", "clusters").expect(t, "get clusters after start", 0, []string{"conv"}, nil)

	cli(nil, "delete", "cluster", "conv", "--timeout=5m", "--kubeconfig="+merged).expect(t, "delete cluster", 0, []string{"cluster default/conv deleted"}, nil)
	cli(nil, "get", "clusters").expect(t, "get clusters after delete", 0, []string{"No clusters found."}, nil)
	cli(nil, "down").expect(t, "down", 0, []string{"removed"}, nil)
	if _, err := os.Stat(state); err == nil {
		t.Errorf("down left %s", state)
	}
}

// testKubeconfig is a kubeconfig as Cluster API writes one.
func testKubeconfig(t *testing.T, name, server string) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: []byte("ca")}
	cfg.AuthInfos[name+"-admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: []byte("cert"), ClientKeyData: []byte("key")}
	cfg.Contexts[name+"-admin@"+name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name + "-admin"}
	cfg.CurrentContext = name + "-admin@" + name
	data, err := clientcmd.Write(*cfg)
	must(t, err)
	return data
}

// checkMerged checks a merged kubeconfig file: the context is current,
// points at the server, and the file is 0600 and uid's.
func checkMerged(t *testing.T, path, ctxName, server string, uid int) {
	t.Helper()
	cfg, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Errorf("reading %s: %v", path, err)
		return
	}
	if cfg.CurrentContext != ctxName || cfg.Contexts[ctxName] == nil || cfg.Clusters[ctxName] == nil || cfg.Clusters[ctxName].Server != server {
		t.Errorf("%s: current context %q, contexts %v", path, cfg.CurrentContext, cfg.Contexts)
	}
	fi, err := os.Stat(path)
	must(t, err)
	st := fi.Sys().(*syscall.Stat_t)
	if int(st.Uid) != uid || fi.Mode().Perm() != 0o600 {
		t.Errorf("%s: uid %d mode %v, want uid %d mode 0600", path, st.Uid, fi.Mode().Perm(), uid)
	}
}

// tarballFiles reads the one .tar.gz in dir: file names (without the
// bundle's top directory) to contents.
func tarballFiles(t *testing.T, dir string) map[string]string {
	t.Helper()
	matches, err := filepath.Glob(filepath.Join(dir, "capl-dev-logs-*.tar.gz"))
	must(t, err)
	if len(matches) != 1 {
		t.Fatalf("%d bundles in %s", len(matches), dir)
	}
	f, err := os.Open(matches[0])
	must(t, err)
	defer f.Close()
	gz, err := gzip.NewReader(f)
	must(t, err)
	tr := tar.NewReader(gz)
	files := map[string]string{}
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			return files
		}
		must(t, err)
		data, err := io.ReadAll(tr)
		must(t, err)
		_, name, _ := strings.Cut(hdr.Name, "/")
		files[name] = string(data)
	}
}

func hasKey(m map[string]string, k string) bool { _, ok := m[k]; return ok }

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	return out
}

func tailLines(s string, n int) string {
	lines := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}
