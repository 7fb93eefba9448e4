package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"
)

// These tests run the built capl-dev as a person would: arguments in,
// exit code and output out.

var (
	buildOnce sync.Once
	buildDir  string
	buildErr  error
)

// capldev builds capl-dev (and, with manager, the manager) once per test
// process into a directory of its own and returns that directory.
func capldev(t *testing.T) string {
	t.Helper()
	buildOnce.Do(func() {
		buildDir, buildErr = os.MkdirTemp("", "capl-cli-test-")
		if buildErr != nil {
			return
		}
		cmd := exec.Command(goPath(t), "build", "-o", filepath.Join(buildDir, "capl-dev"), ".")
		if out, err := cmd.CombinedOutput(); err != nil {
			buildErr = fmt.Errorf("building capl-dev: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		t.Fatal(buildErr)
	}
	return buildDir
}

func TestMain(m *testing.M) {
	code := m.Run()
	if buildDir != "" {
		_ = os.RemoveAll(buildDir)
	}
	os.Exit(code)
}

// result is what a run of capl-dev gave.
type result struct {
	code           int
	stdout, stderr string
	took           time.Duration
}

// run runs capl-dev with args and env added to this process's.
func runCLI(t *testing.T, env []string, args ...string) result {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, filepath.Join(capldev(t), "capl-dev"), args...)
	cmd.Env = append(os.Environ(), env...)
	var out, errOut bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errOut
	start := time.Now()
	err := cmd.Run()
	r := result{stdout: out.String(), stderr: errOut.String(), took: time.Since(start)}
	var exit *exec.ExitError
	switch {
	case errors.As(err, &exit):
		r.code = exit.ExitCode()
	case err != nil:
		t.Fatalf("capl-dev %s: %v", strings.Join(args, " "), err)
	}
	return r
}

// expect fails t unless r has the exit code and each output holds its
// substrings.
func (r result) expect(t *testing.T, what string, code int, stdout, stderr []string) {
	t.Helper()
	if r.code != code {
		t.Errorf("%s: exit code %d, want %d\nstdout:\n%s\nstderr:\n%s", what, r.code, code, r.stdout, r.stderr)
		return
	}
	for _, s := range stdout {
		if !strings.Contains(r.stdout, s) {
			t.Errorf("%s: stdout lacks %q:\n%s", what, s, r.stdout)
		}
	}
	for _, s := range stderr {
		if !strings.Contains(r.stderr, s) {
			t.Errorf("%s: stderr lacks %q:\n%s", what, s, r.stderr)
		}
	}
}

// commands are every command of capl-dev, as typed.
var commands = [][]string{
	{"up"}, {"down"}, {"stop"}, {"start"}, {"serve"},
	{"create"}, {"create", "cluster"}, {"delete"}, {"delete", "cluster"},
	{"get"}, {"get", "clusters"}, {"get", "nodes"}, {"get", "kubeconfig"}, {"status"}, {"logs"}, {"render"},
	{"exec"}, {"load"}, {"load", "image"}, {"doctor"}, {"orphans"}, {"version"}, {"completion"},
}

// TestHelpAndUsageErrors: every command has help; a command line that
// does not parse exits 2 and says why, on stderr.
func TestHelpAndUsageErrors(t *testing.T) {
	for _, c := range commands {
		r := runCLI(t, nil, append(c, "--help")...)
		r.expect(t, strings.Join(c, " ")+" --help", 0, []string{"Usage:", "capl-dev " + strings.Join(c, " ")}, nil)
	}
	runCLI(t, nil, "--help").expect(t, "--help", 0,
		[]string{"create cluster NAME", "get kubeconfig NAME --merge", "The whole system:", "Nodes:"}, nil)
	for _, tc := range []struct {
		args   []string
		stderr []string
	}{
		{nil, []string{"Usage:", "no command given"}},
		{[]string{"frobnicate"}, []string{`unknown command "frobnicate"`, "capl-dev --help"}},
		{[]string{"up", "--bogus"}, []string{"unknown flag: --bogus", "capl-dev up --help"}},
		{[]string{"up", "--workers=two"}, []string{`invalid argument "two"`}},
		{[]string{"create"}, []string{"capl-dev create cluster NAME"}},
		{[]string{"create", "cluster"}, []string{"accepts 1 arg(s), received 0"}},
		{[]string{"create", "cluster", "a", "b"}, []string{"accepts 1 arg(s), received 2"}},
		{[]string{"get", "kubeconfig"}, []string{"accepts 1 arg(s)"}},
		{[]string{"exec", "node"}, []string{"requires at least 2 arg(s)"}},
		{[]string{"exec", "node", "--"}, []string{"name the VM and the command"}},
		{[]string{"load", "image"}, []string{"requires at least 1 arg(s)"}},
		{[]string{"status", "a", "b"}, []string{"accepts at most 1 arg(s)"}},
		{[]string{"get", "nodes", "a", "b"}, []string{"accepts at most 1 arg(s)"}},
		{[]string{"get", "clusters", "-o", "xml"}, []string{`"xml" is not an output format: json or yaml`}},
		{[]string{"status", "-o", "table"}, []string{`"table" is not an output format`}},
		{[]string{"version", "extra"}, []string{"unknown command"}},
	} {
		runCLI(t, nil, tc.args...).expect(t, "capl-dev "+strings.Join(tc.args, " "), 2, nil, tc.stderr)
	}
}

// TestCallersFlagsParse: the flags that make, the plane (spawning `serve`)
// and the dist test pass still parse; --help then exits 0 without doing
// anything.
func TestCallersFlagsParse(t *testing.T) {
	makefile, err := os.ReadFile(filepath.Join("..", "..", "Makefile"))
	must(t, err)
	joined := strings.ReplaceAll(string(makefile), "\\\n", " ")
	calls := regexp.MustCompile(`\$\(BIN\)/capl-dev ([a-z]+)([^\n]*)`).FindAllStringSubmatch(joined, -1)
	if len(calls) < 2 {
		t.Fatalf("found %d capl-dev calls in the Makefile, want up and down", len(calls))
	}
	flag := regexp.MustCompile(`--[a-z-]+`)
	for _, c := range calls {
		args := []string{c[1]}
		for _, f := range flag.FindAllString(c[2], -1) {
			args = append(args, f+"=x")
		}
		// Values that must parse as what they are.
		for i, a := range args {
			if strings.HasPrefix(a, "--all=") {
				args[i] = "--all"
			}
		}
		runCLI(t, nil, append(args, "--help")...).expect(t, "make's "+strings.Join(args, " "), 0, []string{"Usage:"}, nil)
	}
	// What plane.Start's spawnServe passes.
	runCLI(t, nil, "serve", "--state-dir=/x", "--libvirt-uri=qemu:///system", "--manager=/x/manager", "--assets=/x",
		"--image-dir=/x", "--manager-arg=--v=4", "--manager-arg=--image-url-deny-cidrs=127.0.0.2/32,169.254.0.0/16", "--help").
		expect(t, "serve as the plane spawns it", 0, []string{"Usage:"}, nil)
	runCLI(t, nil, "up", "--no-demo", "--state-dir=/x", "--libvirt-uri=qemu:///system", "--help").expect(t, "up --no-demo", 0, []string{"Usage:"}, nil)
	runCLI(t, nil, "down", "--all", "--state-dir=/x", "--help").expect(t, "down --all", 0, []string{"Usage:"}, nil)
}

// TestCompletion: a completion script for each shell, and completions of
// commands and flags.
func TestCompletion(t *testing.T) {
	for _, shell := range []string{"bash", "zsh", "fish", "powershell"} {
		r := runCLI(t, nil, "completion", shell)
		r.expect(t, "completion "+shell, 0, []string{"capl-dev"}, nil)
		if len(r.stdout) < 1000 {
			t.Errorf("completion %s: a script of %d bytes", shell, len(r.stdout))
		}
	}
	runCLI(t, nil, "__complete", "").expect(t, "commands", 0, []string{"up\t", "create\t", "doctor\t", "status\t"}, nil)
	runCLI(t, nil, "__complete", "get", "").expect(t, "get's commands", 0, []string{"clusters\t", "nodes\t", "kubeconfig\t"}, nil)
	runCLI(t, nil, "__complete", "get", "clusters", "-o", "").expect(t, "-o's values", 0, []string{"json", "yaml"}, nil)
	runCLI(t, nil, "__complete", "create", "cluster", "dev", "--").
		expect(t, "create cluster's flags", 0, []string{"--workers\t", "--node-image\t", "--kubernetes-version\t", "--state-dir\t"}, nil)
}

// needRoot fails t at its start unless it runs as root, saying so: what
// it checks is what capl-dev does as root (the doctor's root check, a
// file chowned to SUDO_USER), and a skip would let a run that never
// checked it pass.
func needRoot(t *testing.T, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		t.Fatalf("this test needs root (%s); it runs as uid %d: run it as root (sudo make test)", why, os.Geteuid())
	}
}

// deadSocket returns the path of a unix socket nobody listens on: bound,
// then closed, so that connecting is refused (as with a libvirtd that
// died and left its socket).
func deadSocket(t *testing.T) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), "libvirt-sock")
	l, err := net.Listen("unix", path)
	must(t, err)
	l.(*net.UnixListener).SetUnlinkOnClose(false)
	must(t, l.Close())
	return path
}

