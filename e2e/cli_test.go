//go:build e2e

package e2e

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

var cliFlag = flag.Bool("e2e.cli", false, "drive capl-dev on real VMs as a person would: up --no-demo, create cluster, get kubeconfig --merge, status, exec, load image run as a pod, logs, stop and start (same domains), delete cluster, down (`make test-soak`)")

// The CLI scenario's cluster: a namespace, pool and state directory of
// its own, so that nothing it does touches the suite's.
const (
	cliNamespace   = "e2e-cli"
	cliCluster     = "cli"
	cliPool        = "capl-e2e-cli"
	cliStatePrefix = "capl-e2e-cli-"
	// cliImage is the image load image brings to the node.
	cliImage    = "capl.test/hello:v1"
	cliGreeting = "hello from an image capl-dev loaded"
)

// bootstrapTokenLike matches a kubeadm bootstrap token, which capl-dev
// logs redacts.
var bootstrapTokenLike = regexp.MustCompile(`[a-z0-9]{6}\.[a-z0-9]{16}`)

// cliRun is one run of the capl-dev binary.
type cliRun struct {
	code           int
	stdout, stderr string
}

// TestCLI drives the built capl-dev on real VMs the way the README tells
// a person to: up --no-demo; create cluster (1 control plane under TCG,
// no worker: a 2-core host); get clusters, status, get kubeconfig --merge
// used by kubectl; exec with output, exit code and standard input; load
// image of a small image built here and run as a pod that pulls nothing;
// logs with every VM's console log, cloud-init output and journal; stop
// (VMs shut off, plane gone) and start (the same domains, UUIDs and
// providerIDs, nodes Ready again); delete cluster (nothing of the
// namespace left in libvirt); down.
func TestCLI(t *testing.T) {
	if !*cliFlag {
		t.Skip("drives capl-dev on real VMs: run with -e2e.cli (make test-soak)")
	}
	env := map[string]string{}
	for _, k := range []string{envBin, envURI, envArtifacts, "KUBEBUILDER_ASSETS"} {
		if env[k] = os.Getenv(k); env[k] == "" {
			t.Fatalf("%s is unset: run the suite through `make test-soak`", k)
		}
	}
	nodeImage := testlibvirt.NodeImage(t)
	bin, uri, assets := env[envBin], env[envURI], env["KUBEBUILDER_ASSETS"]
	lock, alone, err := testlibvirt.LockExclusive(hostLockPath)
	must(t, err)
	// Released by a cleanup registered before the one below, so it runs
	// after it (cleanups run in reverse order): once down has run and libvirt
	// has been searched for leftovers, so that no other run takes the host
	// while this one still has VMs on it. A defer would release it before
	// any cleanup runs.
	t.Cleanup(func() { _ = lock.Close() })
	if !alone {
		t.Fatalf("another e2e run holds %s on this host", hostLockPath)
	}
	state, err := os.MkdirTemp("", cliStatePrefix)
	must(t, err)
	work := t.TempDir()
	global := []string{"--state-dir=" + state, "--libvirt-uri=" + uri}
	cli := func(stdin []byte, args ...string) cliRun {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 60*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, filepath.Join(bin, "capl-dev"), append(global, args...)...)
		var out, errOut bytes.Buffer
		cmd.Stdout, cmd.Stderr, cmd.Stdin = &out, &errOut, bytes.NewReader(stdin)
		start := time.Now()
		err := cmd.Run()
		r := cliRun{stdout: out.String(), stderr: errOut.String()}
		var exit *exec.ExitError
		switch {
		case errors.As(err, &exit):
			r.code = exit.ExitCode()
		case err != nil:
			t.Fatalf("capl-dev %s: %v", strings.Join(args, " "), err)
		}
		t.Logf("capl-dev %s: exit %d after %s\n%s%s", strings.Join(args, " "), r.code, time.Since(start).Round(time.Second), r.stdout, r.stderr)
		return r
	}
	ok := func(r cliRun, what string, want ...string) {
		t.Helper()
		if r.code != 0 {
			t.Fatalf("%s: exit code %d", what, r.code)
		}
		for _, w := range want {
			if !strings.Contains(r.stdout, w) {
				t.Errorf("%s: output lacks %q", what, w)
			}
		}
	}
	t.Cleanup(func() {
		if t.Failed() {
			cli(nil, "logs", env[envArtifacts])
		}
		if r := cli(nil, "down"); r.code != 0 {
			t.Errorf("down: exit %d", r.code)
		}
		_ = os.RemoveAll(state)
		if left := cliLibvirtObjects(t, uri); len(left) > 0 {
			t.Errorf("after down libvirt still holds: %s", strings.Join(left, ", "))
		}
	})

	ok(cli(nil, "up", "--no-demo", "--manager="+filepath.Join(bin, "manager"), "--assets="+assets, "--image-dir="+filepath.Dir(nodeImage)),
		"up --no-demo", "host checked", "management plane ready")
	ns := []string{"--namespace=" + cliNamespace}
	ok(cli(nil, append([]string{"create", "cluster", cliCluster, "--workers=0", "--domain-type=qemu", "--storage-pool=" + cliPool,
		"--node-image=" + nodeImage, "--kubernetes-version=" + nodeImageVersion(nodeImage), "--image-dir=" + filepath.Dir(nodeImage),
		"--timeout=45m"}, ns...)...), "create cluster", "all 1 nodes Ready")
	ok(cli(nil, "get", "clusters"), "get clusters", cliNamespace, cliCluster)
	ok(cli(nil, append([]string{"status", cliCluster}, ns...)...), "status", "Cluster "+cliNamespace+"/"+cliCluster, "KubeadmControlPlane", "VM capl-"+cliNamespace+".", "running")

	kubeconfig := filepath.Join(work, "kube", "config")
	ok(cli(nil, append([]string{"get", "kubeconfig", cliCluster, "--merge", "--kubeconfig=" + kubeconfig}, ns...)...),
		"get kubeconfig --merge", "context capl-"+cliNamespace+"-"+cliCluster)
	kubectl := func(args ...string) (string, error) {
		out, err := exec.Command(filepath.Join(assets, "kubectl"), append([]string{"--kubeconfig=" + kubeconfig, "--request-timeout=60s"}, args...)...).CombinedOutput()
		return string(out), err
	}
	out, err := kubectl("get", "nodes", "-o", "wide")
	if err != nil || !strings.Contains(out, " Ready ") {
		t.Errorf("kubectl through the merged context: %v\n%s", err, out)
	}

	p, err := plane.Attach(state)
	must(t, err)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Minute)
	defer cancel()
	before := cliIdentities(ctx, t, p.Client)
	var node string
	for n := range before.nodes {
		node = n
	}
	if node == "" {
		t.Fatalf("no node in %+v", before)
	}

	// exec: output, the guest's exit code, standard input.
	hostname := cli(nil, append([]string{"exec"}, append(ns, node, "--", "cat", "/etc/hostname")...)...)
	if hostname.code != 0 || strings.TrimSpace(hostname.stdout) != node {
		t.Errorf("exec cat /etc/hostname: exit %d, %q, want %q", hostname.code, hostname.stdout, node)
	}
	if r := cli(nil, append([]string{"exec"}, append(ns, node, "--", "sh", "-c", "echo out; echo err >&2; exit 7")...)...); r.code != 7 || r.stdout != "out\n" || r.stderr != "err\n" {
		t.Errorf("exec exit 7: exit %d, stdout %q, stderr %q", r.code, r.stdout, r.stderr)
	}
	if r := cli([]byte("through stdin\n"), append([]string{"exec", "-i"}, append(ns, node, "--", "cat")...)...); r.code != 0 || r.stdout != "through stdin\n" {
		t.Errorf("exec -i cat: exit %d, %q", r.code, r.stdout)
	}

	// load image: a tarball built here, imported into the nodes and run
	// by a pod that may not pull; then pushed into the plane's registry
	// and pulled again through the node's mirror (Always).
	tarball := buildHelloImage(t, work)
	overrides := `{"spec":{"tolerations":[{"operator":"Exists"}]}}`
	for _, load := range []struct {
		pod, pullPolicy, want string
		flags                 []string
	}{
		// --cluster names the nodes: it implies --to-nodes. Without it the
		// plane's registry serves every cluster.
		{pod: "hello-nodes", pullPolicy: "Never", want: "imported", flags: []string{"--cluster=" + cliCluster}},
		{pod: "hello", pullPolicy: "Always", want: "pushed into the plane's registry"},
	} {
		ok(cli(nil, append(append([]string{"load", "image", tarball}, load.flags...), ns...)...), "load image "+strings.Join(load.flags, " "), load.want)
		if out, err := kubectl("run", load.pod, "--image="+cliImage, "--image-pull-policy="+load.pullPolicy, "--restart=Never", "--overrides="+overrides); err != nil {
			t.Fatalf("kubectl run: %v\n%s", err, out)
		}
		if out, err := kubectl("wait", "--for=condition=Ready", "pod/"+load.pod, "--timeout=10m"); err != nil {
			desc, _ := kubectl("describe", "pod", load.pod)
			t.Fatalf("the pod of the loaded image: %v\n%s\n%s", err, out, desc)
		}
		if out, err := kubectl("logs", load.pod); err != nil || !strings.Contains(out, cliGreeting) {
			t.Errorf("the pod's log: %v\n%s", err, out)
		}
	}

	// logs: the bundle explains the cluster.
	logsDir := filepath.Join(work, "logs")
	ok(cli(nil, "logs", logsDir), "logs", "wrote ")
	files := cliBundle(t, logsDir)
	for _, want := range []string{"plane/serve.log", "plane/manager.log", "status.txt", "events.txt", "objects/libvirtmachines.yaml", "objects/kubeadmcontrolplanes.yaml"} {
		if _, ok := files[want]; !ok {
			t.Errorf("the logs bundle lacks %s", want)
		}
	}
	for domain := range before.domains {
		for _, f := range []string{"console.log", "cloud-init-output.log", "domain.txt"} {
			if len(files["vms/"+domain+"/"+f]) == 0 {
				t.Errorf("the logs bundle lacks vms/%s/%s or it is empty", domain, f)
			}
		}
	}
	if errs, ok := files["errors.txt"]; ok {
		t.Logf("the bundle's errors.txt:\n%s", errs)
	}
	// No bootstrap token in any file (kubeadm init's output in the
	// control plane's cloud-init log prints a join line with one).
	for name, data := range files {
		if bootstrapTokenLike.MatchString(data) {
			t.Errorf("the logs bundle's %s holds a bootstrap token", name)
		}
	}

	// stop: the plane and every VM down; start: the same VMs back.
	ok(cli(nil, "stop"), "stop", "stopped: the plane and")
	host, err := virt.Dial(ctx, uri)
	must(t, err)
	defer host.Close()
	for domain := range before.domains {
		info, err := host.DomainInfo(ctx, domain)
		if err != nil || info.State != "shutoff" {
			t.Errorf("after stop %s is %q (%v), want shutoff", domain, info.State, err)
		}
	}
	if _, err := plane.Attach(state); !errors.Is(err, plane.ErrNotRunning) {
		t.Errorf("after stop the plane answers attach: %v", err)
	}
	// A second stop asks libvirt and finds nothing left running.
	ok(cli(nil, "stop"), "a second stop", "already stopped")
	ok(cli(nil, "start", "--timeout=40m"), "start", "nodes Ready after")
	p, err = plane.Attach(state)
	must(t, err)
	after := cliIdentities(ctx, t, p.Client)
	if fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("identities changed across stop and start:\nbefore %+v\nafter  %+v", before, after)
	}
	for domain, uuid := range before.domains {
		info, err := host.DomainInfo(ctx, domain)
		if err != nil || info.UUID != uuid || info.State != "running" {
			t.Errorf("after start %s: %+v (%v), want running with UUID %s", domain, info, err, uuid)
		}
	}

	ok(cli(nil, append([]string{"delete", "cluster", cliCluster, "--kubeconfig=" + kubeconfig}, ns...)...), "delete cluster", "deleted")
	if left := cliLibvirtObjects(t, uri); len(left) > 0 {
		t.Errorf("after delete cluster libvirt still holds: %s", strings.Join(left, ", "))
	}
	ok(cli(nil, "down"), "down", "removed")
}

