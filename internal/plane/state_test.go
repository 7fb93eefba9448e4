package plane

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestScopeContains(t *testing.T) {
	s := Scope{Namespaces: []string{"default"}, Pools: []string{"capi-libvirt"}}
	for _, tc := range []struct {
		obj  virt.OwnedObject
		want bool
	}{
		{virt.OwnedObject{Kind: virt.OwnedDomain, Name: "capl-default.demo-control-plane-0", Owner: &virt.Owner{Namespace: "default"}}, true},
		{virt.OwnedObject{Kind: virt.OwnedDomain, Name: "capl-default.x", Owner: &virt.Owner{Namespace: "e2e-1"}}, false},
		{virt.OwnedObject{Kind: virt.OwnedNetwork, Name: "capl-default.demo", Owner: &virt.Owner{Namespace: "default"}}, true},
		{virt.OwnedObject{Kind: virt.OwnedVolume, Name: "capl-default.demo-md-0-abc-root.qcow2", Pool: "capi-libvirt"}, true},
		{virt.OwnedObject{Kind: virt.OwnedVolume, Name: "capl-defaults.m-root.qcow2", Pool: "capi-libvirt"}, false},
		{virt.OwnedObject{Kind: virt.OwnedVolume, Name: "capltest-default.m-seed.iso", Pool: "capi-libvirt"}, false},
		{virt.OwnedObject{Kind: virt.OwnedVolume, Name: "capl-image-sha256-0123", Pool: "capi-libvirt"}, false},
	} {
		if got := s.contains(tc.obj); got != tc.want {
			t.Errorf("contains(%+v) = %v, want %v", tc.obj, got, tc.want)
		}
	}
}

func TestRemoveStateDirRefusesForeignFiles(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{kubeconfigName, serveLogName, filepath.Base(WorkloadKubeconfig(dir, "demo")), "precious.txt"} {
		if err := os.WriteFile(filepath.Join(dir, f), nil, 0o600); err != nil {
			t.Fatal(err)
		}
	}
	// The registry's data and the host etcds' are directories of the plane's.
	for _, sub := range []string{filepath.Join(registryDirName, "blobs", "sha256"), filepath.Join(workloadEtcdDirName, "default", "demo", "data")} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			t.Fatal(err)
		}
	}
	if err := removeStateDir(dir); err == nil || !strings.Contains(err.Error(), "precious.txt") {
		t.Fatalf("removeStateDir with a foreign file: %v", err)
	}
	if err := os.Remove(filepath.Join(dir, "precious.txt")); err != nil {
		t.Fatal(err)
	}
	if err := removeStateDir(dir); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("state dir still there: %v", err)
	}
}
