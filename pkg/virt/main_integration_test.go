package virt_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// TestMain asserts, after every test of the package ran its cleanups, that
// nothing this test binary created is left on the host.
func TestMain(m *testing.M) {
	code := m.Run()
	if uri := os.Getenv(testlibvirt.EnvURI); uri != "" && code == 0 {
		if err := checkNothingOwned(uri); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			code = 1
		}
	}
	os.Exit(code)
}

func checkNothingOwned(uri string) error {
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := virt.Dial(ctx, uri)
	if err != nil {
		return err
	}
	defer c.Close()
	return testlibvirt.CheckNothingOwned(ctx, c)
}