// buildHelloImage builds a static program that prints cliGreeting and
// sleeps, and writes it as a one-layer image in docker save's format:
// the tarball load image takes.
func buildHelloImage(t *testing.T, work string) string {
	t.Helper()
	src := filepath.Join(work, "hello")
	must(t, os.MkdirAll(src, 0o755))
	must(t, os.WriteFile(filepath.Join(src, "go.mod"), []byte("module hello\n\ngo 1.26\n"), 0o644))
	must(t, os.WriteFile(filepath.Join(src, "main.go"), []byte(fmt.Sprintf(`package main

import (
	"fmt"
	"time"
)

func main() {
	fmt.Println(%q)
	for {
		time.Sleep(time.Hour)
	}
}
`, cliGreeting)), 0o644))
	binary := filepath.Join(work, "hello.bin")
	cmd := exec.Command("go", "build", "-trimpath", "-ldflags=-s -w", "-o", binary, ".")
	cmd.Dir = src
	cmd.Env = append(os.Environ(), "CGO_ENABLED=0", "GOOS=linux", "GOARCH=amd64", "GOTOOLCHAIN=local", "GOFLAGS=-mod=mod")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("building the image's program: %v\n%s", err, out)
	}
	prog, err := os.ReadFile(binary)
	must(t, err)

	layer := tarOf(t, []tarEntry{{"hello", 0o755, prog}})
	layerSum := sha256.Sum256(layer)
	config, err := json.Marshal(map[string]any{
		"architecture": "amd64", "os": "linux",
		"config": map[string]any{"Entrypoint": []string{"/hello"}},
		"rootfs": map[string]any{"type": "layers", "diff_ids": []string{"sha256:" + hex.EncodeToString(layerSum[:])}},
	})
	must(t, err)
	manifest, err := json.Marshal([]map[string]any{{"Config": "config.json", "RepoTags": []string{cliImage}, "Layers": []string{"layer.tar"}}})
	must(t, err)
	path := filepath.Join(work, "hello.tar")
	must(t, os.WriteFile(path, tarOf(t, []tarEntry{
		{"config.json", 0o644, config}, {"layer.tar", 0o644, layer}, {"manifest.json", 0o644, manifest},
	}), 0o644))
	return path
}
