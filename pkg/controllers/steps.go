package controllers

import (
	"context"
	"fmt"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
)

// step is one idempotent step of a reconcile; each sets its own condition.
type step struct {
	name string
	run  func(context.Context) error
}

// runSteps runs steps in order until one fails or waits, logging how long
// each took and how it ended.
func runSteps(ctx context.Context, steps []step) error {
	log := ctrl.LoggerFrom(ctx)
	for _, st := range steps {
		start := time.Now()
		err := st.run(ctx)
		log.V(4).Info("Step", "step", st.name, "took", time.Since(start).String(), "outcome", fmt.Sprint(err))
		if err != nil {
			return err
		}
	}
	return nil
}
