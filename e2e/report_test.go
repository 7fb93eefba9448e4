//go:build e2e

package e2e

import (
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"libvirt.org/go/libvirt"
)

// report is what the run measured; it is written as e2e-report.md and
// e2e-report.json into the artifacts directory and printed at the end.
type report struct {
	mu sync.Mutex

	Started  time.Time `json:"started"`
	Finished time.Time `json:"finished"`
	Seed     uint64    `json:"seed"`
	Passed   bool      `json:"passed"`
	// Guests counts the VMs of the run by size, as their objects' specs
	// say (guestSize); HostCores is the libvirt host's CPU count as libvirt
	// reports it.
	Guests    map[string]int `json:"guests"`
	HostCores uint           `json:"hostCores"`
	// Phases is the suite's timeline.
	Phases []phaseTiming `json:"phases"`
	// KubeadmCluster describes the kubeadm cluster: Kubernetes version,
	// accelerator, sizes, host cores.
	KubeadmCluster string `json:"kubeadmCluster,omitempty"`
	// Batches are the per-machine phase figures of a group of machines
	// created together.
	Batches []batchReport `json:"batches"`
	// ManagerRSSMaxBytes and ManagerRSSEndBytes come from sampling VmRSS
	// of the current manager process every 3 s.
	ManagerRSSMaxBytes uint64 `json:"managerRSSMaxBytes"`
	ManagerRSSEndBytes uint64 `json:"managerRSSEndBytes"`
	RSSSamples         int    `json:"rssSamples"`
	// SteadyState is the libvirt calls per reconcile figure, or why there
	// is none.
	SteadyState steadyState `json:"steadyState"`
	// IdleCost is the host CPU the ready cluster costs at rest.
	IdleCost idleCost `json:"idleCost"`
	// JoinCost is the host CPU from the first control-plane node Ready to
	// every node Ready: the workers booting and joining.
	JoinCost idleCost `json:"joinCost"`
	// Rollouts are the rollouts' durations and the endpoint's availability
	// during each.
	Rollouts []rolloutReport `json:"rollouts,omitempty"`
	// KillRounds records the manager kills of the fault phase.
	KillRounds []killRound `json:"killRounds"`
	// Notes are observations worth a line in the report.
	Notes []string `json:"notes,omitempty"`
}

type phaseTiming struct {
	Name     string        `json:"name"`
	Start    time.Time     `json:"start"`
	Duration time.Duration `json:"durationNs"`
	Seconds  float64       `json:"seconds"`
}

type steadyState struct {
	Available bool `json:"available"`
	// Reason says why the figure is missing.
	Reason              string             `json:"reason,omitempty"`
	WindowSeconds       float64            `json:"windowSeconds,omitempty"`
	LibvirtCalls        float64            `json:"libvirtCalls,omitempty"`
	MachineReconciles   float64            `json:"libvirtMachineReconciles,omitempty"`
	ClusterReconciles   float64            `json:"libvirtClusterReconciles,omitempty"`
	CallsPerReconcile   float64            `json:"callsPerReconcile,omitempty"`
	CallsByOperation    map[string]float64 `json:"callsByOperation,omitempty"`
	TriggeredByTouching int                `json:"machinesTouched,omitempty"`
}

type killRound struct {
	Round         int     `json:"round"`
	Machine       string  `json:"machine"`
	CreateKillSec float64 `json:"createKillDelaySeconds"`
	DeleteKillSec float64 `json:"deleteKillDelaySeconds"`
	Seconds       float64 `json:"seconds"`
	MaxDomains    int     `json:"maxDomainsSeen"`
}

func newReport() *report { return &report{Started: time.Now()} }

// phase starts a named phase of the timeline; calling the result ends it.
func (r *report) phase(name string) func() {
	return r.phaseSince(name, time.Now())
}

// phaseSince is phase for a phase that began at start. Each phase is also
// printed as it ends, with the time of day, so that a run cut short by
// its timeout still tells where its time went.
func (r *report) phaseSince(name string, start time.Time) func() {
	return func() {
		d := time.Since(start)
		fmt.Printf("%s e2e phase %q took %s\n", time.Now().Format(time.TimeOnly), name, d.Round(time.Second))
		r.mu.Lock()
		r.Phases = append(r.Phases, phaseTiming{Name: name, Start: start, Duration: d, Seconds: d.Seconds()})
		r.mu.Unlock()
	}
}

