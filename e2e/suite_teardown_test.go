//go:build e2e

package e2e

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"time"

	apimeta "k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

func (s *suite) isDown() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.downDone
}

// down deletes every Cluster and stray machine of the namespace, stops the
// plane through plane.Down and sweeps what is left of the run. With
// strict it fails the test for anything the provider itself left behind
// (the sweep is then only the safety net for CI); without, it is the
// cleanup of a failed run and reports what it had to remove.
func (s *suite) down(strict bool) {
	s.mu.Lock()
	s.downDone = true
	s.mu.Unlock()
	t := s.t
	if s.state == "" || s.host == nil || s.imagesBefore == nil {
		// Failed before the plane had a state directory: there is nothing
		// to take down, and an empty StateDir would make Down take down
		// the default plane of `make up` instead.
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if s.plane != nil {
		stop := s.rep.phase("delete everything")
		if err := s.deleteNamespaceObjects(ctx, 10*time.Minute); err != nil {
			t.Errorf("deleting the objects of namespace %s: %v", namespace, err)
		}
		stop()
	}
	if left := s.ourLibvirtObjects(whileClusters); len(left) > 0 {
		msg := fmt.Sprintf("after deleting every object, libvirt still holds: %s", strings.Join(left, ", "))
		if strict {
			t.Error(msg)
		} else {
			t.Log(msg)
		}
	}
	s.saveLogs(s.state, "e2e-")
	stop := s.rep.phase("plane down")
	rep, err := plane.Down(ctx, plane.Options{StateDir: s.state, LibvirtURI: s.uri, ManagerBinary: filepath.Join(s.bin, "manager")})
	stop()
	if err != nil {
		t.Errorf("plane.Down: %v", err)
	}
	t.Logf("plane.Down removed domains %v, networks %v, volumes %v, pools %v; kept %v", rep.Domains, rep.Networks, rep.Volumes, rep.Pools, rep.Kept)
	s.rep.note("plane.Down removed %d domains, %d networks, %d volumes (%v), %d pools; kept: %v",
		len(rep.Domains), len(rep.Networks), len(rep.Volumes), rep.Volumes, len(rep.Pools), rep.Kept)
	// Whatever Down did, nothing of this run may outlive it; on a failed
	// run this removes what is left. Both look at the host on connections
	// of their own.
	swept, err := s.sweepOurs(ctx, false)
	for _, o := range swept {
		t.Errorf("swept after plane.Down: %s", o)
	}
	if err != nil {
		t.Error(err)
	}
	if left := s.ourLibvirtObjects(afterDown); len(left) > 0 {
		t.Errorf("libvirt objects of the run left after the sweep: %s", strings.Join(left, ", "))
	}
	// The images pushed into the plane's registry go with it.
	if _, err := os.Stat(plane.RegistryDir(s.state)); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("plane.Down left the registry's data %s (%v)", plane.RegistryDir(s.state), err)
	}
	_ = os.RemoveAll(s.state)
}

// deleteNamespaceObjects deletes the Clusters (foreground: Cluster API
// deletes their machines first), then any Machine, LibvirtMachine and
// LibvirtCluster left without a Cluster, and waits until none remain.
func (s *suite) deleteNamespaceObjects(ctx context.Context, timeout time.Duration) error {
	fg := client.PropagationPolicy(metav1.DeletePropagationForeground)
	clusters := &clusterv1.ClusterList{}
	if err := s.c.List(ctx, clusters, client.InNamespace(namespace)); err != nil {
		return err
	}
	for i := range clusters.Items {
		_ = client.IgnoreNotFound(s.c.Delete(ctx, &clusters.Items[i], fg))
	}
	deadline := time.Now().Add(timeout)
	for {
		left, err := s.namespaceObjects(ctx)
		if err != nil {
			return err
		}
		if len(left) == 0 {
			return nil
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("still there after %s: %s", timeout, strings.Join(left, ", "))
		}
		// Orphans (e.g. a bad-input machine whose Cluster went first) are
		// deleted directly once the Clusters are gone.
		if len(clusters.Items) == 0 || time.Until(deadline) < timeout/2 {
			for _, list := range []client.ObjectList{&clusterv1.MachineList{}, &infrav1.LibvirtMachineList{}, &infrav1.LibvirtClusterList{}} {
				if s.c.List(ctx, list, client.InNamespace(namespace)) == nil {
					for _, o := range items(list) {
						_ = client.IgnoreNotFound(s.c.Delete(ctx, o))
					}
				}
			}
		}
		time.Sleep(2 * time.Second)
	}
}

// namespaceObjects names the Cluster API and provider objects left in the
// namespace.
func (s *suite) namespaceObjects(ctx context.Context) ([]string, error) {
	var left []string
	for _, list := range []client.ObjectList{&clusterv1.ClusterList{}, &infrav1.LibvirtClusterList{}, &clusterv1.MachineDeploymentList{},
		&clusterv1.MachineSetList{}, &clusterv1.MachineList{}, &infrav1.LibvirtMachineList{}} {
		if err := s.c.List(ctx, list, client.InNamespace(namespace)); err != nil {
			return nil, err
		}
		for _, o := range items(list) {
			left = append(left, fmt.Sprintf("%T %s", o, o.GetName()))
		}
	}
	return left, nil
}

// items returns the members of a list.
func items(list client.ObjectList) []client.Object {
	objs, err := apimeta.ExtractList(list)
	if err != nil {
		panic(fmt.Sprintf("items of %T: %v", list, err))
	}
	out := make([]client.Object, 0, len(objs))
	for _, o := range objs {
		out = append(out, o.(client.Object))
	}
	return out
}

// saveLogs copies the logs of the plane in state into the artifacts
// directory, their names prefixed.
func (s *suite) saveLogs(state, prefix string) {
	for _, name := range []string{"manager.log", "serve.log"} {
		src, err := os.Open(filepath.Join(state, name))
		if err != nil {
			continue
		}
		dst, err := os.Create(filepath.Join(s.arts, prefix+name))
		if err == nil {
			_, _ = io.Copy(dst, src)
			_ = dst.Close()
		}
		_ = src.Close()
	}
}
