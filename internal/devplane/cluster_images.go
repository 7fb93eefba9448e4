package devplane

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"io"
	"os"
	"path/filepath"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// ClusterImage is an image file of ClusterOptions.ImageDir and the volume
// it becomes in the cluster's pool.
type ClusterImage struct {
	// Path and SHA256 (hex) of the file.
	Path, SHA256 string
	// Volume is named as the provider names imported base images: after
	// the content, so an image rebuilt by `make node-image` gets a new
	// volume and Down removes them like any base image.
	Volume string
}

// ClusterImages are the node image and the load balancer's image.
type ClusterImages struct {
	Node, LoadBalancer ClusterImage
}

// NodeImagePath is the node image file of o: NodeImage, or the one of
// KubernetesVersion in ImageDir.
func (o ClusterOptions) NodeImagePath() string {
	if o.NodeImage != "" {
		return o.NodeImage
	}
	return filepath.Join(o.ImageDir, NodeImageFileFor(o.KubernetesVersion))
}

// ImageVolumes reads the node image (NodeImagePath) and the HAProxy image
// of o.ImageDir.
func ImageVolumes(o ClusterOptions) (ClusterImages, error) {
	node, err := clusterImage(filepath.Dir(o.NodeImagePath()), filepath.Base(o.NodeImagePath()))
	if err != nil {
		return ClusterImages{}, err
	}
	lb, err := clusterImage(o.ImageDir, HAProxyImageFile)
	return ClusterImages{Node: node, LoadBalancer: lb}, err
}

func clusterImage(dir, file string) (ClusterImage, error) {
	path := filepath.Join(dir, file)
	sum, err := fileSHA256(path)
	if err != nil {
		return ClusterImage{}, fmt.Errorf("cluster image: %w (build it with `make images node-image`)", err)
	}
	return ClusterImage{Path: path, SHA256: sum, Volume: naming.ImageVolumeName(sum)}, nil
}

// SeedImages imports the images of ImageVolumes into the cluster's storage
// pool, creating the pool. The template names its images as volumes, as
// image-builder users have them; this is how the one-host plane gets its
// files there. An image already imported is not copied again. Only files
// of o.ImageDir (and the node image's directory) are read: the import's
// source policy, the directories the caller names.
func SeedImages(ctx context.Context, host virt.Host, o ClusterOptions) (ClusterImages, error) {
	poolName, poolPath := o.pool()
	if err := host.EnsurePool(ctx, virt.PoolSpec{Name: poolName, Path: poolPath}); err != nil {
		return ClusterImages{}, err
	}
	imgs, err := ImageVolumes(o)
	if err != nil {
		return ClusterImages{}, err
	}
	for _, img := range []ClusterImage{imgs.Node, imgs.LoadBalancer} {
		if _, err := host.ImportImage(ctx, virt.ImageImport{Pool: poolName, Volume: img.Volume, Source: img.Path, SHA256: img.SHA256,
			Policy: virt.SourcePolicy{FileDirs: []string{o.ImageDir, filepath.Dir(o.NodeImagePath())}}}); err != nil {
			return ClusterImages{}, fmt.Errorf("importing %s into pool %s: %w", img.Path, poolName, err)
		}
	}
	return imgs, nil
}

func fileSHA256(path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		return "", fmt.Errorf("reading %s: %w", path, err)
	}
	return hex.EncodeToString(h.Sum(nil)), nil
}
