package virt_test

import (
	"context"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
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
