package cli

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
)

// TestConditionsLine: True conditions by name, the others with reason
// and message on one line.
func TestConditionsLine(t *testing.T) {
	got := conditionsLine([]metav1.Condition{
		{Type: "Ready", Status: metav1.ConditionFalse, Reason: "WaitingForBootstrap", Message: "cloud-init\n  runs"},
		{Type: "DomainReady", Status: metav1.ConditionTrue, Reason: "Ready"},
		{Type: "AddressReserved", Status: metav1.ConditionTrue, Reason: "Ready"},
	})
	want := "conditions: DomainReady, AddressReserved True; Ready=False WaitingForBootstrap: cloud-init runs"
	if got != want {
		t.Errorf("got  %q\nwant %q", got, want)
	}
	if got := conditionsLine(nil); got != "conditions: none yet" {
		t.Errorf("no conditions: %q", got)
	}
}

// TestTreePrint draws the tree clusterctl describe draws.
func TestTreePrint(t *testing.T) {
	root := &node{text: "Cluster default/demo", details: []string{"conditions: Available True"}}
	cp := root.add(&node{text: "KubeadmControlPlane demo-control-plane"})
	cp.add(&node{text: "Machine m1", details: []string{"VM capl-default.m1: running"}})
	root.add(&node{text: "MachineDeployment demo-md-0", details: []string{"conditions: none yet"}})
	var out bytes.Buffer
	root.print(&out, "", "")
	want := `Cluster default/demo
│   conditions: Available True
├─KubeadmControlPlane demo-control-plane
│ └─Machine m1
│       VM capl-default.m1: running
└─MachineDeployment demo-md-0
      conditions: none yet
`
	if out.String() != want {
		t.Errorf("got\n%s\nwant\n%s", out.String(), want)
	}
}

// TestFindVM resolves the names a person may use for a VM.
func TestFindVM(t *testing.T) {
	vms := []guestVM{
		{Namespace: "default", Cluster: "a", Domain: "capl-default.a-cp-1", Names: []string{"a-cp-x1", "a-cp-x1", "a-cp-1", "capl-default.a-cp-1"}},
		{Namespace: "team", Cluster: "a", Domain: "capl-team.a-cp-1", Names: []string{"a-cp-1", "capl-team.a-cp-1"}},
		{Namespace: "default", Cluster: "a", Domain: "capl-default.a-lb", Names: []string{"capl-default.a-lb"}, LoadBalancer: true},
	}
	for _, tc := range []struct{ name, want, err string }{
		{"a-cp-x1", "capl-default.a-cp-1", ""},
		{"capl-team.a-cp-1", "capl-team.a-cp-1", ""},
		{"capl-default.a-lb", "capl-default.a-lb", ""},
		{"a-cp-1", "", "several VMs"},
		{"nope", "", "no VM named"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vm, err := findVM(vms, tc.name)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Errorf("error %v, want one saying %q", err, tc.err)
				}
				return
			}
			if err != nil || vm.Domain != tc.want {
				t.Errorf("got %s, %v; want %s", vm.Domain, err, tc.want)
			}
		})
	}
}

