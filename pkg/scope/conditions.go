package scope

import (
	"fmt"
	"strings"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"

	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// conditionObject is an object a scope sets conditions and records events on.
type conditionObject interface {
	conditions.Setter
	runtime.Object
}

// setCondition sets a condition on obj. A transition to True, or to a
// reason that means something is wrong, is also recorded as an event
// (Normal or Warning); moving between waiting reasons is not. Messages must
// never contain bootstrap data.
func setCondition(rec record.EventRecorder, obj conditionObject, condType string, status metav1.ConditionStatus, reason, message string) {
	var old *metav1.Condition
	if c := conditions.Get(obj, condType); c != nil {
		prev := *c // Get points into the slice that Set updates in place
		old = &prev
	}
	conditions.Set(obj, metav1.Condition{Type: condType, Status: status, Reason: reason, Message: message})
	if old != nil && old.Status == status && old.Reason == reason {
		return
	}
	text := fmt.Sprintf("%s is %s", condType, status)
	if message != "" {
		text += ": " + message
	}
	switch {
	case status == metav1.ConditionTrue && (old == nil || old.Status != metav1.ConditionTrue):
		rec.Event(obj, corev1.EventTypeNormal, reason, text)
	case status == metav1.ConditionFalse && !isProgressReason(reason):
		rec.Event(obj, corev1.EventTypeWarning, reason, text)
	}
}

// isProgressReason tells the reasons of a False condition that mean
// "under way" rather than "something is wrong".
func isProgressReason(reason string) bool {
	return strings.HasPrefix(reason, "Waiting") || reason == infrav1.ProvisioningReason || reason == infrav1.DeletingReason
}

// MarkWaiting sets every step condition that is not True to False with
// reason: the machine waits for something outside the provider.
func (s *MachineScope) MarkWaiting(reason, message string) {
	for _, t := range StepConditions {
		if !conditions.IsTrue(s.LibvirtMachine, t) {
			s.SetCondition(t, metav1.ConditionFalse, reason, message)
		}
	}
}

// ClearWaiting replaces the given waiting reasons, once their wait is
// over, on step conditions not reached yet: they then say that they wait
// for the steps before them, not for something that already arrived.
func (s *MachineScope) ClearWaiting(reasons ...string) {
	for _, t := range StepConditions {
		c := conditions.Get(s.LibvirtMachine, t)
		if c == nil || c.Status == metav1.ConditionTrue {
			continue
		}
		for _, r := range reasons {
			if c.Reason == r {
				s.SetCondition(t, metav1.ConditionFalse, infrav1.ProvisioningReason, "Waiting for the earlier steps")
				break
			}
		}
	}
}
