package services

import (
	"context"
	"fmt"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/metrics"
)

// Step is one entry of a Plan: a service and the condition its outcome
// sets.
type Step struct {
	Service Service
	// Condition is set from the service's outcome (see Report); empty when
	// the service sets none of its own (it runs a plan of its own, or
	// names the condition in each ConditionError).
	Condition string
	// SkipOnceProvisioned marks a step whose objects, once the object is
	// provisioned, belong to what later steps made of them: ensuring them
	// again would cost libvirt calls on every reconcile and could recreate
	// a vanished root disk as a blank one, so a provisioned object skips
	// them.
	SkipOnceProvisioned bool
	// PartOf names the larger thing the step builds one part of, which
	// Condition reports on as a whole (the load balancer's HAProxy VM,
	// built by the machine services, on LoadBalancerReady): the step's
	// successes leave Condition to the later step that finds the whole
	// ready, and its failures name the whole ("HAProxy VM capl-a.b_lb:
	// ...").
	PartOf string
}

// report sets the step's condition from its service's outcome (Report),
// on behalf of the whole the step is part of, if any.
func (st Step) report(s Reporter, res Result, err error) {
	if st.PartOf != "" {
		res = Result{}
		if ce, ok := err.(*ConditionError); ok { //nolint:errorlint // services return it unwrapped
			err = &ConditionError{Condition: ce.Condition, Reason: ce.Reason, Message: st.PartOf + ": " + ce.Message, Err: ce.Err}
		}
	}
	Report(s, st.Condition, res, err)
}

// deleteFailed is the failure of a step's Delete. A part's is reported on
// the whole's condition, which has no step left to say why it is not
// gone; a step's own is the reconcile's error.
func (st Step) deleteFailed(s Reporter, err error) {
	if st.PartOf != "" {
		err = Fail(infrav1.LibvirtErrorReason, err, "Deleting the %s: %v", st.PartOf, err)
	}
	Report(s, st.Condition, Result{}, err)
}

// Plan is an object's services in the order they create things. Written
// once: Run walks it forward, Delete backward.
//
// A step's outcome sets one condition, its Condition, with two exceptions
// that the API's conditions force. A step that builds one part of a
// whole (PartOf: the HAProxy VM's steps, on LoadBalancerReady) reports
// only its failures, since the condition says whether the whole serves.
// And a reference check refuses, in one step before anything exists, on
// behalf of the steps that would use what it refuses (a pool on DiskReady,
// a network on AddressReserved): each refusal's ConditionError names its
// condition, so that a refused object reports where a user looks for that
// part, all refusals at once.
type Plan []Step

// Reporter is the scope whose object the steps' conditions are set on.
type Reporter interface {
	SetCondition(condType string, status metav1.ConditionStatus, reason, message string)
}

// FailureRecorder is a Reporter whose object records terminal failures
// (a LibvirtMachine, for MachineHealthChecks). A terminal failure of any
// other object is retried like an error.
type FailureRecorder interface {
	SetFailure(reason, message string)
}

// Run runs the steps forward until one fails or waits; provisioned skips
// the SkipOnceProvisioned steps. Each step's outcome sets its condition on s as soon as
// the step returns, so conditions and events come in the order of the
// steps. The failing step's error is returned as it is: a plan run inside
// a service leaves it to the service's caller.
func (p Plan) Run(ctx context.Context, s Reporter, provisioned bool) error {
	return p.RunSettled(ctx, s, func() bool { return provisioned })
}

// RunSettled is Run where settled, asked before each SkipOnceProvisioned
// step, tells whether the object's build is settled: a step before it may
// have found that what it built is gone (a disposable VM's domain).
func (p Plan) RunSettled(ctx context.Context, s Reporter, settled func() bool) error {
	log := ctrl.LoggerFrom(ctx)
	for _, st := range p {
		if st.SkipOnceProvisioned && settled() {
			continue
		}
		start := time.Now()
		res, err := st.Service.Reconcile(ctx)
		took := time.Since(start)
		observeStep(s, st, "reconcile", took, err)
		log.V(4).Info("Step", "step", st.Service.Name(), "took", took.String(), "outcome", fmt.Sprint(err))
		st.report(s, res, err)
		if err != nil {
			return err
		}
	}
	return nil
}