// TestStaleBinary tells a process running the file on disk from one
// whose file was rebuilt (modified after it started) or replaced.
func TestStaleBinary(t *testing.T) {
	sleep, err := exec.LookPath("sleep")
	if err != nil {
		t.Fatal(err)
	}
	data, err := os.ReadFile(sleep)
	if err != nil {
		t.Fatal(err)
	}
	bin := filepath.Join(t.TempDir(), "sleeper")
	if err := os.WriteFile(bin, data, 0o755); err != nil {
		t.Fatal(err)
	}
	// Written well before the process starts: not stale.
	past := time.Now().Add(-time.Hour)
	if err := os.Chtimes(bin, past, past); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(bin, "60")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	pid := cmd.Process.Pid
	// Wait until the process runs the file (not the test binary's fork).
	deadline := time.Now().Add(5 * time.Second)
	for {
		exe, _ := os.Readlink("/proc/" + strconv.Itoa(pid) + "/exe")
		if exe == bin || time.Now().After(deadline) {
			break
		}
		time.Sleep(10 * time.Millisecond)
	}
	if why := staleBinary(pid); why != "" {
		t.Errorf("fresh binary called stale: %s", why)
	}
	// go build touches an output that is up to date: same bytes, not stale.
	future := time.Now().Add(time.Hour)
	if err := os.Chtimes(bin, future, future); err != nil {
		t.Fatal(err)
	}
	if why := staleBinary(pid); why != "" {
		t.Errorf("binary touched, not changed: %q, want it current", why)
	}
	replace := func(contents []byte) {
		t.Helper()
		if err := os.WriteFile(bin+".new", contents, 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(bin+".new", bin); err != nil {
			t.Fatal(err)
		}
	}
	replace(data)
	if why := staleBinary(pid); why != "" {
		t.Errorf("binary replaced by the same bytes: %q, want it current", why)
	}
	replace(append(data, 0))
	if why := staleBinary(pid); !strings.Contains(why, "replaced") {
		t.Errorf("binary replaced by another build: %q, want it called replaced", why)
	}
	if err := os.Remove(bin); err != nil {
		t.Fatal(err)
	}
	if why := staleBinary(pid); !strings.Contains(why, "replaced") {
		t.Errorf("removed binary: %q, want it called replaced", why)
	}
	if why := staleBinary(1 << 30); why != "" {
		t.Errorf("no such process: %q", why)
	}
	started, err := processStart(os.Getpid())
	if err != nil || time.Since(started) < 0 || time.Since(started) > time.Hour {
		t.Errorf("this process started at %v (%v)", started, err)
	}
}

// TestStageWorkers: workers wait for the first control-plane node only
// in a new cluster that the command waits for, so a second run sets the
// replicas under TCG as under KVM.
func TestStageWorkers(t *testing.T) {
	for _, tc := range []struct {
		name              string
		tcg, exists, wait bool
		wantStaged        bool
	}{
		{"new under TCG", true, false, true, true},
		{"existing under TCG", true, true, true, false},
		{"new under TCG without waiting", true, false, false, false},
		{"new under KVM", false, false, true, false},
		{"existing under KVM", false, true, true, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			co := devplane.ClusterOptions{ControlPlane: 1, Workers: 2}
			if tc.tcg {
				co = co.TCGTuning()
			}
			got := stageWorkers(co, tc.exists, tc.wait)
			if got.StagedWorkers != tc.wantStaged {
				t.Errorf("staged %t, want %t", got.StagedWorkers, tc.wantStaged)
			}
			vars := devplane.ClusterVariables(got, devplane.ClusterImages{})
			want := "2"
			if tc.wantStaged {
				want = "0"
			}
			if vars["WORKER_MACHINE_COUNT"] != want {
				t.Errorf("WORKER_MACHINE_COUNT %s, want %s", vars["WORKER_MACHINE_COUNT"], want)
			}
		})
	}
}

// TestGuestCommandLine: exec's "--" after the VM's name is not the
// command.
func TestGuestCommandLine(t *testing.T) {
	for _, tc := range []struct {
		args     []string
		node     string
		argv     []string
		mistaken bool
	}{
		{[]string{"n1", "--", "cat", "/etc/hostname"}, "n1", []string{"cat", "/etc/hostname"}, false},
		{[]string{"n1", "cat", "/etc/hostname"}, "n1", []string{"cat", "/etc/hostname"}, false},
		{[]string{"n1", "--", "sh", "-c", "echo -- x"}, "n1", []string{"sh", "-c", "echo -- x"}, false},
		{[]string{"n1", "--", "--"}, "n1", []string{"--"}, false},
		{[]string{"n1", "--"}, "", nil, true},
		{[]string{"n1"}, "", nil, true},
	} {
		node, argv, err := guestCommandLine(tc.args)
		if tc.mistaken {
			if err == nil {
				t.Errorf("%q: no error", tc.args)
			}
			continue
		}
		if err != nil || node != tc.node || strings.Join(argv, "|") != strings.Join(tc.argv, "|") {
			t.Errorf("%q: %q %q %v, want %q %q", tc.args, node, argv, err, tc.node, tc.argv)
		}
	}
}
