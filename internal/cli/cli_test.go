package cli

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"errors"
	"io"
	"os"
	"os/user"
	"path/filepath"
	"strings"
	"syscall"
	"testing"

	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
)

func repoFile(parts ...string) string {
	return filepath.Join(append([]string{"..", ".."}, parts...)...)
}

// TestResolveKubeconfigTarget: --merge writes --kubeconfig, else the
// first file of $KUBECONFIG, else the invoking person's ~/.kube/config,
// SUDO_USER's under sudo. Under sudo uid and gid are SUDO_USER's whichever
// file it is: they own only what the merge creates (TestKubeconfigOwner),
// so an existing --kubeconfig file is not given to SUDO_USER.
func TestResolveKubeconfigTarget(t *testing.T) {
	users := map[string]*user.User{"alice": {Uid: "1000", Gid: "1001", HomeDir: "/home/alice"}}
	lookup := func(name string) (*user.User, error) {
		if u, ok := users[name]; ok {
			return u, nil
		}
		return nil, user.UnknownUserError(name)
	}
	home := func() (string, error) { return "/root", nil }
	sudo := map[string]string{"SUDO_USER": "alice", "SUDO_UID": "1000", "SUDO_GID": "1001"}
	withEnv := func(env map[string]string, k, v string) map[string]string {
		out := map[string]string{k: v}
		for k, v := range env {
			out[k] = v
		}
		return out
	}
	for _, tc := range []struct {
		name string
		path string
		euid int
		env  map[string]string
		want kubeconfigFile
	}{
		{"root without sudo", "", 0, nil, kubeconfigFile{"/root/.kube/config", -1, -1}},
		{"a user without sudo", "", 1000, map[string]string{"SUDO_USER": "alice"}, kubeconfigFile{"/root/.kube/config", -1, -1}},
		{"sudo", "", 0, map[string]string{"SUDO_USER": "alice", "SUDO_UID": "1000", "SUDO_GID": "1001"}, kubeconfigFile{"/home/alice/.kube/config", 1000, 1001}},
		{"sudo without SUDO_UID", "", 0, map[string]string{"SUDO_USER": "alice"}, kubeconfigFile{"/home/alice/.kube/config", 1000, 1001}},
		{"sudo to root from root", "", 0, map[string]string{"SUDO_USER": "root", "SUDO_UID": "0", "SUDO_GID": "0"}, kubeconfigFile{"/root/.kube/config", -1, -1}},
		// The owner of what the merge creates; an existing /tmp/k keeps
		// its own (TestKubeconfigOwner).
		{"sudo with --kubeconfig", "/tmp/k", 0, sudo, kubeconfigFile{"/tmp/k", 1000, 1001}},
		{"$KUBECONFIG", "", 1000, map[string]string{"KUBECONFIG": "/a/config:/b/config"}, kubeconfigFile{"/a/config", -1, -1}},
		{"$KUBECONFIG with an empty first entry", "", 1000, map[string]string{"KUBECONFIG": ":/b/config"}, kubeconfigFile{"/b/config", -1, -1}},
		{"$KUBECONFIG under sudo", "", 0, withEnv(sudo, "KUBECONFIG", "/a/config"), kubeconfigFile{"/a/config", 1000, 1001}},
		{"--kubeconfig before $KUBECONFIG", "/tmp/k", 1000, map[string]string{"KUBECONFIG": "/a/config"}, kubeconfigFile{"/tmp/k", -1, -1}},
		{"empty $KUBECONFIG", "", 0, map[string]string{"KUBECONFIG": ""}, kubeconfigFile{"/root/.kube/config", -1, -1}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := resolveKubeconfigTarget(tc.path, tc.euid, func(k string) string { return tc.env[k] }, lookup, home)
			if err != nil {
				t.Fatal(err)
			}
			if got != tc.want {
				t.Errorf("got %+v, want %+v", got, tc.want)
			}
		})
	}
	if _, err := resolveKubeconfigTarget("", 0, func(k string) string { return map[string]string{"SUDO_USER": "bob"}[k] }, lookup, home); err == nil {
		t.Error("an unknown SUDO_USER without SUDO_UID resolved")
	}
}

