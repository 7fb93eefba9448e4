package e2e

import (
	"slices"
	"strings"
	"testing"
	"time"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

func TestSummarize(t *testing.T) {
	s := time.Second
	tests := []struct {
		name string
		in   []time.Duration
		want stats
	}{
		{"none", nil, stats{}},
		{"one", []time.Duration{3 * s}, stats{N: 1, Median: 3, Min: 3, Max: 3}},
		{"odd, unsorted", []time.Duration{9 * s, 1 * s, 4 * s}, stats{N: 3, Median: 4, Min: 1, Max: 9}},
		{"even: mean of the middle two", []time.Duration{4 * s, 1 * s, 2 * s, 10 * s}, stats{N: 4, Median: 3, Min: 1, Max: 10}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := summarize(tt.in); got != tt.want {
				t.Errorf("summarize(%v) = %+v, want %+v", tt.in, got, tt.want)
			}
		})
	}
}

func TestEligible(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	tests := []struct {
		name        string
		tl          timeline
		provisioned time.Time
		want        time.Time
	}{
		{"created last", timeline{created: at(10), secret: at(5)}, at(3), at(10)},
		{"cluster provisioned last", timeline{created: at(1), secret: at(2)}, at(30), at(30)},
		{"secret named last", timeline{created: at(1), secret: at(40)}, at(30), at(40)},
		{"cluster never provisioned", timeline{created: at(1), secret: at(2)}, time.Time{}, time.Time{}},
		{"secret never named", timeline{created: at(1)}, at(2), time.Time{}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if got := tt.tl.eligible(tt.provisioned); !got.Equal(tt.want) {
				t.Errorf("eligible = %v, want %v", got, tt.want)
			}
		})
	}
}

func TestBatch(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	at := func(sec int) time.Time { return t0.Add(time.Duration(sec) * time.Second) }
	tls := []timeline{
		{name: "b", created: at(0), secret: at(0), domainReady: at(12), lease: at(80), address: at(81), bootstrap: at(200)},
		{name: "a", created: at(0), secret: at(0), domainReady: at(10), lease: at(70), address: at(73), bootstrap: at(150)},
		// Still booting: counts for the first phase only.
		{name: "c", created: at(0), secret: at(0), domainReady: at(14)},
	}
	b := batch("test", tls, at(5))
	if got, want := b.Machines, []string{"a", "b", "c"}; len(got) != 3 || got[0] != want[0] || got[2] != want[2] {
		t.Errorf("machines %v, want %v", got, want)
	}
	if want := (stats{N: 3, Median: 7, Min: 5, Max: 9}); b.EligibleToStarted != want {
		t.Errorf("eligible → started %+v, want %+v", b.EligibleToStarted, want)
	}
	if want := (stats{N: 2, Median: 2, Min: 1, Max: 3}); b.LeaseToAddress != want {
		t.Errorf("lease → address %+v, want %+v", b.LeaseToAddress, want)
	}
	if want := (stats{N: 2, Median: 164, Min: 140, Max: 188}); b.StartToSentinel != want {
		t.Errorf("start → sentinel %+v, want %+v", b.StartToSentinel, want)
	}
}

func TestParseMetrics(t *testing.T) {
	text := `# HELP capl_libvirt_calls_total Engine operations.
# TYPE capl_libvirt_calls_total counter
capl_libvirt_calls_total{operation="DomainInfo"} 22
capl_libvirt_calls_total{operation="VolumeInfo"} 4.4e+01
controller_runtime_reconcile_total{controller="libvirtmachine",result="success"} 15
controller_runtime_reconcile_total{controller="libvirtmachine",result="requeue"} 3
controller_runtime_reconcile_total{controller="libvirtcluster",result="success"} 7
controller_runtime_reconcile_time_seconds_count{controller="libvirtmachine"} 99
process_resident_memory_bytes 1.2e+08
`
	tests := []struct {
		name   string
		metric string
		labels map[string]string
		want   float64
	}{
		{"calls of all operations", metricLibvirtCalls, nil, 66},
		{"one operation", metricLibvirtCalls, map[string]string{"operation": "VolumeInfo"}, 44},
		{"machine reconciles of every result", metricReconciles, map[string]string{"controller": "libvirtmachine"}, 18},
		{"cluster reconciles", metricReconciles, map[string]string{"controller": "libvirtcluster"}, 7},
	}
	got := parseMetrics(text, metricLibvirtCalls, metricReconciles)
	if len(got) != 2 {
		t.Fatalf("parsed families %v, want only the two asked for", got)
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			sum := 0.0
			for _, smp := range got[tt.metric] {
				match := true
				for k, v := range tt.labels {
					match = match && smp.labels[k] == v
				}
				if match {
					sum += smp.value
				}
			}
			if sum != tt.want {
				t.Errorf("%s%v = %v, want %v", tt.metric, tt.labels, sum, tt.want)
			}
		})
	}
}

