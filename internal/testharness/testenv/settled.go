package testenv

import (
	"fmt"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"sigs.k8s.io/controller-runtime/pkg/metrics"
)

// Activity is what a controller of the in-process manager had taken up
// and finished at one moment, read from controller-runtime's metrics:
// counters only, since a manager stopped with a request in its queue
// leaves the queue-depth gauge of its controller's name raised for the
// managers that follow it in the process.
type Activity struct {
	controller string
	// added counts the requests ever added to the controller's queue (a
	// request already waiting there is not added twice); reconciled
	// counts the reconciles that ended, whatever their result.
	added, reconciled float64
}

// ActivityOf reads the controller's activity now. Take it before a change
// that the controller must ignore, then WaitSettled after the change.
func ActivityOf(t testing.TB, controller string) Activity {
	t.Helper()
	families, err := metrics.Registry.Gather()
	if err != nil {
		t.Fatalf("reading controller-runtime's metrics: %v", err)
	}
	a := Activity{controller: controller}
	for _, f := range families {
		var sum *float64
		switch f.GetName() {
		case "workqueue_adds_total":
			sum = &a.added
		case "controller_runtime_reconcile_total":
			sum = &a.reconciled
		default:
			continue
		}
		for _, m := range f.GetMetric() {
			if label(m, "controller") == controller {
				*sum += m.GetCounter().GetValue()
			}
		}
	}
	return a
}

// WaitSettled waits until the controller took up a request after a (the
// change made since: an event of the object it must ignore) and ended as
// many reconciles as requests were added since, so that the change was
// handled: what a test asserting that nothing happened asserts then,
// rather than after a guessed sleep.
func (a Activity) WaitSettled(t testing.TB, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		now := ActivityOf(t, a.controller)
		if added := now.added - a.added; added > 0 && now.reconciled-a.reconciled >= added {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("controller %s did not settle within %s after the change: %s (before it: %s)", a.controller, timeout, now, a)
		}
		time.Sleep(50 * time.Millisecond)
	}
}

// String tells the activity's figures.
func (a Activity) String() string {
	return fmt.Sprintf("%g requests added, %g reconciles ended", a.added, a.reconciled)
}

// label is the value of m's label name, or "".
func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}
