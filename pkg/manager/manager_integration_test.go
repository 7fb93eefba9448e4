package manager_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testlibvirt"
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
	cancel()
	if err := <-done; err != nil && !errors.Is(err, context.Canceled) {
		t.Fatalf("manager stopped with %v", err)
	}
}

func TestHostNameFromURI(t *testing.T) {
	if got := manager.HostNameFromURI("qemu+ssh://root@kvm1.example:2222/system"); got != "kvm1.example" {
		t.Errorf("remote host = %q", got)
	}
	if got := manager.HostNameFromURI("qemu:///system"); got == "" {
		t.Error("local host name is empty")
	}
}
