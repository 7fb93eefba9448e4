//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/devplane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
)

// startSecondPlane starts another plane on the host, with the first's
// manager flags, in a state directory of its own.
func (s *suite) startSecondPlane(t *testing.T) (*plane.Plane, string) {
	t.Helper()
	state, err := os.MkdirTemp("", statePrefix)
	must(t, err)
	ctx, cancel := context.WithTimeout(s.ctx, 5*time.Minute)
	defer cancel()
	p, err := plane.Start(ctx, s.planeOptions(state), filepath.Join(s.bin, "capl-dev"))
	// Until the cluster moved, the suite's teardown knows only the first
	// plane.
	s.t.Cleanup(func() {
		if !s.move.moved {
			dctx, dcancel := context.WithTimeout(context.Background(), 15*time.Minute)
			defer dcancel()
			_, _ = plane.Down(dctx, plane.Options{StateDir: state, LibvirtURI: s.uri})
		}
	})
	if err != nil {
		t.Fatalf("starting the second plane: %v", err)
	}
	t.Logf("second management plane in %s", state)
	return p, state
}

// downFirstPlane runs plane.Down on the plane the cluster left, as
// `make down` would: it must remove nothing of the moved cluster.
func (s *suite) downFirstPlane(t *testing.T) {
	runs := s.domainRuns(t)
	before := s.heldNames(t)
	s.saveLogs(s.move.first.StateDir, "e2e-first-plane-")
	stop := s.rep.phase("move: plane down of the first plane")
	ctx, cancel := context.WithTimeout(s.ctx, 15*time.Minute)
	defer cancel()
	rep, err := plane.Down(ctx, plane.Options{StateDir: s.move.first.StateDir, LibvirtURI: s.uri, Log: t.Logf})
	stop()
	s.move.firstDown = true
	must(t, err)
	if !rep.Empty() {
		t.Errorf("down of the first plane removed domains %v, networks %v, volumes %v, pools %v", rep.Domains, rep.Networks, rep.Volumes, rep.Pools)
	}
	if after := s.heldNames(t); fmt.Sprint(after) != fmt.Sprint(before) {
		t.Errorf("libvirt held %v before the first plane's down, %v after", before, after)
	}
	if got := s.domainRuns(t); fmt.Sprint(got) != fmt.Sprint(runs) {
		t.Errorf("running domains were %v before the first plane's down, %v after", runs, got)
	}
}

// heldNames lists, sorted, what libvirt holds on the host
// (testlibvirt.Scan: domains, networks, pools, volumes and files).
func (s *suite) heldNames(t *testing.T) []string {
	t.Helper()
	objs, err := s.hostObjects()
	must(t, err)
	n := names(objs)
	slices.Sort(n)
	return n
}

// scaleAfterMove adds a worker from the second plane: it joins Ready.
func (s *suite) scaleAfterMove(t *testing.T) {
	defer s.rep.phase("move: scale workers 0 → 1 from the second plane, node Ready")()
	s.scaleWorkersAndJoin(t, 1)
}

// scaleWorkersAndJoin scales the MachineDeployment to n through s.c and
// waits for its n Machines and for every node Ready with its providerID.
func (s *suite) scaleWorkersAndJoin(t *testing.T, n int) devplane.NodesStatus {
	t.Helper()
	s.setWorkers(t, int32(n))
	s.waitFor(t, fmt.Sprintf("%d worker Machines", n), 5*time.Minute, func() (bool, string) {
		got := len(s.mdMachines(t))
		return got == n, fmt.Sprintf("%d worker machines", got)
	})
	return s.waitNodes(t, kubeadmJoinTimeout)
}

// hostRestart cuts the power: libvirtd stops, every QEMU of the cluster
// is killed at once, libvirtd starts again and finds them all off. The
// provider must boot them again with the same identities, and the cluster
// must come back with every node Ready and no Machine replaced.
func (s *suite) hostRestart(t *testing.T) {
	s.needReady(t)
	before := s.readIdentities(t)
	machines := s.machineNames(t)
	runs := s.domainRuns(t)

	start := time.Now()
	pid, startAgain := stopLibvirtd(t)
	for name := range runs {
		if err := killQEMU(name); err != nil {
			t.Error(err)
		}
	}
	t.Logf("libvirtd %d stopped, QEMU of %d domains killed", pid, len(runs))
	startAgain()
	must(t, testlibvirt.WaitLibvirtd(s.uri, time.Minute))

	s.waitFor(t, "every domain of the cluster running again", restartTimeout, func() (bool, string) {
		got := s.domainRuns(t)
		return len(got) == len(runs), fmt.Sprintf("%d of %d running", len(got), len(runs))
	})
	s.rep.phaseSince("host restart: power cut → every domain running again", start)()
	s.waitNodes(t, restartTimeout)
	s.rep.phaseSince("host restart: power cut → every node Ready", start)()
	after := s.readIdentities(t)
	compareIdentities(t, "after the host restart", before, after)
	if got := s.machineNames(t); fmt.Sprint(got) != fmt.Sprint(machines) {
		t.Errorf("Machines were %v before the restart, %v after: a machine was replaced", machines, got)
	}
	for name, id := range s.domainRuns(t) {
		if runs[name] == id {
			t.Errorf("domain %s kept libvirt ID %d across the restart: it was not killed", name, id)
		}
	}
	s.rep.passed(t, "host restart (every QEMU of the cluster killed at once, libvirtd restarted): every node Ready again %s later, "+
		"same providerIDs, MACs, addresses and reservations, no Machine replaced", time.Since(start).Round(time.Second))
}

// machineNames lists the cluster's Machines with their providerIDs.
func (s *suite) machineNames(t *testing.T) []string {
	t.Helper()
	machines := &clusterv1.MachineList{}
	must(t, s.c.List(s.ctx, machines, client.InNamespace(namespace), client.MatchingLabels{clusterv1.ClusterNameLabel: kubeadmName}))
	var out []string
	for _, m := range machines.Items {
		if m.DeletionTimestamp.IsZero() {
			out = append(out, m.Name+" "+m.Spec.ProviderID)
		}
	}
	slices.Sort(out)
	return out
}

// killQEMU kills a running domain's QEMU with SIGKILL, as a power cut
// stops it: no shutdown, nothing written back.
func killQEMU(domain string) error {
	b, err := os.ReadFile(filepath.Join(qemuPIDDir, domain+".pid"))
	if err != nil {
		return fmt.Errorf("QEMU pid of %s: %w", domain, err)
	}
	pid, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return fmt.Errorf("QEMU pid of %s: %w", domain, err)
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return fmt.Errorf("killing QEMU %d of %s: %w", pid, domain, err)
	}
	return nil
}

// firstPlaneDown takes the first plane down after a failed move scenario.
func (s *suite) firstPlaneDown() {
	if s.move.first == nil || s.move.firstDown {
		return
	}
	s.move.firstDown = true
	ctx, cancel := context.WithTimeout(context.Background(), 15*time.Minute)
	defer cancel()
	if _, err := plane.Down(ctx, plane.Options{StateDir: s.move.first.StateDir, LibvirtURI: s.uri}); err != nil {
		s.t.Errorf("down of the first plane: %v", err)
	}
}
