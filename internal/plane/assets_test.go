package plane

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

func TestFindAssets(t *testing.T) {
	tests := []struct {
		name string
		// files maps each binary written to its mode; a binary not listed is absent.
		files       map[string]os.FileMode
		wantMissing []string
	}{
		{name: "all four", files: map[string]os.FileMode{"kube-apiserver": 0o755, "etcd": 0o755, "kube-controller-manager": 0o755, "kubectl": 0o755}},
		{name: "kubectl missing", files: map[string]os.FileMode{"kube-apiserver": 0o755, "etcd": 0o755, "kube-controller-manager": 0o755},
			wantMissing: []string{"kubectl"}},
		{name: "etcd not executable", files: map[string]os.FileMode{"kube-apiserver": 0o755, "etcd": 0o644, "kube-controller-manager": 0o755, "kubectl": 0o755},
			wantMissing: []string{"etcd"}},
		{name: "empty", files: nil, wantMissing: AssetBinaries},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			for name, mode := range tt.files {
				if err := os.WriteFile(filepath.Join(dir, name), []byte("#!/bin/sh\n"), mode); err != nil {
					t.Fatal(err)
				}
			}
			// An explicit directory is the only one tried, whatever the environment says.
			t.Setenv(AssetsEnv, t.TempDir())
			got, err := FindAssets(dir)
			if len(tt.wantMissing) == 0 {
				if err != nil || got != dir {
					t.Fatalf("FindAssets = %q, %v; want %q", got, err, dir)
				}
				return
			}
			if !errors.Is(err, ErrNoAssets) {
				t.Fatalf("FindAssets = %q, %v; want ErrNoAssets", got, err)
			}
			for _, b := range tt.wantMissing {
				if !strings.Contains(err.Error(), b) {
					t.Errorf("the error does not name the missing %s: %v", b, err)
				}
			}
			if !strings.Contains(err.Error(), "make envtest") {
				t.Errorf("the error does not say how to build them: %v", err)
			}
		})
	}
}

// TestManifestsEmbedded: every CRD and webhook configuration the plane
// installs comes from the binary, not from a checkout.
func TestManifestsEmbedded(t *testing.T) {
	for _, dir := range []string{providerManifests, clusterAPICoreManifests} {
		crds, err := crdsIn(dir)
		if err != nil || len(crds) == 0 {
			t.Errorf("%s: %d CRDs, %v", dir, len(crds), err)
		}
	}
	for _, dir := range []string{kubeadmControlPlaneManifests, kubeadmBootstrapManifests} {
		crds, err := labelledCRDs(dir)
		if err != nil || len(crds) != 2 {
			t.Fatalf("%s: %d CRDs, %v; want 2", dir, len(crds), err)
		}
		for _, c := range crds {
			if c.Labels["cluster.x-k8s.io/v1beta2"] != "v1beta2" {
				t.Errorf("%s: CRD %s lacks the contract label its kustomization adds: %v", dir, c.Name, c.Labels)
			}
		}
	}
	for _, dir := range []string{providerManifests, clusterAPICoreManifests, kubeadmControlPlaneManifests, kubeadmBootstrapManifests} {
		objs, err := webhookConfigurationsIn(dir)
		if err != nil || len(objs) == 0 {
			t.Errorf("%s: %d webhook configurations, %v", dir, len(objs), err)
		}
	}
}
