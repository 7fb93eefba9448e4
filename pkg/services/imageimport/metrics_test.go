package imageimport

import (
	"fmt"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/metrics"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func importsTimed(t *testing.T, result string) uint64 {
	t.Helper()
	var m dto.Metric
	if err := metrics.ImageImportDuration.WithLabelValues(result).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// TestImportMetrics checks what each attempt's end records: its duration
// by result, the bytes it read, and a refusal by reason.
func TestImportMetrics(t *testing.T) {
	tooLarge := fmt.Errorf("image of 64 GiB: %w", virt.ErrImageTooLarge)
	for _, tc := range []struct {
		name        string
		outcome     error
		phase       Phase
		result      string
		refusedWith string
	}{
		{"imported", nil, Done, metrics.ImportImported, ""},
		{"refused", tooLarge, Refused, metrics.ImportRefused, infrav1.ImageTooLargeReason},
		{"failed", fmt.Errorf("connection reset"), Failed, metrics.ImportFailed, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			timed, bytes := importsTimed(t, tc.result), testutil.ToFloat64(metrics.ImageImportBytes)
			refusals := testutil.ToFloat64(metrics.ImageImportRefusals.WithLabelValues(infrav1.ImageTooLargeReason))
			h := newGateHost()
			im := New(h, Options{})
			im.Ensure(key, a)
			recv(t, h.started, "import")
			h.outcome <- tc.outcome
			waitPhase(t, im, a, tc.phase)
			if got := importsTimed(t, tc.result) - timed; got != 1 {
				t.Errorf("%d attempts timed as %s, want 1", got, tc.result)
			}
			// gateHost reports 512 bytes read.
			if got := testutil.ToFloat64(metrics.ImageImportBytes) - bytes; got != 512 {
				t.Errorf("%v bytes counted, want 512", got)
			}
			want := 0.0
			if tc.refusedWith != "" {
				want = 1
			}
			if got := testutil.ToFloat64(metrics.ImageImportRefusals.WithLabelValues(infrav1.ImageTooLargeReason)) - refusals; got != want {
				t.Errorf("%v refusals counted as %s, want %v", got, infrav1.ImageTooLargeReason, want)
			}
		})
	}

	t.Run("cancelled", func(t *testing.T) {
		timed := importsTimed(t, metrics.ImportCancelled)
		h := newGateHost()
		im := New(h, Options{})
		im.Ensure(key, a)
		recv(t, h.started, "import")
		im.Release(a)
		recv(t, h.canceled, "cancellation")
		// The attempt records its end after its host call returned.
		for deadline := time.Now().Add(5 * time.Second); importsTimed(t, metrics.ImportCancelled) == timed && time.Now().Before(deadline); {
			time.Sleep(5 * time.Millisecond)
		}
		if got := importsTimed(t, metrics.ImportCancelled) - timed; got != 1 {
			t.Errorf("%d attempts timed as cancelled, want 1", got)
		}
	})
}

// TestProgressCountsNewBytesOnly checks that the bytes counter follows an
// attempt's progress without counting a byte twice.
func TestProgressCountsNewBytesOnly(t *testing.T) {
	before := testutil.ToFloat64(metrics.ImageImportBytes)
	at := &attempt{}
	for _, read := range []int64{0, 100, 100, 250, 1000} {
		at.progress(read, 1000)
	}
	if got := testutil.ToFloat64(metrics.ImageImportBytes) - before; got != 1000 {
		t.Errorf("%v bytes counted, want 1000", got)
	}
	if at.read.Load() != 1000 || at.total.Load() != 1000 {
		t.Errorf("progress read %d of %d", at.read.Load(), at.total.Load())
	}
}
