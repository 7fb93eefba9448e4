package main

import (
	"bufio"
	"context"
	"encoding/json"
	"os"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
)

// runMainEnv makes the test binary run main instead of the tests, so that
// TestJSONLogs runs the manager's own flag parsing and logger setup.
const runMainEnv = "CAPL_TEST_RUN_MANAGER_MAIN"

func TestMain(m *testing.M) {
	if os.Getenv(runMainEnv) == "1" {
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// TestJSONLogs runs the manager with --logging-format=json, as Cluster
// API providers are run, against an API server and the test:/// libvirt
// driver, and expects every log line to be a JSON object with a msg, up to
// "Starting manager", logged once the manager is built.
func TestJSONLogs(t *testing.T) {
	if testing.Short() && !testprereq.InCI() {
		t.Skip("integration test: not run with -short outside CI")
	}
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	dir := t.TempDir()
	kubeconfig := env.Kubeconfig
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	cmd := exec.CommandContext(ctx, os.Args[0], "--logging-format=json", "--libvirt-uri=test:///default",
		"--kubeconfig="+kubeconfig, "--health-addr=127.0.0.1:0", "--diagnostics-address=127.0.0.1:0",
		"--webhook-port=0", "--webhook-cert-dir="+dir)
	cmd.Env = append(os.Environ(), runMainEnv+"=1")
	out, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	cmd.Stderr = cmd.Stdout
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }()

	var seen []string
	lines := bufio.NewScanner(out)
	for lines.Scan() {
		line := lines.Text()
		seen = append(seen, line)
		var entry map[string]any
		if err := json.Unmarshal([]byte(line), &entry); err != nil {
			t.Fatalf("log line is not JSON (%v): %s\nwhole output:\n%s", err, line, strings.Join(seen, "\n"))
		}
		if _, ok := entry["msg"].(string); !ok {
			t.Fatalf("JSON log line without msg: %s", line)
		}
		if entry["msg"] == "Starting manager" {
			if entry["libvirtURI"] != "test:///default" {
				t.Errorf("Starting manager logged libvirtURI %v, want test:///default", entry["libvirtURI"])
			}
			t.Logf("JSON log line: %s", line)
			return
		}
	}
	t.Fatalf("the manager exited (%v) without logging \"Starting manager\"; output:\n%s", cmd.Wait(), strings.Join(seen, "\n"))
}