// workloadKubeconfig is a kubeconfig as Cluster API writes it.
func workloadKubeconfig(t *testing.T, name, server string) []byte {
	t.Helper()
	cfg := clientcmdapi.NewConfig()
	cfg.Clusters[name] = &clientcmdapi.Cluster{Server: server, CertificateAuthorityData: []byte("ca")}
	cfg.AuthInfos[name+"-admin"] = &clientcmdapi.AuthInfo{ClientCertificateData: []byte("cert"), ClientKeyData: []byte("key")}
	cfg.Contexts[name+"-admin@"+name] = &clientcmdapi.Context{Cluster: name, AuthInfo: name + "-admin"}
	cfg.CurrentContext = name + "-admin@" + name
	data, err := clientcmd.Write(*cfg)
	if err != nil {
		t.Fatal(err)
	}
	return data
}

// TestMergeKubeconfig merges two clusters into a file holding another
// context, replaces one on a second merge, and removes one again: the
// other entries stay, the current context follows, the file is 0600.
func TestMergeKubeconfig(t *testing.T) {
	path := filepath.Join(t.TempDir(), "kube", "config")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		t.Fatal(err)
	}
	mine := clientcmdapi.NewConfig()
	mine.Clusters["mine"] = &clientcmdapi.Cluster{Server: "https://mine:6443"}
	mine.AuthInfos["mine"] = &clientcmdapi.AuthInfo{Token: "t"}
	mine.Contexts["mine"] = &clientcmdapi.Context{Cluster: "mine", AuthInfo: "mine"}
	mine.CurrentContext = "mine"
	if err := clientcmd.WriteToFile(*mine, path); err != nil {
		t.Fatal(err)
	}
	target := kubeconfigFile{path: path, uid: os.Getuid(), gid: os.Getgid()}
	for _, step := range []struct{ ctx, server string }{
		{"capl-a", "https://192.168.1.10:6443"},
		{"capl-team-b", "https://192.168.2.10:6443"},
		{"capl-a", "https://192.168.3.10:6443"},
	} {
		if err := mergeKubeconfig(target, workloadKubeconfig(t, "w", step.server), step.ctx); err != nil {
			t.Fatal(err)
		}
		got, err := clientcmd.LoadFromFile(path)
		if err != nil {
			t.Fatal(err)
		}
		if got.CurrentContext != step.ctx || got.Clusters[step.ctx].Server != step.server || got.Contexts[step.ctx].AuthInfo != step.ctx {
			t.Errorf("after merging %s: current %s, cluster %+v", step.ctx, got.CurrentContext, got.Clusters[step.ctx])
		}
		if got.Contexts["mine"] == nil || got.AuthInfos["mine"].Token != "t" {
			t.Errorf("after merging %s the context mine is lost", step.ctx)
		}
	}
	fi, err := os.Stat(path)
	if err != nil {
		t.Fatal(err)
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("mode %v, want 0600", fi.Mode().Perm())
	}
	removed, err := removeKubeconfigContext(path, "capl-a")
	if err != nil || !removed {
		t.Fatalf("removing capl-a: %v, %v", removed, err)
	}
	got, err := clientcmd.LoadFromFile(path)
	if err != nil {
		t.Fatal(err)
	}
	if got.Contexts["capl-a"] != nil || got.Clusters["capl-a"] != nil || got.AuthInfos["capl-a"] != nil || got.Contexts["capl-team-b"] == nil {
		t.Errorf("after removing capl-a: contexts %v", got.Contexts)
	}
	if removed, err := removeKubeconfigContext(filepath.Join(t.TempDir(), "none"), "capl-a"); removed || err != nil {
		t.Errorf("removing from a missing file: %v, %v", removed, err)
	}
}

