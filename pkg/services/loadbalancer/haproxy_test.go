package loadbalancer

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

func backend(machine, address string, state infrav1.BackendState) infrav1.LoadBalancerBackend {
	return infrav1.LoadBalancerBackend{Machine: machine, Address: address, State: state}
}

func TestRender(t *testing.T) {
	two := []infrav1.LoadBalancerBackend{
		backend("cp-0", "192.168.150.10", infrav1.BackendActive),
		backend("cp-1", "192.168.150.11", infrav1.BackendDraining),
	}
	tests := []struct {
		name      string
		cfg       Config
		want      []string
		wantNot   []string
		sameIDAs  *Config
		otherIDAs *Config
	}{{
		name:    "no backends yet: the frontend listens, the backend is empty",
		cfg:     Config{FrontendPort: 6443, BackendPort: 6443},
		want:    []string{"bind *:6443", "backend control-plane", "stats socket ipv4@127.0.0.1:9000 level user"},
		wantNot: []string{"  server "},
	}, {
		name: "active and draining servers, TLS health check of /readyz",
		cfg:  Config{FrontendPort: 6443, BackendPort: 6443, Backends: two},
		want: []string{
			"server cp-0 192.168.150.10:6443 weight 1",
			"server cp-1 192.168.150.11:6443 weight 0",
			"option httpchk GET /readyz",
			"default-server check check-ssl verify none inter 2s fall 2 rise 2",
			"use_backend control-plane-unchecked if { nbsrv(control-plane) eq 0 }",
			"backend control-plane-unchecked\n  balance roundrobin\n  server cp-0 192.168.150.10:6443 weight 1\n  server cp-1 192.168.150.11:6443 weight 0\n",
		},
	}, {
		name: "frontend and backend ports differ",
		cfg:  Config{FrontendPort: 443, BackendPort: 8443, Backends: two[:1]},
		want: []string{"bind *:443", "server cp-0 192.168.150.10:8443 weight 1"},
	}, {
		name:     "same input, same ID",
		cfg:      Config{FrontendPort: 6443, BackendPort: 6443, Backends: two},
		sameIDAs: &Config{FrontendPort: 6443, BackendPort: 6443, Backends: append([]infrav1.LoadBalancerBackend(nil), two...)},
	}, {
		name:      "a drained backend changes the ID",
		cfg:       Config{FrontendPort: 6443, BackendPort: 6443, Backends: two},
		otherIDAs: &Config{FrontendPort: 6443, BackendPort: 6443, Backends: []infrav1.LoadBalancerBackend{two[0], backend("cp-1", "192.168.150.11", infrav1.BackendActive)}},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			out, id, err := tt.cfg.Render()
			if err != nil {
				t.Fatal(err)
			}
			text := string(out)
			if !strings.HasPrefix(id, idPrefix) || !strings.Contains(text, "  description "+id+"\n") {
				t.Errorf("ID %q not in the global description:\n%s", id, text)
			}
			for _, w := range tt.want {
				if !strings.Contains(text, w) {
					t.Errorf("missing %q in:\n%s", w, text)
				}
			}
			for _, w := range tt.wantNot {
				if strings.Contains(text, w) {
					t.Errorf("unexpected %q in:\n%s", w, text)
				}
			}
			if tt.sameIDAs != nil {
				if _, other, _ := tt.sameIDAs.Render(); other != id {
					t.Errorf("IDs differ: %s, %s", id, other)
				}
			}
			if tt.otherIDAs != nil {
				if _, other, _ := tt.otherIDAs.Render(); other == id {
					t.Errorf("IDs equal: %s", id)
				}
			}
			checkWithHAProxy(t, out)
		})
	}
}

// checkWithHAProxy runs the host's haproxy (the VM image's version, which
// hack/prepare-host.sh installs) over the configuration.
func checkWithHAProxy(t *testing.T, cfg []byte) {
	t.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		t.Logf("no haproxy on this host: configuration not checked (%v)", err)
		return
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, cfg, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(bin, "-c", "-q", "-f", path).CombinedOutput(); err != nil {
		t.Errorf("haproxy -c: %v: %s\n%s", err, out, cfg)
	}
}

func TestStates(t *testing.T) {
	tests := []struct {
		name  string
		cands []candidate
		want  map[string]infrav1.BackendState
	}{{
		name:  "all active",
		cands: []candidate{{machine: "b", address: "10.0.0.2"}, {machine: "a", address: "10.0.0.1"}},
		want:  map[string]infrav1.BackendState{"a": infrav1.BackendActive, "b": infrav1.BackendActive},
	}, {
		name:  "a deleting machine drains while another takes connections",
		cands: []candidate{{machine: "a", address: "10.0.0.1", deleting: true}, {machine: "b", address: "10.0.0.2"}},
		want:  map[string]infrav1.BackendState{"a": infrav1.BackendDraining, "b": infrav1.BackendActive},
	}, {
		name:  "the last API server is not drained",
		cands: []candidate{{machine: "a", address: "10.0.0.1", deleting: true}},
		want:  map[string]infrav1.BackendState{"a": infrav1.BackendActive},
	}, {
		name:  "all deleting: none drained",
		cands: []candidate{{machine: "a", address: "10.0.0.1", deleting: true}, {machine: "b", address: "10.0.0.2", deleting: true}},
		want:  map[string]infrav1.BackendState{"a": infrav1.BackendActive, "b": infrav1.BackendActive},
	}, {
		name: "none",
		want: map[string]infrav1.BackendState{},
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got := states(tt.cands)
			if len(got) != len(tt.want) {
				t.Fatalf("got %v", got)
			}
			for i, b := range got {
				if i > 0 && got[i-1].Machine >= b.Machine {
					t.Errorf("not sorted: %v", got)
				}
				if tt.want[b.Machine] != b.State {
					t.Errorf("%s: %s, want %s", b.Machine, b.State, tt.want[b.Machine])
				}
			}
		})
	}
}

