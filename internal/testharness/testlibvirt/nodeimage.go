package testlibvirt

import (
	"os"
	"testing"
)

// EnvNodeImage names the path of the Kubernetes node image (`make
// node-image`); `make test` sets it.
const EnvNodeImage = "CAPL_TEST_NODE_IMAGE"

// NodeImage returns the path of the Kubernetes node image. Unlike Image it
// fails t when unset: the node image is what the product boots, and a run
// that silently skipped its test would prove nothing about it.
func NodeImage(t testing.TB) string {
	t.Helper()
	img := os.Getenv(EnvNodeImage)
	if img == "" {
		t.Fatalf("%s is not set: run the test through `make test`, which builds the node image", EnvNodeImage)
	}
	if _, err := os.Stat(img); err != nil {
		t.Fatalf("node image: %v (build it with `make node-image`)", err)
	}
	return img
}
