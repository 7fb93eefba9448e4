package manager_test

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// TestNewDialsLibvirtAndRuns builds the manager exactly as the binary does
// (New dials the libvirt URI), runs it until its caches sync and stops it.
func TestNewDialsLibvirtAndRuns(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	uri := testlibvirt.URI(t)
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	opts, err := testenv.ProviderOptions(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	opts.LibvirtURI = uri
	metricsAddr := freeAddress(t)
	opts.Diagnostics.DiagnosticsAddress, opts.Diagnostics.InsecureDiagnostics = metricsAddr, true
	mgr, err := manager.New(env.Config, opts)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- mgr.Start(ctx) }()
	syncCtx, syncCancel := context.WithTimeout(ctx, time.Minute)
	defer syncCancel()
	if !mgr.GetCache().WaitForCacheSync(syncCtx) {
		t.Fatal("cache did not sync")
	}
	checkLibvirtMetricsServed(t, uri, metricsAddr)
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("manager stopped with %v", err)
	}
}

func TestHostNameFromURI(t *testing.T) {
	if got := hosts.HostName("qemu+ssh://root@kvm1.example:2222/system"); got != "kvm1.example" {
		t.Errorf("remote host = %q", got)
	}
	if got := hosts.HostName("qemu:///system"); got == "" {
		t.Error("local host name is empty")
	}
}

// checkLibvirtMetricsServed makes one libvirt call (the counters are
// process-wide) and expects the diagnostics endpoint to serve its count.
func checkLibvirtMetricsServed(t *testing.T, uri, addr string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c := testlibvirt.Client(t, uri)
	if _, err := c.DomainInfo(ctx, "capltest-metrics-probe"); err == nil {
		t.Fatal("DomainInfo of a missing domain succeeded")
	}
	want := `capl_libvirt_calls_total{operation="DomainInfo"}`
	var body string
	// The metrics server starts with the manager, maybe after the caches.
	for ctx.Err() == nil {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+addr+"/metrics", nil)
		if err != nil {
			t.Fatal(err)
		}
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			data, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			body = string(data)
			if rerr == nil && resp.StatusCode == http.StatusOK && strings.Contains(body, want) {
				return
			}
		}
		time.Sleep(200 * time.Millisecond)
	}
	t.Fatalf("/metrics on %s never served %s; last body:\n%s", addr, want, body)
}

// freeAddress returns a loopback address with a port free right now.
func freeAddress(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().String()
}
