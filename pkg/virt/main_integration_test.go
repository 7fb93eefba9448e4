package virt_test

import (
	"os"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
)

// TestMain asserts, after every test of the package ran its cleanups, that
// nothing this test binary created is left on the host.
func TestMain(m *testing.M) {
	os.Exit(testlibvirt.RunChecked(m))
}
