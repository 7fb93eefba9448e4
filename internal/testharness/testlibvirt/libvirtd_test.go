package testlibvirt

import (
	"fmt"
	"os"
	"os/exec"
	"testing"
	"time"
)

func TestProcessDeadByState(t *testing.T) {
	// A child that exited but was not waited for is a zombie: /proc/<pid>
	// stays, its state is Z.
	cmd := exec.Command("true")
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	pid := cmd.Process.Pid
	t.Cleanup(func() { _ = cmd.Wait() })
	deadline := time.Now().Add(10 * time.Second)
	for {
		dead, state, err := ProcessDead(pid)
		if err != nil {
			t.Fatal(err)
		}
		if dead {
			if _, err := os.Stat(fmt.Sprintf("/proc/%d", pid)); err != nil {
				t.Fatalf("/proc/%d is gone (%v): the child was reaped, so this proves nothing about zombies", pid, err)
			}
			t.Logf("zombie %d: state %s", pid, state)
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("exited child %d still has state %s", pid, state)
		}
		time.Sleep(10 * time.Millisecond)
	}
	if dead, state, err := ProcessDead(os.Getpid()); err != nil || dead {
		t.Errorf("this test process: dead %v, state %s, error %v", dead, state, err)
	}
	if err := cmd.Wait(); err != nil {
		t.Fatal(err)
	}
	if dead, state, err := ProcessDead(pid); err != nil || !dead || state != "gone" {
		t.Errorf("reaped child: dead %v, state %s, error %v", dead, state, err)
	}
}

func TestProcState(t *testing.T) {
	tests := []struct {
		stat, want string
		err        bool
	}{
		{"123 (libvirtd) S 1 123 123 0 -1", "S", false},
		{"123 (libvirtd) Z 1 123 123 0 -1", "Z", false},
		{"77 (a (weird) name) R 1 2 3", "R", false},
		{"77 (name with spaces) ) X 1", "X", false},
		{"garbage", "", true},
		{"12 (x)", "", true},
	}
	for _, tt := range tests {
		got, err := procState(tt.stat)
		if got != tt.want || (err != nil) != tt.err {
			t.Errorf("procState(%q) = %q, %v; want %q, error %v", tt.stat, got, err, tt.want, tt.err)
		}
	}
}