func TestGuestsLine(t *testing.T) {
	tcg := infrav1.VirtualHardware{CPUs: 1, MemoryMiB: 512, DomainType: infrav1.DomainTypeQEMU, CPUMode: infrav1.CPUModeMaximum, TCGTranslationCacheMiB: 64}
	guests := map[string]int{
		guestSize("machine", tcg): 5,
		guestSize("machine", infrav1.VirtualHardware{CPUs: 2, MemoryMiB: 2048, DomainType: infrav1.DomainTypeKVM, CPUMode: infrav1.CPUModeHostPassthrough}): 1,
		guestSize("load balancer", infrav1.VirtualHardware{CPUs: 1, MemoryMiB: 512, DomainType: infrav1.DomainTypeQEMU, CPUMode: infrav1.CPUModeMaximum}):   1,
	}
	want := "Guests (from the LibvirtMachine and LibvirtCluster specs): 1 × load balancer: qemu (TCG), cpuMode maximum, 1 vCPU, 512 MiB; " +
		"1 × machine: kvm, cpuMode host-passthrough, 2 vCPU, 2048 MiB; 5 × machine: qemu (TCG), cpuMode maximum, 1 vCPU, 512 MiB, TCG cache 64 MiB; " +
		"on a shared 8-core host (libvirt's node info)."
	if got := guestsLine(guests, 8); got != want {
		t.Errorf("guestsLine =\n%s\nwant\n%s", got, want)
	}
	if got := guestsLine(nil, 0); !strings.Contains(got, "none observed") || !strings.Contains(got, "unknown size") {
		t.Errorf("guestsLine of nothing = %q", got)
	}
}

func TestProcessCPUTicks(t *testing.T) {
	tests := []struct {
		name, stat string
		want       uint64
		wantErr    bool
	}{
		{"qemu", "4242 (qemu-system-x86) S 1 4242 4242 0 -1 4194560 100 0 0 0 1500 250 0 0 20 0 3 0 500 1000 200", 1750, false},
		{"name with spaces and parens", "7 (a) b (c)) R 1 7 7 0 -1 0 0 0 0 0 12 30 0 0 20 0 1 0 5 10 2", 42, false},
		{"no name", "7 R 1", 0, true},
		{"short", "7 (x) R 1 2 3", 0, true},
		{"not a number", "7 (x) R 1 7 7 0 -1 0 0 0 0 0 u s 0 0 20 0 1 0 5 10 2", 0, true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := processCPUTicks([]byte(tt.stat))
			if (err != nil) != tt.wantErr || got != tt.want {
				t.Errorf("processCPUTicks = %d, %v; want %d, error %v", got, err, tt.want, tt.wantErr)
			}
		})
	}
}

func TestIdleCost(t *testing.T) {
	// 3000 ticks = 30 s of CPU over 60 s: half a core, 30 core-seconds per minute.
	if got := coreSecondsPerMinute(3000, time.Minute); got != 30 {
		t.Errorf("coreSecondsPerMinute(3000, 1m) = %v, want 30", got)
	}
	if got := coreSecondsPerMinute(3000, 2*time.Minute); got != 15 {
		t.Errorf("coreSecondsPerMinute(3000, 2m) = %v, want 15", got)
	}
	if got := coreSecondsPerMinute(3000, 0); got != 0 {
		t.Errorf("coreSecondsPerMinute over no window = %v, want 0", got)
	}
	c := idleCost{WindowSeconds: 60, VMs: map[string]float64{"cp": 20, "lb": 1}, Plane: map[string]float64{"etcd": 2.5}}
	want := "23.5 core-seconds per minute in all over 60 s (VMs 21.0: cp 20.0, lb 1.0; plane 2.5: etcd 2.5)"
	if got := c.String(); got != want {
		t.Errorf("String() = %q, want %q", got, want)
	}
	if got := (idleCost{}).String(); got != "not measured" {
		t.Errorf("empty cost: %q", got)
	}
}

func TestTopGuestProcesses(t *testing.T) {
	before, err := guestCPUSeconds("  10 kube-apiserver\n  5 etcd\n 1 kubelet\n 1 kubelet\n 3 gone\n")
	if err != nil {
		t.Fatal(err)
	}
	if before["kubelet"] != 2 {
		t.Fatalf("kubelet's two processes sum to %v, want 2", before["kubelet"])
	}
	after, err := guestCPUSeconds("40 kube-apiserver\n20 etcd\n 2 kubelet\n 2 kubelet\n 7 new one\n")
	if err != nil {
		t.Fatal(err)
	}
	got := topGuestProcesses(before, after, 2*time.Minute, 3)
	want := []processCost{{"kube-apiserver", 15}, {"etcd", 7.5}, {"new one", 3.5}}
	if !slices.Equal(got, want) {
		t.Errorf("topGuestProcesses = %v, want %v", got, want)
	}
	if _, err := guestCPUSeconds("x kubelet"); err == nil {
		t.Error("a non-numeric time parsed")
	}
}
