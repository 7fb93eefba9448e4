package loadbalancer

import (
	"context"
	"errors"
	"os"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// fakeVM plays an HAProxy VM behind the guest agent: files, haproxy -c,
// mv, systemctl reload and the stats socket; the rest is fakehost's.
type fakeVM struct {
	fakehost.Host
	files map[string][]byte
	// running is the description of the running configuration; pending
	// the one a reload is starting.
	running, pending string
	// invalid makes haproxy -c fail; reloadIgnored makes reloads do nothing;
	// lagPolls is how many stats reads after a reload still see the old ID.
	invalid, reloadIgnored bool
	lagPolls               int
	calls                  []string
}

var descriptionRE = regexp.MustCompile(`(?m)^  description (\S+)$`)

func (f *fakeVM) GuestWriteFile(_ context.Context, _, path string, data []byte, _ os.FileMode) error {
	f.calls = append(f.calls, "write "+path)
	f.files[path] = data
	return nil
}

func (f *fakeVM) GuestExec(_ context.Context, _, path string, args []string, _ []byte) (virt.ExecResult, error) {
	if path == "/bin/bash" {
		f.calls = append(f.calls, "stats "+args[len(args)-1])
	}
	switch {
	case path == "/bin/sh" && args[1] == applyScript:
		staged, live := args[3], args[4]
		f.calls = append(f.calls, "haproxy -c "+staged)
		if f.invalid {
			return virt.ExecResult{ExitCode: exitInvalid, Stderr: []byte("[ALERT] parsing error")}, nil
		}
		f.calls = append(f.calls, "mv "+staged+" "+live, "systemctl reload-or-restart haproxy.service")
		f.files[live] = f.files[staged]
		delete(f.files, staged)
		if m := descriptionRE.FindSubmatch(f.files[live]); m != nil && !f.reloadIgnored {
			f.pending = string(m[1])
		}
	case path == "/bin/bash":
		if f.lagPolls > 0 {
			f.lagPolls-- // the old worker still answers
		} else if f.pending != "" {
			f.running, f.pending = f.pending, ""
		}
		if f.running == "" {
			return virt.ExecResult{ExitCode: 3, Stderr: []byte("connection refused")}, nil
		}
		return virt.ExecResult{Stdout: []byte("Name: HAProxy\ndescription: " + f.running + "\n")}, nil
	case path == "journalctl":
		return virt.ExecResult{Stdout: []byte("Proxy control-plane started.")}, nil
	}
	return virt.ExecResult{}, nil
}

func TestApply(t *testing.T) {
	confirmPoll, confirmTimeout = time.Millisecond, 50*time.Millisecond
	cfg, id, err := Config{FrontendPort: 6443, BackendPort: 6443}.Render()
	if err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		vm      *fakeVM
		wantErr any
		// wantCalls are the calls in order, up to the first stats read
		// after the reload.
		wantCalls []string
		live      bool // the new configuration is in place afterwards
	}{{
		name: "written, checked, moved, reloaded, confirmed",
		vm:   &fakeVM{},
		wantCalls: []string{
			"write " + stagedPath, "haproxy -c " + stagedPath, "mv " + stagedPath + " " + ConfigPath,
			"systemctl reload-or-restart haproxy.service", "stats show info",
		},
		live: true,
	}, {
		name: "the new worker shows up after a few polls",
		vm:   &fakeVM{running: idPrefix + "old", lagPolls: 3},
		live: true,
	}, {
		name:      "an invalid configuration is never moved into place or reloaded",
		vm:        &fakeVM{invalid: true},
		wantErr:   new(*ConfigInvalidError),
		wantCalls: []string{"write " + stagedPath, "haproxy -c " + stagedPath},
	}, {
		name:    "a reload that does not take effect is reported with the log",
		vm:      &fakeVM{running: idPrefix + "old", reloadIgnored: true},
		wantErr: new(*ReloadError),
		live:    true,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tt.vm.files = map[string][]byte{ConfigPath: []byte("# Debian's default\n")}
			err := Apply(context.Background(), tt.vm, "lb", cfg, id)
			switch target := tt.wantErr.(type) {
			case nil:
				if err != nil {
					t.Fatal(err)
				}
				if tt.vm.running != id {
					t.Errorf("running %q, want %q", tt.vm.running, id)
				}
			case **ConfigInvalidError:
				if !errors.As(err, target) || !strings.Contains(err.Error(), "parsing error") {
					t.Fatalf("err = %v", err)
				}
			case **ReloadError:
				if !errors.As(err, target) || !strings.Contains(err.Error(), "Proxy control-plane started.") {
					t.Fatalf("err = %v", err)
				}
			}
			if got := string(tt.vm.files[ConfigPath]); (got == string(cfg)) != tt.live {
				t.Errorf("live configuration replaced = %v, want %v", got == string(cfg), tt.live)
			}
			if tt.wantCalls != nil && strings.Join(tt.vm.calls[:min(len(tt.vm.calls), len(tt.wantCalls))], "\n") != strings.Join(tt.wantCalls, "\n") {
				t.Errorf("calls:\n%s\nwant:\n%s", strings.Join(tt.vm.calls, "\n"), strings.Join(tt.wantCalls, "\n"))
			}
		})
	}
}

func TestRunningConfigID(t *testing.T) {
	vm := &fakeVM{files: map[string][]byte{}}
	if id, err := RunningConfigID(context.Background(), vm, "lb"); err != nil || id != "" {
		t.Errorf("with no stats socket: %q, %v; want \"\", nil", id, err)
	}
	vm.running = idPrefix + "abc"
	if id, err := RunningConfigID(context.Background(), vm, "lb"); err != nil || id != idPrefix+"abc" {
		t.Errorf("got %q, %v", id, err)
	}
}
