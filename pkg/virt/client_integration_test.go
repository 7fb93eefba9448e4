package virt_test

import (
	"context"
	"errors"
	"path/filepath"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestDialAndClose(t *testing.T) {
	uri := testlibvirt.URI(t)
	c := testlibvirt.Client(t, uri)
	if c.URI() != uri {
		t.Fatalf("URI() = %q, want %q", c.URI(), uri)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if _, err := c.DomainInfo(ctx, "capltest-doesnotexist"); err == nil {
		t.Fatal("DomainInfo of a missing domain succeeded")
	}
	if err := c.Close(); err != nil {
		t.Fatal(err)
	}
	if err := c.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
}

// TestEndedContextMakesNoCall: a call whose context ended (a manager
// shutting down, whose workers finish what they picked up) fails at once
// and creates nothing, although libvirt's calls take no context.
func TestEndedContextMakesNoCall(t *testing.T) {
	uri := testlibvirt.URI(t)
	c := testlibvirt.Client(t, uri)
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	name := testlibvirt.Name(t)
	err := c.EnsurePool(ctx, virt.PoolSpec{Name: name, Path: filepath.Join(testlibvirt.PoolRoot, name)})
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("EnsurePool with an ended context = %v, want context.Canceled", err)
	}
	live, cancelLive := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancelLive()
	if _, err := c.VolumeInfo(live, name, "x"); !virt.IsNotFound(err) {
		t.Errorf("pool %s exists after the refused call (%v)", name, err)
	}
}
