// Package services holds one service per libvirt resource of a machine
// (address reservation, disk, seed, domain, guest), each reconciling its
// resource and setting its own condition on the machine scope. This file
// defines how a step tells the reconciler to wait or to give up.
package services

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Service reconciles and deletes one kind of libvirt resource of a
// machine. Both are idempotent; Delete treats not-found as success.
type Service interface {
	Reconcile(ctx context.Context) error
	Delete(ctx context.Context) error
}

// RequeueError stops the reconcile without reporting an error: the step
// waits for something its condition names. After zero means "until an
// event or a watched object changes"; otherwise the reconcile comes back
// after that long.
type RequeueError struct {
	After time.Duration
	Why   string
}

func (e *RequeueError) Error() string {
	if e.After == 0 {
		return "waiting: " + e.Why
	}
	return fmt.Sprintf("waiting (recheck in %s): %s", e.After, e.Why)
}

// Requeue returns a RequeueError.
func Requeue(after time.Duration, why string) error { return &RequeueError{After: after, Why: why} }

// TerminalError means the machine cannot be recovered: the reconciler
// records FailureReason and Message on the LibvirtMachine (for
// MachineHealthChecks) and stops reconciling it until it is deleted. The
// step has already set its condition.
type TerminalError struct {
	// FailureReason is Cluster API's MachineStatusError, e.g. UpdateError.
	FailureReason string
	Message       string
}

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
