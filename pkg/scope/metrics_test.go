package scope_test

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	dto "github.com/prometheus/client_model/go"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/metrics"
)

// TestReconcileErrorsCounted checks that every setting of a condition
// False for something wrong counts, by kind, condition and reason, and
// that waits and successes do not.
func TestReconcileErrorsCounted(t *testing.T) {
	s := servicetest.NewFixture(t).Scope()
	count := func(reason string) float64 {
		return testutil.ToFloat64(metrics.ReconcileErrors.WithLabelValues("LibvirtMachine", infrav1.DiskReadyCondition, reason))
	}
	full, waiting := count(infrav1.PoolFullReason), count(infrav1.WaitingForImageImportReason)
	s.MarkFalse(infrav1.DiskReadyCondition, infrav1.PoolFullReason, "full")
	s.MarkFalse(infrav1.DiskReadyCondition, infrav1.PoolFullReason, "still full")
	s.MarkFalse(infrav1.DiskReadyCondition, infrav1.WaitingForImageImportReason, "importing")
	s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")
	if got := count(infrav1.PoolFullReason) - full; got != 2 {
		t.Errorf("PoolFull counted %v times, want 2 (once per reconcile reporting it)", got)
	}
	if got := count(infrav1.WaitingForImageImportReason) - waiting; got != 0 {
		t.Errorf("a wait counted %v times as an error", got)
	}
}

func provisioningTimed(t *testing.T, step string) (n uint64, sum float64) {
	t.Helper()
	var m dto.Metric
	if err := metrics.MachineProvisioning.WithLabelValues(step).(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount(), m.GetHistogram().GetSampleSum()
}

// TestMachineProvisioningTimed checks capl_machine_provisioning_seconds:
// a new machine's steps are timed from its creation as their conditions
// turn True, and its provisioning once; a step turning True again after
// the machine was provisioned is not, and neither is a machine that
// clusterctl move recreated (identity, no status).
func TestMachineProvisioningTimed(t *testing.T) {
	for _, tc := range []struct {
		name      string
		recreated bool
		want      uint64
	}{
		{"new machine", false, 1},
		{"recreated by clusterctl move", true, 0},
	} {
		t.Run(tc.name, func(t *testing.T) {
			f := servicetest.NewFixture(t)
			if !tc.recreated {
				f.LM.Spec.ProviderID = "" // chosen by this reconcile
			}
			f.LM.CreationTimestamp = metav1.NewTime(time.Now().Add(-90 * time.Second))
			disk, diskSum := provisioningTimed(t, infrav1.DiskReadyCondition)
			prov, provSum := provisioningTimed(t, metrics.ProvisionedStep)

			s := f.Scope()
			s.MarkFalse(infrav1.DiskReadyCondition, infrav1.ProvisioningReason, "creating")
			s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")
			s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")
			s.SetProvisioned()
			s.SetProvisioned()
			// After provisioning, a step flapping is no creation milestone.
			s.MarkFalse(infrav1.DiskReadyCondition, infrav1.LibvirtErrorReason, "broken")
			s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")

			n, sum := provisioningTimed(t, infrav1.DiskReadyCondition)
			if n-disk != tc.want {
				t.Errorf("DiskReady timed %d times, want %d", n-disk, tc.want)
			}
			if tc.want == 1 && sum-diskSum < 90 {
				t.Errorf("DiskReady timed at %.1fs, want the 90s since creation", sum-diskSum)
			}
			n, sum = provisioningTimed(t, metrics.ProvisionedStep)
			if n-prov != tc.want {
				t.Errorf("Provisioned timed %d times, want %d", n-prov, tc.want)
			}
			if tc.want == 1 && sum-provSum < 90 {
				t.Errorf("Provisioned timed at %.1fs, want the 90s since creation", sum-provSum)
			}
		})
	}
}
