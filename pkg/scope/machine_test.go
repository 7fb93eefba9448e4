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
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
)

func TestCloseSummarisesAndPatches(t *testing.T) {
	f := servicetest.NewFixture(t)
	s, _ := servicetest.Provision(t, f)
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

// TestIsControlPlane: the Machine's label or its infrastructure object's
// says so, whichever is known.
func TestIsControlPlane(t *testing.T) {
	labelled := map[string]string{clusterv1.MachineControlPlaneLabel: ""}
	for _, tc := range []struct {
		name            string
		machine, infra  map[string]string
		noMachine, noLM bool
		want            bool
	}{
		{name: "worker"},
		{name: "the Machine says so", machine: labelled, want: true},
		{name: "the LibvirtMachine says so", infra: labelled, want: true},
		{name: "the Machine is gone, the LibvirtMachine says so", noMachine: true, infra: labelled, want: true},
		{name: "the Machine alone, a worker", noLM: true},
		{name: "neither known", noMachine: true, noLM: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var m *clusterv1.Machine
			if !tc.noMachine {
				m = &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Labels: tc.machine}}
			}
			var infra metav1.Object
			if !tc.noLM {
				infra = &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Labels: tc.infra}}
			}
			if got := scope.IsControlPlane(m, infra); got != tc.want {
				t.Errorf("IsControlPlane = %v, want %v", got, tc.want)
			}
		})
	}
}
