// Package services defines what the provider's services share: the
// Service contract, the Plan that runs an object's services in order
// (forward on reconcile, backward on delete), and how a service reports
// its outcome: a Result when its step is done, a ConditionError when it
// failed or waits, wrapping a RequeueError or a TerminalError where the
// reconcile must wait or give up. Services set no conditions themselves:
// the plan sets the condition its step names on the object's scope.
//
// The services live in the subpackages, one per libvirt resource or
// check: references, pool and network of a cluster; address, disk, seed,
// domain and guest of a machine; loadbalancer, the HAProxy VM a cluster's
// endpoint runs on, built from the machine's services. imageimport is no
// step: it imports the base images the disk steps wait for, outside the
// reconciles.
package services

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Service reconciles and deletes one kind of libvirt resource or check.
// Both are idempotent; Delete treats not-found as success.
type Service interface {
	// Name labels the service in logs, in the plan's errors and in
	// capl_step_duration_seconds, so it is a constant; an implementation
	// needs no comment of its own.
	Name() string
	// Reconcile brings the resource closer to its desired state and
	// reports how far it got.
	Reconcile(ctx context.Context) (Result, error)
	// Delete removes what Reconcile created.
	Delete(ctx context.Context) error
}

// Result is what a service reports once its step is done: the reason and
// message of the condition its plan step names (True). The zero Result
// leaves that condition as it is: the step had nothing to say this time
// (e.g. a provisioned machine keeps the addresses last seen).
type Result struct {
	Reason  string
	Message string
}

// Done is the Result of a finished step.
func Done(reason, message string) Result { return Result{Reason: reason, Message: message} }

// ConditionError is a step that failed or waits, as its condition reports
// it: False with Reason and Message. Err is what the reconcile does about
// it: a RequeueError waits, a TerminalError gives up, any other error is
// retried with the controller's backoff.
type ConditionError struct {
	// Condition, when set, names the condition to report on, where it is
	// not the step's own: a reference check refuses on behalf of the step
	// that would use the reference.
	Condition string
	Reason    string
	Message   string
	Err       error
}

// Error is Err's text, so that logs and the reconcile's error show the
// step's own error; the condition carries Reason and Message.
func (e *ConditionError) Error() string { return e.Err.Error() }

// Unwrap exposes Err to errors.Is and errors.As.
func (e *ConditionError) Unwrap() error { return e.Err }

// Fail reports err on the step's condition with reason and a message
// (format and args, fmt.Sprintf's).
func Fail(reason string, err error, format string, args ...any) error {
	return &ConditionError{Reason: reason, Message: fmt.Sprintf(format, args...), Err: err}
}

// FailOn is Fail on condType rather than on the step's condition.
func FailOn(condType, reason string, err error, format string, args ...any) error {
	return &ConditionError{Condition: condType, Reason: reason, Message: fmt.Sprintf(format, args...), Err: err}
}

// Terminal reports a failure the object cannot recover from: the
// condition False with reason and the message, and a TerminalError with
// failureReason (Cluster API's MachineStatusError) and the same message.
func Terminal(failureReason, reason, format string, args ...any) error {
	msg := fmt.Sprintf(format, args...)
	return &ConditionError{Reason: reason, Message: msg, Err: &TerminalError{FailureReason: failureReason, Message: msg}}
}

// RequeueError stops the reconcile without reporting an error: the step
// waits for something its condition names. After zero means "until an
// event or a watched object changes"; otherwise the reconcile comes back
// after that long.
type RequeueError struct {
	After time.Duration
	Why   string
}

// Error says what the step waits for and, when timed, when it looks again.
func (e *RequeueError) Error() string {
	if e.After == 0 {
		return "waiting: " + e.Why
	}
	return fmt.Sprintf("waiting (recheck in %s): %s", e.After, e.Why)
}

// Requeue stops the step to wait for what why names: after 0, until an
// event; otherwise for that long (see RequeueError).
func Requeue(after time.Duration, why string) error { return &RequeueError{After: after, Why: why} }

// TerminalError means the object cannot be recovered: for a
// LibvirtMachine the reconciler records FailureReason and Message (for
// MachineHealthChecks) and stops reconciling it until it is deleted.
type TerminalError struct {
	// FailureReason is Cluster API's MachineStatusError, e.g. UpdateError.
	FailureReason string
	Message       string
}

// Error is the failure reason and message the object records.
func (e *TerminalError) Error() string { return e.FailureReason + ": " + e.Message }

// AsRequeue returns the RequeueError in err's chain.
func AsRequeue(err error) (*RequeueError, bool) {
	var rq *RequeueError
	return rq, errors.As(err, &rq)
}

// AsTerminal returns the TerminalError in err's chain.
func AsTerminal(err error) (*TerminalError, bool) {
	var te *TerminalError
	return te, errors.As(err, &te)
}
