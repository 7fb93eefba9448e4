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
