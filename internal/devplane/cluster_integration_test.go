package devplane

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
)

// TestSeedImages imports the image directory's node and HAProxy images
// into the cluster's pool through a real libvirtd, as `make up` and the
// kubeadm e2e do: the import's source policy allows the image directory
// and nothing else.
func TestSeedImages(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	uri := os.Getenv(testlibvirt.EnvURI)
	if uri == "" {
		t.Fatalf("%s is unset: run through `make test`", testlibvirt.EnvURI)
	}
	host := testlibvirt.Client(t, uri)
	pool := testlibvirt.Name(t)
	t.Cleanup(func() {
		if err := testlibvirt.DestroyPool(uri, pool); err != nil {
			t.Errorf("removing pool %s: %v", pool, err)
		}
	})
	dir := t.TempDir()
	o := ClusterOptions{StoragePool: pool, ImageDir: dir, KubernetesVersion: "v1.0.0"}
	for _, f := range []string{NodeImageFileFor(o.KubernetesVersion), HAProxyImageFile} {
		if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", filepath.Join(dir, f), "16M").CombinedOutput(); err != nil {
			t.Fatalf("qemu-img create: %v: %s", err, out)
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	imgs, err := SeedImages(ctx, host, o)
	must(t, err)
	for _, img := range []ClusterImage{imgs.Node, imgs.LoadBalancer} {
		info, err := host.VolumeInfo(ctx, pool, img.Volume)
		if err != nil {
			t.Errorf("%s imported as %s/%s: %v", img.Path, pool, img.Volume, err)
			continue
		}
		if info.Format != "qcow2" {
			t.Errorf("%s/%s has format %q, want qcow2", pool, img.Volume, info.Format)
		}
	}
	// Seeding again finds the images in place.
	_, err = SeedImages(ctx, host, o)
	must(t, err)
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
