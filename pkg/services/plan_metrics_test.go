package services

import (
	"context"
	"errors"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/metrics"
)

// kindReporter is a scope whose object's kind labels the plan's metrics.
type kindReporter struct{ reported }

func (kindReporter) Kind() string { return "TestKind" }

func stepsTimed(t *testing.T, operation, outcome string) uint64 {
	t.Helper()
	var m dto.Metric
	h := metrics.StepDuration.WithLabelValues("TestKind", outcomeName, operation, outcome)
	if err := h.(prometheus.Metric).Write(&m); err != nil {
		t.Fatal(err)
	}
	return m.GetHistogram().GetSampleCount()
}

// outcomeName is what the outcome service is called.
const outcomeName = "outcome"

// TestPlanTimesSteps checks that every run of a step, forward or backward,
// is timed under the object's kind, the step and its outcome.
func TestPlanTimesSteps(t *testing.T) {
	plain := errors.New("virError: broken pipe")
	for _, tc := range []struct {
		name      string
		svc       outcome
		operation string
		want      string
	}{
		{"done", outcome{res: Done("Ready", "")}, "reconcile", metrics.OutcomeDone},
		{"waiting", outcome{err: Fail("WaitingForAddress", Requeue(0, "lease"), "no lease")}, "reconcile", metrics.OutcomeWaiting},
		{"failed", outcome{err: Fail("LibvirtError", plain, "broken")}, "reconcile", metrics.OutcomeError},
		{"deleted", outcome{}, "delete", metrics.OutcomeDone},
		{"delete failed", outcome{deleteErr: plain}, "delete", metrics.OutcomeError},
	} {
		t.Run(tc.name, func(t *testing.T) {
			before := stepsTimed(t, tc.operation, tc.want)
			plan := Plan{{Service: tc.svc, Condition: "DiskReady"}}
			s := &kindReporter{}
			if tc.operation == "delete" {
				_ = plan.Delete(context.Background(), s)
			} else {
				_ = plan.Run(context.Background(), s, false)
			}
			if got := stepsTimed(t, tc.operation, tc.want) - before; got != 1 {
				t.Errorf("%s of step %q timed %d times with outcome %s, want 1", tc.operation, outcomeName, got, tc.want)
			}
		})
	}
}
