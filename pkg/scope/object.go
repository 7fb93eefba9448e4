package scope

import (
	"context"
	"fmt"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"
	"sigs.k8s.io/cluster-api/util/patch"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/metrics"
)

// patchedObject is the object a scope reconciles: it has conditions, and
// is patched at the end of the reconcile.
type patchedObject interface {
	conditionObject
	client.Object
}

// objectScope is what every scope does with its object: set conditions
// and record events on it, and patch it, summarising the step conditions
// into Ready.
type objectScope struct {
	obj      patchedObject
	recorder record.EventRecorder
	helper   *patch.Helper
	// steps are the conditions Ready summarises.
	steps []string
	// owned are the conditions the patch lets this controller win on
	// conflict.
	owned []string
	// writeBack, when set, writes what the reconcile kept apart from the
	// object (a scope's VM) into it before every patch.
	writeBack func()
	// kind labels the object's metrics (LibvirtMachine, LibvirtCluster).
	kind string
	// reached, when set, is told of each condition that turns True
	// (capl_machine_provisioning_seconds).
	reached func(condType string)
}

// newObjectScope snapshots obj for the patch; rec may be nil.
func newObjectScope(c client.Client, kind string, obj patchedObject, rec record.EventRecorder, steps []string) (objectScope, error) {
	helper, err := patch.NewHelper(obj, c)
	if err != nil {
		return objectScope{}, fmt.Errorf("creating patch helper: %w", err)
	}
	if rec == nil {
		rec = &record.FakeRecorder{}
	}
	owned := append([]string{clusterv1.ReadyCondition, clusterv1.PausedCondition}, steps...)
	return objectScope{obj: obj, recorder: rec, helper: helper, steps: steps, owned: owned, kind: kind}, nil
}

// Kind is the kind of the scope's object; it labels the plan's metrics.
func (o objectScope) Kind() string { return o.kind }

// SetCondition sets a condition. A transition to True, or to a reason
// that means something is wrong, is also recorded as an event (Normal or
// Warning); moving between waiting reasons is not. Messages must never
// contain bootstrap data. Each setting for something wrong counts in
// capl_reconcile_errors_total.
func (o objectScope) SetCondition(condType string, status metav1.ConditionStatus, reason, message string) {
	wasTrue := conditions.IsTrue(o.obj, condType)
	setCondition(o.recorder, o.obj, condType, status, reason, message)
	switch {
	case status == metav1.ConditionFalse && !isProgressReason(reason):
		metrics.ReconcileErrors.WithLabelValues(o.kind, condType, reason).Inc()
	case status == metav1.ConditionTrue && !wasTrue && o.reached != nil:
		o.reached(condType)
	}
}

// MarkTrue sets condType True with reason.
func (o objectScope) MarkTrue(condType, reason, message string) {
	o.SetCondition(condType, metav1.ConditionTrue, reason, message)
}

// MarkFalse sets condType False with reason.
func (o objectScope) MarkFalse(condType, reason, format string, args ...any) {
	o.SetCondition(condType, metav1.ConditionFalse, reason, fmt.Sprintf(format, args...))
}

// Event records an event on the object.
func (o objectScope) Event(eventType, reason, message string) {
	o.recorder.Event(o.obj, eventType, reason, message)
}

// PatchObject persists the object now: before creating something in
// libvirt whose identity must survive a crash (finalizer, MAC, placement),
// or to publish what others wait for (the control-plane endpoint).
func (o objectScope) PatchObject(ctx context.Context) error {
	if o.writeBack != nil {
		o.writeBack()
	}
	return o.helper.Patch(ctx, o.obj, patch.WithOwnedConditions{Conditions: o.owned})
}

// Close computes the Ready summary and persists the object. An object
// that is gone (its finalizer was just removed) is success.
func (o objectScope) Close(ctx context.Context) error {
	if err := conditions.SetSummaryCondition(o.obj, o.obj, clusterv1.ReadyCondition, conditions.ForConditionTypes(o.steps)); err != nil {
		return fmt.Errorf("summarising conditions: %w", err)
	}
	if err := o.PatchObject(ctx); err != nil && !apierrors.IsNotFound(err) {
		return err
	}
	return nil
}
