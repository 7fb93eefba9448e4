package virt_test

import (
	"fmt"
	"os"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testlibvirt"
)

// TestMain asserts, after every test of the package ran its cleanups, that
// nothing this test binary created is left on the host.
func TestMain(m *testing.M) {
	code := m.Run()
	if uri := os.Getenv(testlibvirt.EnvURI); uri != "" && code == 0 {
		if err := testlibvirt.CheckNothingOwned(uri); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			code = 1
		}
	}
	os.Exit(code)
}
