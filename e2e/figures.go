package e2e

// The report's arithmetic, apart from the suite (files with the e2e build
// tag) so that `make test` runs its tests (figures_unit_test.go) without a
// plane or VMs.

import (
	"bufio"
	"fmt"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// stats summarises one phase over the machines of a batch, in seconds.
type stats struct {
	N      int     `json:"n"`
	Median float64 `json:"median"`
	Min    float64 `json:"min"`
	Max    float64 `json:"max"`
}

// batchReport is the figures of the machines created together.
type batchReport struct {
	Name     string   `json:"name"`
	Machines []string `json:"machines"`
	// EligibleToStarted: eligible (the later of LibvirtMachine created,
	// Cluster infrastructure provisioned, bootstrap dataSecretName set) →
	// DomainReady True first observed.
	EligibleToStarted stats `json:"eligibleToDomainStarted"`
	// LeaseToAddress: a DHCP lease of the machine's MAC first seen in
	// libvirt → an InternalIP in status.addresses first observed.
	LeaseToAddress stats `json:"leaseToAddress"`
	// StartToSentinel: DomainReady True → BootstrapSucceeded True.
	StartToSentinel stats `json:"domainStartedToBootstrapSucceeded"`
}

// summarize computes n, median, min and max of the durations.
func summarize(ds []time.Duration) stats {
	if len(ds) == 0 {
		return stats{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	mid := s[len(s)/2]
	if len(s)%2 == 0 {
		mid = (s[len(s)/2-1] + s[len(s)/2]) / 2
	}
	return stats{N: len(s), Median: mid.Seconds(), Min: s[0].Seconds(), Max: s[len(s)-1].Seconds()}
}

// batch computes the figures of a batch from the recorder's timelines.
// A machine missing a step is left out of that phase (n says how many
// counted).
func batch(name string, tls []timeline, provisioned time.Time) batchReport {
	b := batchReport{Name: name}
	var started, address, sentinel []time.Duration
	for _, tl := range tls {
		b.Machines = append(b.Machines, tl.name)
		if e := tl.eligible(provisioned); !e.IsZero() && !tl.domainReady.IsZero() {
			started = append(started, max(0, tl.domainReady.Sub(e)))
		}
		if !tl.lease.IsZero() && !tl.address.IsZero() {
			address = append(address, tl.address.Sub(tl.lease))
		}
		if !tl.domainReady.IsZero() && !tl.bootstrap.IsZero() {
			sentinel = append(sentinel, tl.bootstrap.Sub(tl.domainReady))
		}
	}
	slices.Sort(b.Machines)
	b.EligibleToStarted = summarize(started)
	b.LeaseToAddress = summarize(address)
	b.StartToSentinel = summarize(sentinel)
	return b
}

func (st stats) String() string {
	if st.N == 0 {
		return "n=0 (not observed)"
	}
	return fmt.Sprintf("median %.1f s (n=%d, min %.1f, max %.1f)", st.Median, st.N, st.Min, st.Max)
}

// guestsLine is the report's sentence about the guests and the host.
func guestsLine(guests map[string]int, cores uint) string {
	sizes := make([]string, 0, len(guests))
	for size, n := range guests {
		sizes = append(sizes, fmt.Sprintf("%d × %s", n, size))
	}
	slices.Sort(sizes)
	what := "none observed"
	if len(sizes) > 0 {
		what = strings.Join(sizes, "; ")
	}
	host := "a host of unknown size"
	if cores > 0 {
		host = fmt.Sprintf("a shared %d-core host", cores)
	}
	return fmt.Sprintf("Guests (from the LibvirtMachine and LibvirtCluster specs): %s; on %s (libvirt's node info).", what, host)
}

// mib converts bytes to MiB.
func mib(b uint64) float64 { return float64(b) / (1 << 20) }

// timeline is when the recorder first saw each step of one LibvirtMachine.
type timeline struct {
	name        string
	created     time.Time // first seen (or creationTimestamp, if earlier)
	secret      time.Time // its Machine's bootstrap dataSecretName first seen
	domainReady time.Time // DomainReady True first seen
	lease       time.Time // a DHCP lease of its MAC first seen in libvirt
	address     time.Time // an InternalIP in status.addresses first seen
	bootstrap   time.Time // BootstrapSucceeded True first seen
	mac         string
	network     string
}

// eligible is when the machine could start: the later of its creation,
// the cluster's infrastructure being provisioned and its bootstrap data
// being named.
func (tl timeline) eligible(clusterProvisioned time.Time) time.Time {
	e := tl.created
	for _, t := range []time.Time{clusterProvisioned, tl.secret} {
		if t.IsZero() {
			return time.Time{}
		}
		if t.After(e) {
			e = t
		}
	}
	return e
}

// Metrics the steady-state figure is computed from.
const (
	metricLibvirtCalls = "capl_libvirt_calls_total"
	metricReconciles   = "controller_runtime_reconcile_total"
)

// sample is one Prometheus sample: its labels and value.
type sample struct {
	labels map[string]string
	value  float64
}

// parseMetrics reads the samples of the named metric families from
// Prometheus' text format.
func parseMetrics(text string, names ...string) map[string][]sample {
	out := map[string][]sample{}
	sc := bufio.NewScanner(strings.NewReader(text))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		name, rest := line, ""
		if i := strings.IndexAny(line, "{ "); i >= 0 {
			name, rest = line[:i], line[i:]
		}
		if !slices.Contains(names, name) {
			continue
		}
		smp := sample{labels: map[string]string{}}
		if strings.HasPrefix(rest, "{") {
			end := strings.LastIndex(rest, "}")
			if end < 0 {
				continue
			}
			for _, kv := range strings.Split(rest[1:end], ",") {
				k, v, ok := strings.Cut(kv, "=")
				if ok {
					smp.labels[strings.TrimSpace(k)] = strings.Trim(strings.TrimSpace(v), `"`)
				}
			}
			rest = rest[end+1:]
		}
		fields := strings.Fields(rest)
		if len(fields) == 0 {
			continue
		}
		v, err := strconv.ParseFloat(fields[0], 64)
		if err != nil {
			continue
		}
		smp.value = v
		out[name] = append(out[name], smp)
	}
	return out
}

// guestSize describes the virtual hardware of one VM, e.g. "machine:
// qemu (TCG), cpuMode maximum, 1 vCPU, 512 MiB, TCG cache 64 MiB".
func guestSize(role string, hw infrav1.VirtualHardware) string {
	kind := string(hw.DomainType)
	if hw.DomainType == infrav1.DomainTypeQEMU {
		kind += " (TCG)"
	}
	out := fmt.Sprintf("%s: %s, cpuMode %s, %d vCPU, %d MiB", role, kind, hw.CPUMode, hw.CPUs, hw.MemoryMiB)
	if hw.TCGTranslationCacheMiB > 0 {
		out += fmt.Sprintf(", TCG cache %d MiB", hw.TCGTranslationCacheMiB)
	}
	return out
}

// clockTicksPerSecond is USER_HZ, the unit of /proc/<pid>/stat's CPU
// times: 100 on every Linux architecture the provider runs on.
const clockTicksPerSecond = 100

// processCPUTicks is the user plus system CPU time, in clock ticks, of the
// process whose /proc/<pid>/stat is stat (fields 14 and 15, counted after
// the parenthesised command name, which may contain spaces).
func processCPUTicks(stat []byte) (uint64, error) {
	s := string(stat)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0, fmt.Errorf("no command name in %q", s)
	}
	// After ") " come state (field 3), ppid, ... utime (14), stime (15).
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0, fmt.Errorf("short stat %q", s)
	}
	var total uint64
	for _, v := range f[11:13] {
		n, err := strconv.ParseUint(v, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("stat %q: %w", s, err)
		}
		total += n
	}
	return total, nil
}

