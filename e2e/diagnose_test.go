//go:build e2e

package e2e

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// diagnoseWindow is how long diagnoseWorkload samples the VMs' host CPU.
const diagnoseWindow = 5 * time.Second

// nodeDiagnosis is what a node's guest says about itself when its cluster
// stops answering: load and memory, the static pods' restarts (a probe
// that kills the API server faster than a starved guest restarts it never
// lets it settle), and kubelet's last words on probes and kills.
const nodeDiagnosis = `uptime; free -m | head -2
/usr/local/bin/crictl ps -a 2>&1 | awk '{print $(NF-4), $(NF-3), $(NF-2)}' | head -20
journalctl -u kubelet --no-pager -n 200 -o cat 2>/dev/null | grep -i -E 'probe failed|killing|oom|evict' | tail -8`

// loadBalancerDiagnosis is the HAProxy VM's: load, memory and how many
// connections it holds.
const loadBalancerDiagnosis = `uptime; free -m | head -2; echo "tcp connections: $(cat /proc/net/tcp | wc -l)"`

// diagnoseWorkload logs why the workload cluster may not answer, from
// outside its API: each VM's host CPU over a few seconds and each guest's
// own view through its agent. Every wait on the workload cluster that
// times out calls it, so that a failed CI run says whether a guest was
// starved, restarting its API server or out of memory.
func (s *suite) diagnoseWorkload(t *testing.T) {
	t.Helper()
	if s.cut.infrastructure == "" {
		return
	}
	lb := naming.LoadBalancerDomainName(namespace, s.cut.infrastructure)
	domains, err := s.clusterDomains()
	if err != nil {
		domains = []string{lb}
	}
	t.Logf("diagnosis of the workload cluster: host CPU over %s (cores): %s", diagnoseWindow, vmCPUNow(domains, diagnoseWindow))
	var guests virt.GuestHost = s.host
	if s.k8s.guestHost != nil {
		guests = s.k8s.guestHost
	}
	for _, d := range domains {
		script := nodeDiagnosis
		if d == lb {
			script = loadBalancerDiagnosis
		}
		ctx, cancel := context.WithTimeout(s.ctx, 30*time.Second)
		res, err := guests.GuestExec(ctx, d, "/bin/sh", []string{"-c", script}, nil)
		cancel()
		if err != nil {
			t.Logf("diagnosis of %s: the guest agent did not answer: %v", d, err)
			continue
		}
		t.Logf("diagnosis of %s (exit %d):\n%s%s", d, res.ExitCode, res.Stdout, res.Stderr)
	}
}

// vmCPUNow is each domain's QEMU CPU use over window, in cores, as one
// line; a domain without a QEMU process is said to be so.
func vmCPUNow(domains []string, window time.Duration) string {
	pids := map[string]int{}
	var out []string
	for _, d := range domains {
		pid, err := qemuPID(d)
		if err != nil {
			out = append(out, d+" no QEMU process")
			continue
		}
		pids[d] = pid
	}
	before, err := cpuTicksOf(pids, nil)
	if err != nil {
		return err.Error()
	}
	time.Sleep(window)
	after, err := cpuTicksOf(pids, nil)
	if err != nil {
		return err.Error()
	}
	for _, d := range slices.Sorted(maps.Keys(pids)) {
		out = append(out, fmt.Sprintf("%s %.2f", d, coreSecondsPerMinute(after["vm/"+d]-before["vm/"+d], window)/60))
	}
	return strings.Join(out, ", ")
}
