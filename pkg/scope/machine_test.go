package scope_test

import (
	"context"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/servicetest"
)

func TestCloseSummarisesAndPatches(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := servicetest.Provision(t, f)
	s.MarkFalse(infrav1.DomainReadyCondition, infrav1.ProvisioningReason, "Defining")
	if err := s.Close(context.Background()); err != nil {
		t.Fatal(err)
	}
	stored := f.Stored()
	if c := conditions.Get(stored, clusterv1.ReadyCondition); c == nil || c.Status != metav1.ConditionFalse || !strings.Contains(c.Message, "DomainReady: Defining") {
		t.Errorf("Ready = %+v", c)
	}
	servicetest.WantCondition(t, stored, infrav1.BootstrapDataReadyCondition, metav1.ConditionTrue, infrav1.ReadyReason)
}

func TestConditionTransitionsRecordEvents(t *testing.T) {
	f := servicetest.NewFixture(t)
	s := f.Scope()
	drain := func() []string {
		var out []string
		for {
			select {
			case ev := <-f.Recorder.Events:
				out = append(out, ev)
			default:
				return out
			}
		}
	}
	s.MarkWaiting(infrav1.WaitingForBootstrapDataReason, "waiting")
	if evs := drain(); len(evs) != 0 {
		t.Errorf("waiting recorded events: %v", evs)
	}
	s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")
	s.MarkTrue(infrav1.DiskReadyCondition, infrav1.ReadyReason, "")
	if evs := drain(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Normal Ready DiskReady is True") {
		t.Errorf("events %v, want one Normal event for the transition to True", evs)
	}
	s.MarkFalse(infrav1.DiskReadyCondition, infrav1.PoolFullReason, "full")
	s.MarkFalse(infrav1.DiskReadyCondition, infrav1.PoolFullReason, "still full")
	if evs := drain(); len(evs) != 1 || !strings.HasPrefix(evs[0], "Warning PoolFull") {
		t.Errorf("events %v, want one Warning", evs)
	}
}
