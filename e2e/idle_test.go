//go:build e2e

package e2e

import (
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
)

// idleWindow is how long the idle cost is sampled.
const idleWindow = time.Minute

// measureIdleCost samples the host CPU time of the ready cluster's VMs
// (their QEMU processes) and of the plane's processes over idleWindow, in
// which the test does nothing, and reports core-seconds per minute.
func (s *suite) measureIdleCost(t *testing.T) {
	defer s.rep.phase("idle cost window")()
	vms := s.clusterVMPIDs(t)
	nodes := map[string]string{} // node domain → its guest's processes before the window
	for d := range vms {
		if d != naming.LoadBalancerDomainName(namespace, s.cut.infrastructure) {
			nodes[d] = ""
		}
	}
	planePIDs, err := s.plane.PIDs()
	must(t, err)

	for d := range nodes {
		nodes[d] = s.guestPS(t, d)
	}
	before, err := cpuTicksOf(vms, planePIDs)
	must(t, err)
	start := time.Now()
	time.Sleep(idleWindow)
	after, err := cpuTicksOf(vms, planePIDs)
	must(t, err)
	window := time.Since(start)
	guests := map[string][]processCost{}
	for d, psBefore := range nodes {
		b, errB := guestCPUSeconds(psBefore)
		a, errA := guestCPUSeconds(s.guestPS(t, d))
		if errB != nil || errA != nil {
			t.Errorf("guest %s: %v %v", d, errB, errA)
			continue
		}
		guests[d] = topGuestProcesses(b, a, window, 8)
	}

	cost := idleCost{WindowSeconds: window.Seconds(), VMs: map[string]float64{}, Plane: map[string]float64{}, Guests: guests}
	for name := range vms {
		cost.VMs[name] = coreSecondsPerMinute(after["vm/"+name]-before["vm/"+name], window)
	}
	for name := range planePIDs {
		cost.Plane[name] = coreSecondsPerMinute(after["plane/"+name]-before["plane/"+name], window)
	}
	s.rep.mu.Lock()
	s.rep.IdleCost = cost
	s.rep.mu.Unlock()
	t.Logf("idle cost: %s", cost)
}

// clusterVMPIDs maps the domain of every machine of the cluster under test
// and of its load balancer to its QEMU process.
func (s *suite) clusterVMPIDs(t *testing.T) map[string]int {
	t.Helper()
	domains, err := s.clusterDomains()
	must(t, err)
	vms := map[string]int{}
	for _, d := range domains {
		pid, err := qemuPID(d)
		if err != nil {
			t.Errorf("QEMU pid of %s: %v", d, err)
			continue
		}
		vms[d] = pid
	}
	return vms
}

// clusterDomains lists the domains of the cluster under test: its load
// balancer's, then every machine's that has one.
func (s *suite) clusterDomains() ([]string, error) {
	lms, err := s.clusterMachines(s.cut.name)
	if err != nil {
		return nil, err
	}
	domains := []string{naming.LoadBalancerDomainName(namespace, s.cut.infrastructure)}
	for _, lm := range lms {
		if d := lm.Status.Domain; d != nil && d.Name != "" {
			domains = append(domains, d.Name)
		}
	}
	return domains, nil
}

// qemuPID is the pid of a running domain's QEMU process, from libvirt's
// pid file.
func qemuPID(domain string) (int, error) {
	data, err := os.ReadFile(filepath.Join(qemuPIDDir, domain+".pid"))
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(strings.TrimSpace(string(data)))
}

// cpuSnapshot is the CPU ticks of the cluster's VMs and of the plane's
// processes (cpuTicksOf's keys) at one time.
type cpuSnapshot struct {
	at    time.Time
	ticks map[string]uint64
}

// snapshotCPU reads the cluster's VMs' and the plane's CPU ticks now.
func (s *suite) snapshotCPU(t *testing.T) cpuSnapshot {
	t.Helper()
	planePIDs, err := s.plane.PIDs()
	must(t, err)
	ticks, err := cpuTicksOf(s.clusterVMPIDs(t), planePIDs)
	must(t, err)
	return cpuSnapshot{at: time.Now(), ticks: ticks}
}

// recordJoinCost reports the host CPU spent since before, while workers
// booted and joined: a VM created in that time counts all its CPU.
func (s *suite) recordJoinCost(t *testing.T, before cpuSnapshot) {
	after := s.snapshotCPU(t)
	window := after.at.Sub(before.at)
	cost := idleCost{WindowSeconds: window.Seconds(), VMs: map[string]float64{}, Plane: map[string]float64{}}
	for key, ticks := range after.ticks {
		kind, name, _ := strings.Cut(key, "/")
		base := before.ticks[key]
		if ticks < base { // restarted in the window: count the new process whole
			base = 0
		}
		perMinute := coreSecondsPerMinute(ticks-base, window)
		if kind == "vm" {
			cost.VMs[name] = perMinute
		} else {
			cost.Plane[name] = perMinute
		}
	}
	s.rep.mu.Lock()
	s.rep.JoinCost = cost
	s.rep.mu.Unlock()
	t.Logf("join cost: %s", cost)
}

// guestPS is `ps -eo times=,comm=` run in the domain's guest through the
// agent (each process's cumulative CPU seconds and command).
func (s *suite) guestPS(t *testing.T, domain string) string {
	t.Helper()
	res, err := s.host.GuestExec(s.ctx, domain, "/bin/ps", []string{"-eo", "times=,comm="}, nil)
	if err != nil || res.ExitCode != 0 {
		t.Errorf("ps in %s: exit %d, %v: %s", domain, res.ExitCode, err, res.Stderr)
		return ""
	}
	return string(res.Stdout)
}

// cpuTicksOf reads the CPU ticks of every process, keyed vm/<domain> and
// plane/<name>.
func cpuTicksOf(vms, plane map[string]int) (map[string]uint64, error) {
	out := map[string]uint64{}
	for prefix, pids := range map[string]map[string]int{"vm/": vms, "plane/": plane} {
		for name, pid := range pids {
			stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
			if err != nil {
				return nil, fmt.Errorf("%s%s (pid %d): %w", prefix, name, pid, err)
			}
			if out[prefix+name], err = processCPUTicks(stat); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}
