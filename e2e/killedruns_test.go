//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
)

// hostLockPath is held (flock) by a running suite for as long as it runs.
// The kernel drops a flock when its process dies, however it dies: a suite
// that gets the lock knows that whatever of namespace is on the host, and
// every plane state directory of the suite's, was left by a killed run. CI
// reuses hosts, and one killed run must not fail every later one.
var hostLockPath = filepath.Join(os.TempDir(), "capl-e2e.lock")

// statePrefix starts the name of the suite's plane state directories,
// which it makes in os.TempDir.
const statePrefix = "capl-e2e-plane-"

// claimHost takes hostLockPath for the run (it fails while another suite
// holds it) and clears what killed runs left: their planes go through
// plane.Down, as `capl-dev down --state-dir` would take them down (the
// processes still running are stopped, their namespaces swept), then the
// libvirt objects of namespace still there are removed, the run's pool
// with them. It returns what it removed, one line each.
func (s *suite) claimHost(ctx context.Context) ([]string, error) {
	f, alone, err := testlibvirt.LockExclusive(hostLockPath)
	if err != nil {
		return nil, err
	}
	if !alone {
		_ = f.Close()
		return nil, fmt.Errorf("another e2e run holds %s on this host", hostLockPath)
	}
	s.hostLock = f

	var removed []string
	dirs, err := filepath.Glob(filepath.Join(os.TempDir(), statePrefix+"*"))
	if err != nil {
		return nil, err
	}
	for _, dir := range dirs {
		rep, err := plane.Down(ctx, plane.Options{
			StateDir:      dir,
			LibvirtURI:    s.uri,
			ManagerBinary: filepath.Join(s.bin, "manager"),
			Log:           s.t.Logf,
		})
		if err != nil {
			return removed, fmt.Errorf("taking down the plane a killed run left in %s: %w", dir, err)
		}
		// Down keeps files it does not know; a killed run's are the suite's.
		if err := os.RemoveAll(dir); err != nil {
			return removed, err
		}
		removed = append(removed, fmt.Sprintf("plane %s (domains %v, networks %v, volumes %v, pools %v)",
			dir, rep.Domains, rep.Networks, rep.Volumes, rep.Pools))
	}

	objs, err := s.hostObjects()
	if err != nil {
		return removed, err
	}
	s.imagesBefore = imagesBefore(objs)
	swept, err := s.sweepOurs(ctx, true)
	return append(removed, swept...), err
}

// releaseHost lets the next run have the host.
func (s *suite) releaseHost() {
	if s.hostLock != nil {
		_ = s.hostLock.Close()
	}
}