func (r *report) sampleRSS(b uint64) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.RSSSamples++
	r.ManagerRSSEndBytes = b
	r.ManagerRSSMaxBytes = max(r.ManagerRSSMaxBytes, b)
}

func (r *report) note(format string, args ...any) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// passed notes a success line, only when t's checks so far passed: a
// line that says what was shown must not stand beside a failure of it.
func (r *report) passed(t testing.TB, format string, args ...any) {
	if t.Failed() {
		return
	}
	r.note(format, args...)
}

func (r *report) addRollout(ro rolloutReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Rollouts = append(r.Rollouts, ro)
}

func (r *report) addBatch(b batchReport) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.Batches = append(r.Batches, b)
}

// markdown renders the report.
func (r *report) markdown() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b strings.Builder
	fmt.Fprintf(&b, "# End-to-end report\n\n")
	result := "FAILED"
	if r.Passed {
		result = "passed"
	}
	fmt.Fprintf(&b, "Run %s → %s (%s), %s; fault seed %d.\n\n", r.Started.Format(time.RFC3339), r.Finished.Format(time.RFC3339),
		r.Finished.Sub(r.Started).Round(time.Second), result, r.Seed)
	fmt.Fprintf(&b, "%s Timings are first observations by polling the API server and libvirt's DHCP leases every %s.\n\n",
		guestsLine(r.Guests, r.HostCores), observeInterval)
	if k := r.kubeadmPhases(); len(k) > 0 {
		fmt.Fprintf(&b, "## Kubernetes cluster\n\n%s\n\n| figure | seconds |\n|---|---|\n", r.KubeadmCluster)
		for _, p := range k {
			fmt.Fprintf(&b, "| %s | %.0f |\n", strings.TrimPrefix(p.Name, kubeadmPhasePrefix), p.Seconds)
		}
		fmt.Fprintf(&b, "\nHost CPU while the workers booted and joined (first control-plane node Ready → all nodes Ready; a VM created then counts all its CPU): %s.\n", r.JoinCost)
		fmt.Fprintf(&b, "\nIdle cost of the ready cluster (host CPU time of each VM's QEMU process and of the plane's processes): %s.\n\n", r.IdleCost)
	}
	if len(r.Rollouts) > 0 {
		fmt.Fprintf(&b, "## Rollouts\n\n| rollout | seconds | endpoint /readyz every %s: answered | longest gap (s) |\n|---|---|---|---|\n", probeInterval)
		for _, ro := range r.Rollouts {
			fmt.Fprintf(&b, "| %s | %.0f | %d of %d | %.0f |\n", ro.Name, ro.Seconds, ro.Answered, ro.Probes, ro.LongestGapSeconds)
		}
		fmt.Fprintf(&b, "\n")
	}
	fmt.Fprintf(&b, "## Machine phases\n\n")
	fmt.Fprintf(&b, "| batch | machines | eligible → domain started | lease → address | domain started → BootstrapSucceeded |\n|---|---|---|---|---|\n")
	for _, bt := range r.Batches {
		fmt.Fprintf(&b, "| %s | %d (%s) | %s | %s | %s |\n", bt.Name, len(bt.Machines), strings.Join(bt.Machines, ", "),
			bt.EligibleToStarted, bt.LeaseToAddress, bt.StartToSentinel)
	}
	fmt.Fprintf(&b, "\neligible = the later of: LibvirtMachine created, Cluster infrastructure provisioned, bootstrap dataSecretName set; "+
		"started = DomainReady True first observed; lease = a DHCP lease of the machine's MAC first seen in libvirt; "+
		"address = an InternalIP in status.addresses first observed. The manager watches the leases itself while the test polls them, "+
		"so lease → address can come out slightly negative.\n\n")
	fmt.Fprintf(&b, "## Manager\n\n")
	fmt.Fprintf(&b, "- RSS (VmRSS of the current manager process, %d samples every 3 s): max %.1f MiB, at the end %.1f MiB\n",
		r.RSSSamples, mib(r.ManagerRSSMaxBytes), mib(r.ManagerRSSEndBytes))
	ss := r.SteadyState
	if ss.Available {
		fmt.Fprintf(&b, "- libvirt calls per steady-state reconcile: %.2f (%.0f calls / %.0f reconciles: %.0f LibvirtMachine + %.0f LibvirtCluster, "+
			"over %.0f s after touching an annotation on %d ready LibvirtMachines)\n",
			ss.CallsPerReconcile, ss.LibvirtCalls, ss.MachineReconciles+ss.ClusterReconciles, ss.MachineReconciles, ss.ClusterReconciles,
			ss.WindowSeconds, ss.TriggeredByTouching)
		ops := make([]string, 0, len(ss.CallsByOperation))
		for op, n := range ss.CallsByOperation {
			ops = append(ops, fmt.Sprintf("%s %.0f", op, n))
		}
		slices.Sort(ops)
		fmt.Fprintf(&b, "  - by operation: %s\n", strings.Join(ops, ", "))
	} else {
		fmt.Fprintf(&b, "- libvirt calls per steady-state reconcile: not available (%s)\n", ss.Reason)
	}
	if len(r.KillRounds) > 0 {
		fmt.Fprintf(&b, "\n## Manager kills\n\n| round | machine | kill during create after | kill during delete after | round took | max domains of the machine seen |\n|---|---|---|---|---|---|\n")
		for _, k := range r.KillRounds {
			fmt.Fprintf(&b, "| %d | %s | %.1f s | %.1f s | %.0f s | %d |\n", k.Round, k.Machine, k.CreateKillSec, k.DeleteKillSec, k.Seconds, k.MaxDomains)
		}
	}
	fmt.Fprintf(&b, "\n## Timeline\n\n| phase | start (+s) | duration |\n|---|---|---|\n")
	for _, p := range r.Phases {
		fmt.Fprintf(&b, "| %s | %.0f | %.1f s |\n", p.Name, p.Start.Sub(r.Started).Seconds(), p.Seconds)
	}
	if len(r.Notes) > 0 {
		fmt.Fprintf(&b, "\n## Notes\n\n")
		for _, n := range r.Notes {
			fmt.Fprintf(&b, "- %s\n", n)
		}
	}
	return b.String()
}