// idleCost is what the ready cluster costs the host while nothing happens
// in it: host CPU time of each of its VMs (the whole QEMU process, TCG
// translation included) and of each of the plane's processes, in
// core-seconds per minute (60 = one host core busy all the time).
type idleCost struct {
	WindowSeconds float64 `json:"windowSeconds"`
	// VMs and Plane are by domain and by process name.
	VMs   map[string]float64 `json:"vmCoreSecondsPerMinute"`
	Plane map[string]float64 `json:"planeCoreSecondsPerMinute"`
	// Guests are the busiest processes inside each node's guest (from ps
	// through the guest agent), by domain; their CPU is the guest's
	// view, which TCG's own work (translation, helpers) adds to.
	Guests map[string][]processCost `json:"guestTopProcesses,omitempty"`
}

// coreSecondsPerMinute turns CPU ticks spent over window into
// core-seconds per minute.
func coreSecondsPerMinute(ticks uint64, window time.Duration) float64 {
	if window <= 0 {
		return 0
	}
	return float64(ticks) / clockTicksPerSecond / window.Minutes()
}

// sum adds the figures of m.
func sum(m map[string]float64) float64 {
	var t float64
	for _, v := range m {
		t += v
	}
	return t
}

// String is the report's lines about the cost.
func (c idleCost) String() string {
	if c.WindowSeconds == 0 {
		return "not measured"
	}
	line := func(m map[string]float64) string {
		names := slices.Sorted(maps.Keys(m))
		parts := make([]string, 0, len(names))
		for _, n := range names {
			parts = append(parts, fmt.Sprintf("%s %.1f", n, m[n]))
		}
		return strings.Join(parts, ", ")
	}
	text := fmt.Sprintf("%.1f core-seconds per minute in all over %.0f s (VMs %.1f: %s; plane %.1f: %s)",
		sum(c.VMs)+sum(c.Plane), c.WindowSeconds, sum(c.VMs), line(c.VMs), sum(c.Plane), line(c.Plane))
	for _, d := range slices.Sorted(maps.Keys(c.Guests)) {
		parts := make([]string, 0, len(c.Guests[d]))
		for _, p := range c.Guests[d] {
			parts = append(parts, fmt.Sprintf("%s %.1f", p.Command, p.CoreSecondsPerMinute))
		}
		text += fmt.Sprintf("; inside %s, busiest first: %s", d, strings.Join(parts, ", "))
	}
	return text
}