// Reconcile is Run for a reconciler: it returns what the reconcile
// returns (see Outcome).
func (p Plan) Reconcile(ctx context.Context, s Reporter, provisioned bool) (ctrl.Result, error) {
	return Outcome(s, p.Run(ctx, s, provisioned))
}

// Delete deletes in reverse order of creation until a step fails; the
// failure sets the step's condition like Run's.
func (p Plan) Delete(ctx context.Context, s Reporter) error {
	for i := len(p) - 1; i >= 0; i-- {
		st := p[i]
		start := time.Now()
		err := st.Service.Delete(ctx)
		observeStep(s, st, "delete", time.Since(start), err)
		if err != nil {
			st.deleteFailed(s, err)
			return err
		}
	}
	return nil
}

// observeStep records one run of st in capl_step_duration_seconds, under
// the kind of s's object when s tells it.
func observeStep(s Reporter, st Step, operation string, took time.Duration, err error) {
	kind := ""
	if k, ok := s.(interface{ Kind() string }); ok {
		kind = k.Kind()
	}
	outcome := metrics.OutcomeDone
	if _, waiting := AsRequeue(err); waiting {
		outcome = metrics.OutcomeWaiting
	} else if err != nil {
		outcome = metrics.OutcomeError
	}
	metrics.StepDuration.WithLabelValues(kind, st.Service.Name(), operation, outcome).Observe(took.Seconds())
}

// Report sets a step's condition from its service's outcome: True with a
// Result's reason and message (a zero Result leaves it), False with those
// of each ConditionError in err, on the condition the error names or else
// condType. An error without a ConditionError sets nothing: the
// reconcile's error reports it.
func Report(s Reporter, condType string, res Result, err error) {
	if err == nil {
		if condType != "" && res.Reason != "" {
			s.SetCondition(condType, metav1.ConditionTrue, res.Reason, res.Message)
		}
		return
	}
	for _, ce := range conditionErrors(err) {
		t := ce.Condition
		if t == "" {
			t = condType
		}
		if t != "" {
			s.SetCondition(t, metav1.ConditionFalse, ce.Reason, ce.Message)
		}
	}
}

// conditionErrors are the outermost ConditionErrors in err's tree, in
// order (errors.Join keeps a check's refusals in the order found).
func conditionErrors(err error) []*ConditionError {
	if ce, ok := err.(*ConditionError); ok { //nolint:errorlint // the outermost, not any in the chain
		return []*ConditionError{ce}
	}
	switch u := err.(type) {
	case interface{ Unwrap() []error }:
		var out []*ConditionError
		for _, e := range u.Unwrap() {
			out = append(out, conditionErrors(e)...)
		}
		return out
	case interface{ Unwrap() error }:
		return conditionErrors(u.Unwrap())
	}
	return nil
}

// Outcome turns a plan's error into the reconcile's result: waits requeue
// without an error; a terminal failure is recorded where s records them
// and not retried; anything else is retried with the controller's
// backoff.
func Outcome(s Reporter, err error) (ctrl.Result, error) {
	if err == nil {
		return ctrl.Result{}, nil
	}
	if rq, ok := AsRequeue(err); ok {
		return ctrl.Result{RequeueAfter: rq.After}, nil
	}
	if te, ok := AsTerminal(err); ok {
		if f, ok := s.(FailureRecorder); ok {
			f.SetFailure(te.FailureReason, te.Message)
			return ctrl.Result{}, nil
		}
	}
	return ctrl.Result{}, err
}

// Provisioner is an object that is reported provisioned once: a
// LibvirtMachine once its VM runs with an address, a LibvirtCluster once
// its endpoint is served.
type Provisioner interface {
	IsProvisioned() bool
	SetProvisioned()
}

// MarkProvisioned is the step that reports o provisioned; it is never
// reset, so its Delete does nothing.
func MarkProvisioned(o Provisioner) Service { return provisioned{o} }

type provisioned struct{ o Provisioner }

func (provisioned) Name() string { return "provisioned" }

func (p provisioned) Reconcile(context.Context) (Result, error) {
	p.o.SetProvisioned()
	return Result{}, nil
}

func (provisioned) Delete(context.Context) error { return nil }