func TestParseInfo(t *testing.T) {
	out := "Name: HAProxy\nVersion: 2.6.12-1+deb12u4\nPid: 812\nUptime_sec: 77\ndescription: capl-config-0123\nnode: lb\n\n"
	info := ParseInfo(out)
	if info["Pid"] != "812" || info["description"] != "capl-config-0123" || info["Version"] != "2.6.12-1+deb12u4" {
		t.Errorf("ParseInfo = %v", info)
	}
}

func TestNotServingReason(t *testing.T) {
	now := time.Date(2026, 11, 24, 1, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name  string
		since time.Time
		want  string
	}{
		{"never False before", time.Time{}, infrav1.WaitingForLoadBalancerReason},
		{"booting", now.Add(-3 * time.Minute), infrav1.WaitingForLoadBalancerReason},
		{"at the bound", now.Add(-servingBound), infrav1.WaitingForLoadBalancerReason},
		{"past the bound", now.Add(-servingBound - time.Second), infrav1.LoadBalancerNotServingReason},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := notServingReason(tc.since, now, servingBound); got != tc.want {
				t.Errorf("notServingReason = %s, want %s", got, tc.want)
			}
		})
	}
}

// TestEveryServerFailingItsCheckStillForwards runs the host's haproxy with
// the rendered configuration in front of an API server stand-in whose
// /readyz always fails: once HAProxy has marked the only server down,
// connections through the frontend must still reach it.
func TestEveryServerFailingItsCheckStillForwards(t *testing.T) {
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		testprereq.Missing(t, "no haproxy on this host (hack/prepare-host.sh installs it): %v", err)
	}
	var checks atomic.Int32
	api := httptest.NewTLSServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/readyz" {
			checks.Add(1)
			http.Error(w, "[-]etcd failed", http.StatusInternalServerError)
			return
		}
		_, _ = io.WriteString(w, "served")
	}))
	t.Cleanup(api.Close)
	apiAddr := api.Listener.Addr().(*net.TCPAddr)
	front := freePort(t)
	cfg, _, err := Config{FrontendPort: int32(front), BackendPort: int32(apiAddr.Port),
		Backends: []infrav1.LoadBalancerBackend{backend("cp-0", "127.0.0.1", infrav1.BackendActive)}}.Render()
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, withoutVMGlobals(cfg), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cmd := exec.CommandContext(ctx, bin, "-db", "-f", path)
	var logs strings.Builder
	cmd.Stdout, cmd.Stderr = &logs, &logs
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); _ = cmd.Wait() })

	// fall 2 at inter 2s: down after the second failed check.
	deadline := time.Now().Add(30 * time.Second)
	for checks.Load() < checkFall+1 {
		if time.Now().After(deadline) {
			t.Fatalf("haproxy ran %d health checks in 30 s; its output:\n%s", checks.Load(), logs.String())
		}
		time.Sleep(100 * time.Millisecond)
	}
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, DisableKeepAlives: true, //nolint:gosec // a test server's own certificate
	}}
	for i := range 3 {
		resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/version", front))
		if err != nil {
			t.Fatalf("request %d through the frontend with the server marked down: %v\nhaproxy:\n%s", i, err, logs.String())
		}
		body, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if string(body) != "served" {
			t.Fatalf("request %d: got %q", i, body)
		}
	}
}

// withoutVMGlobals drops the global settings that only fit the VM (chroot,
// user, daemon mode, syslog, stats sockets) so the host's haproxy can run
// the configuration unprivileged in the foreground.
func withoutVMGlobals(cfg []byte) []byte {
	var out []string
	for _, line := range strings.Split(string(cfg), "\n") {
		f := strings.Fields(line)
		if len(f) > 0 && slices.Contains([]string{"chroot", "user", "group", "daemon", "log", "stats"}, f[0]) {
			continue
		}
		out = append(out, line)
	}
	return []byte(strings.Join(out, "\n"))
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// TestNotServingSinceIsKeptUntilServing: the first check that finds the
// endpoint closed records when, later ones keep it (LoadBalancerNotServing
// counts from it), and a check that connects clears it.
func TestNotServingSinceIsKeptUntilServing(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().(*net.TCPAddr)
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-infra"}}
	lc.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "127.0.0.1", Port: int32(addr.Port)}
	s, err := scope.NewClusterScope(scope.ClusterScopeParams{Client: fakeClient(t, lc), LibvirtCluster: lc, Host: noHost{}})
	if err != nil {
		t.Fatal(err)
	}
	c := configSync{svc: New(s, nil, tenancy.Policy{}), vm: s.LoadBalancerVM()}
	_ = c.notServing("closed", nil)
	first := s.LoadBalancerStatus().NotServingSince
	if first == nil {
		t.Fatal("notServingSince not recorded")
	}
	_ = c.notServing("still closed", nil)
	if got := s.LoadBalancerStatus().NotServingSince; got == nil || !got.Equal(first) {
		t.Errorf("notServingSince moved from %v to %v: the bound would never pass", first, got)
	}
	if _, err := c.serving(); err != nil {
		t.Fatal(err)
	}
	if got := s.LoadBalancerStatus().NotServingSince; got != nil {
		t.Errorf("notServingSince %v after the endpoint served", got)
	}
	_ = ln.Close()
}