// TestKubeconfigOwner: a merge gives the target's user only what it
// creates. An existing file keeps its owner and is tightened to 0600 (were
// it chowned to the target's uid 65534, the merge would fail without root
// and change the owner with root); a symbolic link at the path is refused
// and what it points to left alone; a new file and directory are made
// 0600 and 0700.
func TestKubeconfigOwner(t *testing.T) {
	dir := t.TempDir()
	data := workloadKubeconfig(t, "w", "https://192.168.1.10:6443")
	lstat := func(path string) os.FileInfo {
		t.Helper()
		fi, err := os.Lstat(path)
		if err != nil {
			t.Fatal(err)
		}
		return fi
	}

	existing := filepath.Join(dir, "existing")
	if err := clientcmd.WriteToFile(*clientcmdapi.NewConfig(), existing); err != nil {
		t.Fatal(err)
	}
	if err := os.Chmod(existing, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := mergeKubeconfig(kubeconfigFile{path: existing, uid: 65534, gid: 65534}, data, "capl-a"); err != nil {
		t.Fatalf("merging into an existing file: %v", err)
	}
	fi := lstat(existing)
	if got := fi.Sys().(*syscall.Stat_t).Uid; got != uint32(os.Geteuid()) {
		t.Errorf("the existing file is owned by %d after the merge, want %d", got, os.Geteuid())
	}
	if fi.Mode().Perm() != 0o600 {
		t.Errorf("the existing file has mode %v after the merge, want 0600", fi.Mode().Perm())
	}

	link := filepath.Join(dir, "link")
	if err := os.Symlink(existing, link); err != nil {
		t.Fatal(err)
	}
	before, err := os.ReadFile(existing)
	if err != nil {
		t.Fatal(err)
	}
	err = mergeKubeconfig(kubeconfigFile{path: link, uid: -1, gid: -1}, workloadKubeconfig(t, "w", "https://192.168.9.9:6443"), "capl-b")
	if err == nil || !strings.Contains(err.Error(), "symbolic link") {
		t.Errorf("merging through a symbolic link: %v, want an error saying it is one", err)
	}
	if after, _ := os.ReadFile(existing); !bytes.Equal(after, before) {
		t.Errorf("the file behind the symbolic link changed")
	}
	if _, err := removeKubeconfigContext(link, "capl-a"); err == nil {
		t.Errorf("removing a context through a symbolic link: no error")
	}

	created := filepath.Join(dir, "new", ".kube", "config")
	if err := mergeKubeconfig(kubeconfigFile{path: created, uid: os.Geteuid(), gid: os.Getegid()}, data, "capl-a"); err != nil {
		t.Fatalf("merging into a new file: %v", err)
	}
	for path, mode := range map[string]os.FileMode{created: 0o600, filepath.Dir(created): 0o700, filepath.Join(dir, "new"): 0o700} {
		if got := lstat(path).Mode().Perm(); got != mode {
			t.Errorf("%s has mode %v, want %v", path, got, mode)
		}
	}
	for _, d := range []string{dir, filepath.Dir(created)} {
		if left, _ := filepath.Glob(filepath.Join(d, ".*.tmp-*")); len(left) > 0 {
			t.Errorf("temporary files left: %v", left)
		}
	}
}

// TestRedact: bootstrap tokens go from every text a logs bundle holds,
// the rest stays as it was.
func TestRedact(t *testing.T) {
	const hash = "sha256:0f2c8e5a7d3b4c6e8f9a1b2c3d4e5f60718293a4b5c6d7e8f90a1b2c3d4e5f60"
	for _, tc := range []struct{ name, in, want string }{
		{"KubeadmConfig", "      bootstrapToken:\n        token: abcdef.0123456789abcdef\n", "      bootstrapToken:\n        token: <redacted>\n"},
		{"kubeadm init's join line", "kubeadm join 192.168.1.10:6443 --token x7k2p9.q1w2e3r4t5y6u7i8 \\\n\t--discovery-token-ca-cert-hash " + hash,
			"kubeadm join 192.168.1.10:6443 --token <redacted> \\\n\t--discovery-token-ca-cert-hash " + hash},
		{"after an escaped newline", `{"msg":"join with\nx7k2p9.q1w2e3r4t5y6u7i8"}`, `{"msg":"join with\n<redacted>"}`},
		{"two on a line", "abcdef.0123456789abcdef,x7k2p9.q1w2e3r4t5y6u7i8", "<redacted>,<redacted>"},
		{"nothing to redact", "VM capl-default.web-md-0-abcde-xyz12 running, image capl-image-sha256-0f2c8e5a7d3b4c6e", "VM capl-default.web-md-0-abcde-xyz12 running, image capl-image-sha256-0f2c8e5a7d3b4c6e"},
		{"a secret too short", "abcdef.0123456789abcde", "abcdef.0123456789abcde"},
		{"empty", "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := string(redact([]byte(tc.in))); got != tc.want {
				t.Errorf("redact(%q)\n got %q\nwant %q", tc.in, got, tc.want)
			}
		})
	}
}

