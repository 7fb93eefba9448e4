// Package metrics holds the provider's Prometheus metrics, beside the
// libvirt call counters of pkg/virt: how long plan steps and machine
// creation take, the reconcile errors by condition reason, the image
// imports, and, read when scraped, the machines by state and whether each
// libvirt host is connected. The manager registers them with
// controller-runtime's registry, which its diagnostics endpoint serves
// on /metrics; docs/configuration.md lists them with their labels.
//
// The counters and histograms are process-wide, like controller-runtime's
// own; the collectors read when scraped belong to one manager (Serve).
package metrics

import (
	"errors"

	"github.com/prometheus/client_golang/prometheus"
)

// Outcomes of a plan step (StepDuration's outcome label).
const (
	OutcomeDone    = "done"
	OutcomeWaiting = "waiting"
	OutcomeError   = "error"
)

// Results of an image import attempt (ImageImportDuration's result label).
const (
	ImportImported  = "imported"
	ImportRefused   = "refused"
	ImportFailed    = "failed"
	ImportCancelled = "cancelled"
)

// ProvisionedStep is MachineProvisioning's step label for the whole
// creation: from the LibvirtMachine's creation until it is provisioned.
const ProvisionedStep = "Provisioned"

var (
	// StepDuration is how long one run of a plan step took.
	StepDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "capl_step_duration_seconds",
		Help: "Time one run of a plan step took, by kind of object, step, operation (reconcile or delete) and outcome (done, waiting, error).",
		// From a step with nothing to do (~1 ms) to a guest shutdown (minutes).
		Buckets: prometheus.ExponentialBuckets(0.001, 4, 10),
	}, []string{"kind", "step", "operation", "outcome"})

	// MachineProvisioning is how long after its creation a LibvirtMachine
	// first reached each step, and was provisioned.
	MachineProvisioning = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "capl_machine_provisioning_seconds",
		Help: "Time from a LibvirtMachine's creation until each step condition was first True, and until it was provisioned (step=\"Provisioned\"); " +
			"once per machine and step, not for objects recreated by clusterctl move or a restore.",
		// From a cached image and a fast guest (~10 s) to a TCG guest on a
		// busy host (tens of minutes).
		Buckets: []float64{5, 10, 20, 30, 45, 60, 90, 120, 180, 300, 600, 900, 1200, 1800, 3600},
	}, []string{"step"})

	// ReconcileErrors counts the conditions reconciles set False for
	// something wrong (not a wait).
	ReconcileErrors = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capl_reconcile_errors_total",
		Help: "Times a reconcile set a condition False for something wrong rather than a wait (the conditions that also raise Warning events), by kind, condition and reason.",
	}, []string{"kind", "condition", "reason"})

	// ImageImportBytes counts the bytes image imports read.
	ImageImportBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "capl_image_import_bytes_total",
		Help: "Bytes image imports read from their sources (URLs and file:// images), failed and cancelled attempts included, counted as they arrive.",
	})

	// ImageImportDuration is how long image import attempts took.
	ImageImportDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "capl_image_import_duration_seconds",
		Help: "Time one image import attempt took, by result (imported, refused, failed, cancelled).",
		// From a small local file (~0.1 s) to a slow download (an hour).
		Buckets: prometheus.ExponentialBuckets(0.1, 3, 11),
	}, []string{"result"})

	// ImageImportRefusals counts the images refused for what they are.
	ImageImportRefusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capl_image_import_refusals_total",
		Help: "Image import attempts refused for what the image is or where it comes from, by reason (the DiskReady reason of the machines waiting for it).",
	}, []string{"reason"})
)

// Register registers the counters and histograms with reg (the manager
// passes controller-runtime's registry). Registering them again with the
// same registry is not an error: a process may build more than one manager.
func Register(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{
		StepDuration, MachineProvisioning, ReconcileErrors,
		ImageImportBytes, ImageImportDuration, ImageImportRefusals,
	} {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &already) {
			return err
		}
	}
	return nil
}
