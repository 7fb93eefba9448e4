package virt

import (
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The collectors are process-wide, like controller-runtime's own: one
// manager process has one libvirt Client per URI, and the figures answer
// "how much does the provider ask of libvirtd", whatever the connection.
var (
	libvirtCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "capl_libvirt_calls_total",
		Help: "Engine operations that talked to libvirtd, by operation. A retry after a reconnect counts once; " +
			"a guest-agent operation counts once per agent command.",
	}, []string{"operation"})
	libvirtCallDuration = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "capl_libvirt_call_duration_seconds",
		Help: "Time engine operations spent on libvirtd, including a reconnect, by operation.",
		// From a cached lookup (~0.5 ms) to an image import (minutes).
		Buckets: prometheus.ExponentialBuckets(0.0005, 4, 11),
	}, []string{"operation"})
)

// RegisterMetrics registers the engine's collectors with reg (the manager
// passes controller-runtime's registry, which its /metrics serves).
// Registering them again with the same registry is not an error: a process
// may build more than one manager.
func RegisterMetrics(reg prometheus.Registerer) error {
	for _, c := range []prometheus.Collector{libvirtCalls, libvirtCallDuration} {
		var already prometheus.AlreadyRegisteredError
		if err := reg.Register(c); err != nil && !errors.As(err, &already) {
			return err
		}
	}
	return nil
}

// observeCall records one operation that started at start.
func observeCall(op string, start time.Time) {
	libvirtCalls.WithLabelValues(op).Inc()
	libvirtCallDuration.WithLabelValues(op).Observe(time.Since(start).Seconds())
}
