package services

import (
	"context"
	"errors"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
)

// outcome is a service whose Reconcile and Delete return what it is given.
type outcome struct {
	res       Result
	err       error
	deleteErr error
}

func (outcome) Name() string                                { return "outcome" }
func (o outcome) Reconcile(context.Context) (Result, error) { return o.res, o.err }
func (o outcome) Delete(context.Context) error              { return o.deleteErr }

type reportedCondition struct {
	condType string
	status   metav1.ConditionStatus
	reason   string
	message  string
}

// reported records the conditions a plan sets, in order.
type reported []reportedCondition

func (r *reported) SetCondition(t string, st metav1.ConditionStatus, reason, message string) {
	*r = append(*r, reportedCondition{t, st, reason, message})
}

func TestStepReportsOnBehalfOfItsWhole(t *testing.T) {
	const cond = "LoadBalancerReady"
	plain := errors.New("virError: broken pipe")
	tests := []struct {
		name   string
		step   Step
		delete bool
		want   reported
	}{
		{
			name: "own step: success sets its condition True",
			step: Step{Service: outcome{res: Done("Ready", "disk ready")}, Condition: cond},
			want: reported{{cond, metav1.ConditionTrue, "Ready", "disk ready"}},
		},
		{
			name: "part: success leaves the condition to a later step",
			step: Step{Service: outcome{res: Done("Ready", "disk ready")}, Condition: cond, PartOf: "HAProxy VM ns.c_lb"},
		},
		{
			name: "own step: failure as the service says it",
			step: Step{Service: outcome{err: Fail("ImageNotFound", plain, "no image")}, Condition: cond},
			want: reported{{cond, metav1.ConditionFalse, "ImageNotFound", "no image"}},
		},
		{
			name: "part: failure names the whole",
			step: Step{Service: outcome{err: Fail("ImageNotFound", plain, "no image")}, Condition: cond, PartOf: "HAProxy VM ns.c_lb"},
			want: reported{{cond, metav1.ConditionFalse, "ImageNotFound", "HAProxy VM ns.c_lb: no image"}},
		},
		{
			name: "part: a refusal on another condition stays there",
			step: Step{Service: outcome{err: FailOn("Other", "Refused", plain, "refused")}, Condition: cond, PartOf: "HAProxy VM ns.c_lb"},
			want: reported{{"Other", metav1.ConditionFalse, "Refused", "HAProxy VM ns.c_lb: refused"}},
		},
		{
			name: "part: a plain error sets nothing (the reconcile's error says it)",
			step: Step{Service: outcome{err: plain}, Condition: cond, PartOf: "HAProxy VM ns.c_lb"},
		},
		{
			name:   "own step: a plain Delete failure sets nothing",
			step:   Step{Service: outcome{deleteErr: plain}, Condition: cond},
			delete: true,
		},
		{
			name:   "part: a Delete failure is the whole's",
			step:   Step{Service: outcome{deleteErr: plain}, Condition: cond, PartOf: "HAProxy VM ns.c_lb"},
			delete: true,
			want:   reported{{cond, metav1.ConditionFalse, "LibvirtError", "Deleting the HAProxy VM ns.c_lb: virError: broken pipe"}},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var got reported
			var err error
			if tc.delete {
				err = Plan{tc.step}.Delete(context.Background(), &got)
			} else {
				err = Plan{tc.step}.Run(context.Background(), &got, false)
			}
			o := tc.step.Service.(outcome)
			want := o.err
			if tc.delete {
				want = o.deleteErr
			}
			if (err == nil) != (want == nil) || want != nil && !errors.Is(err, plain) {
				t.Errorf("plan returned %v, want the service's error %v", err, want)
			}
			if len(got) != len(tc.want) {
				t.Fatalf("conditions %+v, want %+v", got, tc.want)
			}
			for i := range got {
				if got[i] != tc.want[i] {
					t.Errorf("condition %d: %+v, want %+v", i, got[i], tc.want[i])
				}
			}
		})
	}
}