// kubeadmPhasePrefix starts the names of the kubeadm cluster's phases,
// which the report also lists on their own.
const kubeadmPhasePrefix = "kubeadm: "

// kubeadmPhases are the phases named with kubeadmPhasePrefix, in order.
func (r *report) kubeadmPhases() []phaseTiming {
	var out []phaseTiming
	for _, p := range r.Phases {
		if strings.HasPrefix(p.Name, kubeadmPhasePrefix) {
			out = append(out, p)
		}
	}
	return out
}

// addGuest counts one VM of the run under its size.
func (r *report) addGuest(size string) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.Guests == nil {
		r.Guests = map[string]int{}
	}
	r.Guests[size]++
}

// hostCores is the CPU count of the libvirt host at uri, read on a
// connection of its own.
func hostCores(uri string) (uint, error) {
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return 0, err
	}
	defer conn.Close()
	info, err := conn.GetNodeInfo()
	if err != nil {
		return 0, fmt.Errorf("libvirt node info: %w", err)
	}
	return info.Cpus, nil
}

// writeReport writes and prints the report.
func (s *suite) writeReport() {
	s.rep.Finished = time.Now()
	s.rep.HostCores = s.cores
	s.rep.Passed = !s.t.Failed()
	md := s.rep.markdown()
	s.rep.mu.Lock()
	js, err := json.MarshalIndent(s.rep, "", "  ")
	s.rep.mu.Unlock()
	if err != nil {
		s.t.Errorf("report: %v", err)
	}
	for name, data := range map[string][]byte{"e2e-report.md": []byte(md), "e2e-report.json": js} {
		if err := os.WriteFile(filepath.Join(s.arts, name), data, 0o644); err != nil {
			s.t.Errorf("writing report: %v", err)
		}
	}
	s.t.Logf("report written to %s:\n%s", filepath.Join(s.arts, "e2e-report.md"), md)
}