// TestDeadLibvirtdSaidWithinSeconds: with a libvirt URI whose socket
// nobody listens on, doctor, up and the commands that need libvirt say
// that libvirtd does not answer, how to start it, within seconds; up
// starts nothing.
func TestDeadLibvirtdSaidWithinSeconds(t *testing.T) {
	needRoot(t, "libvirtd must be the only check that fails, and the root check fails for another user")
	uri := "qemu+unix:///system?socket=" + deadSocket(t)
	state := t.TempDir()
	for _, args := range [][]string{
		{"doctor", "--no-demo"},
		{"doctor"},
		{"up", "--no-demo"},
		{"up"},
	} {
		args = append(args, "--libvirt-uri="+uri, "--state-dir="+state)
		r := runCLI(t, nil, args...)
		what := strings.Join(args[:len(args)-2], " ")
		r.expect(t, what, 1, []string{"FAIL", "libvirtd does not answer at " + uri, "Connection refused", "libvirtd -d"}, []string{"the host is not ready: libvirtd"})
		if r.took > 15*time.Second {
			t.Errorf("%s took %s to tell libvirtd is down", what, r.took.Round(time.Second))
		}
		t.Logf("%s: %s", what, r.took.Round(10*time.Millisecond))
	}
	if _, err := os.Stat(filepath.Join(state, "serve.pid")); err == nil {
		t.Error("up started a plane with libvirtd down")
	}
}

