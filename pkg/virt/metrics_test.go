package virt

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
)

// TestCallsCounted checks that operations count under their own name,
// once per libvirt round trip: a cached answer costs nothing.
func TestCallsCounted(t *testing.T) {
	c := dialTest(t)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	count := func(op string) float64 { return testutil.ToFloat64(libvirtCalls.WithLabelValues(op)) }
	samples := func(op string) uint64 {
		var m dto.Metric
		if err := libvirtCallDuration.WithLabelValues(op).(prometheus.Metric).Write(&m); err != nil {
			t.Fatal(err)
		}
		return m.GetHistogram().GetSampleCount()
	}

	info, volInfo := count("DomainInfo"), count("VolumeInfo")
	infoSamples := samples("DomainInfo")
	if _, err := c.DomainInfo(ctx, "test"); err != nil {
		t.Fatal(err)
	}
	if _, err := c.DomainInfo(ctx, "capltest-missing"); !IsNotFound(err) {
		t.Fatalf("DomainInfo of a missing domain: %v", err)
	}
	if got := count("DomainInfo") - info; got != 2 {
		t.Errorf("DomainInfo counted %v times, want 2 (a failed call counts too)", got)
	}
	if got := samples("DomainInfo") - infoSamples; got != 2 {
		t.Errorf("DomainInfo durations observed %d times, want 2", got)
	}
	if got := count("VolumeInfo") - volInfo; got != 0 {
		t.Errorf("VolumeInfo counted %v times by DomainInfo calls", got)
	}

	mem := count("HostMemory")
	for range 3 {
		if b, err := c.HostMemory(ctx); err != nil || b == 0 {
			t.Fatalf("HostMemory() = %d, %v", b, err)
		}
	}
	if got := count("HostMemory") - mem; got != 1 {
		t.Errorf("HostMemory asked libvirt %v times, want once (the answer is cached)", got)
	}
}

// TestRegisterMetricsTwice checks that a second manager in one process can
// register the collectors again, and that they are then gathered.
func TestRegisterMetricsTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	for range 2 {
		if err := RegisterMetrics(reg); err != nil {
			t.Fatal(err)
		}
	}
	libvirtCalls.WithLabelValues("DomainInfo").Add(0)
	libvirtCallDuration.WithLabelValues("DomainInfo").Observe(0)
	n, err := testutil.GatherAndCount(reg, "capl_libvirt_calls_total", "capl_libvirt_call_duration_seconds")
	if err != nil {
		t.Fatal(err)
	}
	if n < 2 {
		t.Errorf("gathered %d series, want both metrics", n)
	}
}