// guestCPUSeconds sums, by command name, the cumulative CPU seconds of
// `ps -eo times=,comm=` output (one "seconds name" line per process).
func guestCPUSeconds(ps string) (map[string]float64, error) {
	out := map[string]float64{}
	for _, line := range strings.Split(strings.TrimSpace(ps), "\n") {
		f := strings.Fields(line)
		if len(f) < 2 {
			continue
		}
		secs, err := strconv.ParseFloat(f[0], 64)
		if err != nil {
			return nil, fmt.Errorf("ps line %q: %w", line, err)
		}
		out[strings.Join(f[1:], " ")] += secs
	}
	return out, nil
}

// processCost is one command's CPU inside a guest over a window.
type processCost struct {
	Command              string  `json:"command"`
	CoreSecondsPerMinute float64 `json:"coreSecondsPerMinute"`
}

// topGuestProcesses are the n commands that used the most CPU between two
// guestCPUSeconds readings taken window apart; a process that exited in
// between is left out (its time is gone from the second reading).
func topGuestProcesses(before, after map[string]float64, window time.Duration, n int) []processCost {
	var out []processCost
	for cmd, secs := range after {
		if d := secs - before[cmd]; d > 0 && window > 0 {
			out = append(out, processCost{Command: cmd, CoreSecondsPerMinute: d / window.Minutes()})
		}
	}
	slices.SortFunc(out, func(a, b processCost) int {
		if a.CoreSecondsPerMinute != b.CoreSecondsPerMinute {
			if a.CoreSecondsPerMinute > b.CoreSecondsPerMinute {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Command, b.Command)
	})
	if len(out) > n {
		out = out[:n]
	}
	return out
}