// TestCommandsNeedARunningPlane: without a plane, the commands that read
// it say so and name the commands that start one.
func TestCommandsNeedARunningPlane(t *testing.T) {
	state := t.TempDir()
	for _, args := range [][]string{
		{"status"}, {"get", "clusters"}, {"get", "nodes"}, {"get", "kubeconfig", "demo"}, {"create", "cluster", "x"},
		{"delete", "cluster", "x"}, {"exec", "node", "--", "true"}, {"load", "image", "x.tar"}, {"stop"},
	} {
		// Before the command: exec's flags end at its NODE.
		r := runCLI(t, nil, append([]string{"--state-dir=" + state}, args...)...)
		r.expect(t, strings.Join(args, " "), 1, nil, []string{"the management plane is not running in " + state, "capl-dev up --no-demo --state-dir=" + state})
	}
}

// TestRender prints the cluster up would make, for a management cluster
// of one's own: the template's objects and the CNI's, from the image
// files of --image-dir; and the stand-in cluster's.
func TestRender(t *testing.T) {
	images := t.TempDir()
	for _, f := range []string{"capl-node-v1.36.3.qcow2", "capl-debian-12.qcow2", "capl-debian-12-haproxy.qcow2"} {
		must(t, os.WriteFile(filepath.Join(images, f), []byte(f), 0o600))
	}
	templates := filepath.Join("..", "..", "templates")
	runCLI(t, nil, "render", "--image-dir="+images, "--domain-type=kvm", "--name=r1", "--control-plane=3", "--workers=2",
		"--template="+filepath.Join(templates, "cluster-template.yaml"), "--cni="+filepath.Join(templates, "cni-flannel.yaml")).
		expect(t, "render", 0, []string{"kind: Cluster\n", "kind: LibvirtCluster", "kind: KubeadmControlPlane", "replicas: 3", "replicas: 2",
			"kind: ClusterResourceSet", "name: r1", "capl-image-sha256-"}, nil)
	runCLI(t, nil, "render", "--stand-in", "--image-dir="+images, "--domain-type=qemu").
		expect(t, "render --stand-in", 0, []string{"kind: LibvirtMachineTemplate", "file://" + images}, nil)
	runCLI(t, nil, "render", "--image-dir="+t.TempDir(), "--domain-type=kvm").
		expect(t, "render without images", 1, nil, []string{"make images node-image"})
}