// TestBundleRedacts: the tarball holds no bootstrap token, whichever file
// it was in, errors.txt included.
func TestBundleRedacts(t *testing.T) {
	const token = "abcdef.0123456789abcdef"
	b := newBundle("logs")
	b.add("objects/kubeadmconfigs.yaml", []byte("token: "+token+"\n"))
	b.add("vms/capl-default.demo-cp-1/console.log", []byte("kubeadm join 192.168.1.10:6443 --token "+token+"\n"))
	b.fail("vms/capl-default.demo-md-0/kubelet.log", errors.New("journalctl: --token "+token))
	path := filepath.Join(t.TempDir(), "logs.tar.gz")
	if err := b.write(path); err != nil {
		t.Fatal(err)
	}
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	gz, err := gzip.NewReader(f)
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(gz)
	files := 0
	for {
		hdr, err := tr.Next()
		if err == io.EOF {
			break
		}
		if err != nil {
			t.Fatal(err)
		}
		data, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files++
		if strings.Contains(string(data), token) || !strings.Contains(string(data), redacted) {
			t.Errorf("%s: %q, want the token replaced by %s", hdr.Name, data, redacted)
		}
	}
	if files != 3 {
		t.Errorf("%d files in the bundle, want 3", files)
	}
}

// TestContextName: kind's naming, with the namespace outside default.
func TestContextName(t *testing.T) {
	for _, tc := range []struct{ ns, name, want string }{
		{"default", "demo", "capl-demo"},
		{"", "demo", "capl-demo"},
		{"team-a", "dev", "capl-team-a-dev"},
	} {
		if got := contextName(tc.ns, tc.name); got != tc.want {
			t.Errorf("contextName(%q, %q) = %q, want %q", tc.ns, tc.name, got, tc.want)
		}
	}
}

// TestClusterSizes adds up what the real template's machines ask for:
// replicas times their template, plus the HAProxy VM; TCG adds the
// translation caches.
func TestClusterSizes(t *testing.T) {
	base := devplane.ClusterOptions{
		Namespace: "default", Name: "demo", KubernetesVersion: "v1.36.3",
		Template: repoFile("templates", "cluster-template.yaml"), CNI: repoFile("templates", "cni-flannel.yaml"),
	}
	for _, tc := range []struct {
		name                  string
		cp, workers           int32
		tcg                   bool
		vms                   int
		memoryMiB, tcgMiB, gb int64
	}{
		{"kvm 1 + 1", 1, 1, false, 3, 4096 + 2048 + 512, 0, 20 + 20},
		{"kvm 3 + 2", 3, 2, false, 6, 3*4096 + 2*2048 + 512, 0, 5 * 20},
		// TCG: staged workers still count; 1024 MiB caches for nodes,
		// the load balancer's default.
		{"tcg 1 + 1", 1, 1, true, 3, 4096 + 2048 + 512, 2*1024 + devplane.DefaultTCGCacheMiB, 40},
		{"tcg 1 + 0", 1, 0, true, 2, 4096 + 512, 1024 + devplane.DefaultTCGCacheMiB, 20},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := base
			o.ControlPlane, o.Workers, o.DomainType = tc.cp, tc.workers, "kvm"
			if tc.tcg {
				o.DomainType = "qemu"
				o = o.TCGTuning()
			}
			s, err := clusterSizes(o)
			if err != nil {
				t.Fatal(err)
			}
			if s.vms != tc.vms || s.memoryMiB != tc.memoryMiB || s.tcgCacheMiB != tc.tcgMiB || s.diskGiB != tc.gb {
				t.Errorf("sizes %+v, want %d VMs, %d MiB, %d MiB of TCG caches, %d GiB", s, tc.vms, tc.memoryMiB, tc.tcgMiB, tc.gb)
			}
		})
	}
}

// TestMemoryCheck: less than the guests' memory fails, less than that
// with TCG's caches warns.
func TestMemoryCheck(t *testing.T) {
	avail, err := memAvailableMiB()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		want sizes
		v    verdict
	}{
		{"fits", sizes{vms: 1, memoryMiB: 1}, pass},
		{"caches do not fit", sizes{vms: 1, memoryMiB: 1, tcgCacheMiB: avail * 2}, warn},
		{"guests do not fit", sizes{vms: 1, memoryMiB: avail * 2}, fail},
		{"the plane does not fit", sizes{planeMiB: avail * 2}, fail},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if c := memoryCheck(tc.want); c.verdict != tc.v {
				t.Errorf("%s %s, want %s", c.verdict, c.detail, tc.v)
			}
		})
	}
}