// TestVersion: version prints the release, the commit and the commit's
// time the build set (-ldflags -X, as make build sets them), as a line
// and as JSON and YAML; a plain go build says what Go recorded (with
// -buildvcs=false nothing: "unknown"), never an empty field.
func TestVersion(t *testing.T) {
	plain := runCLI(t, nil, "version")
	plain.expect(t, "version of go build", 0, nil, nil)
	if !regexp.MustCompile(`^capl-dev \S+ \(commit \S+, committed \S+, go1\.\S+, \w+/\w+\)\n$`).MatchString(plain.stdout) {
		t.Errorf("version of go build: %q", plain.stdout)
	}

	pkg := "github.com/capi-libvirt/cluster-api-provider-libvirt/internal/version"
	bin := filepath.Join(t.TempDir(), "capl-dev")
	ldflags := "-X " + pkg + ".gitVersion=v9.8.7 -X " + pkg + ".gitCommit=0123456789abcdef -X " + pkg + ".buildDate=2026-11-29T01:02:03Z"
	cmd := exec.Command(goPath(t), "build", "-ldflags", ldflags, "-o", bin, ".")
	if out, err := cmd.CombinedOutput(); err != nil {
		t.Fatalf("go build -ldflags: %v\n%s", err, out)
	}
	run := func(args ...string) string {
		t.Helper()
		out, err := exec.Command(bin, args...).Output()
		if err != nil {
			t.Fatalf("capl-dev %s: %v", strings.Join(args, " "), err)
		}
		return string(out)
	}
	if got := run("version"); !strings.HasPrefix(got, "capl-dev v9.8.7 (commit 0123456789abcdef, committed 2026-11-29T01:02:03Z, go1.") {
		t.Errorf("version: %q", got)
	}
	var v struct{ Version, GitCommit, BuildDate, GoVersion, Platform string }
	must(t, json.Unmarshal([]byte(run("version", "-o", "json")), &v))
	if v.Version != "v9.8.7" || v.GitCommit != "0123456789abcdef" || v.BuildDate != "2026-11-29T01:02:03Z" || v.Platform != runtime.GOOS+"/"+runtime.GOARCH {
		t.Errorf("version -o json: %+v", v)
	}
	if got := run("version", "-o", "yaml"); !strings.Contains(got, "version: v9.8.7\n") || !strings.Contains(got, "gitCommit: 0123456789abcdef\n") {
		t.Errorf("version -o yaml:\n%s", got)
	}
}
