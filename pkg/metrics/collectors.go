package metrics

import (
	"context"
	"errors"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// States of a LibvirtMachine (the state label of capl_machines).
const (
	MachinePending     = "pending"
	MachineProvisioned = "provisioned"
	MachineDeleting    = "deleting"
	MachineFailed      = "failed"
)

// MachineState is the state capl_machines counts lm in: deleting once
// deleted, else failed after a terminal failure, else provisioned once
// reported so, else pending.
func MachineState(lm *infrav1.LibvirtMachine) string {
	switch {
	case !lm.DeletionTimestamp.IsZero():
		return MachineDeleting
	case lm.Status.FailureReason != nil || lm.Status.FailureMessage != nil:
		return MachineFailed
	case lm.Status.Initialization.IsProvisioned():
		return MachineProvisioned
	default:
		return MachinePending
	}
}

// listTimeout bounds a scrape's read of the manager's cache.
const listTimeout = 5 * time.Second

var machinesDesc = prometheus.NewDesc("capl_machines",
	"LibvirtMachines by namespace and state (pending, provisioned, deleting, failed), as the manager's cache holds them when scraped.",
	[]string{"namespace", "state"}, nil)

// machineStates collects capl_machines from a reader of LibvirtMachines.
type machineStates struct{ reader client.Reader }

// NewMachineStates is the collector of capl_machines, reading the
// LibvirtMachines from reader (the manager's cache) when scraped. Every
// namespace holding machines has a series per state, zeros included.
func NewMachineStates(reader client.Reader) prometheus.Collector {
	return machineStates{reader: reader}
}

func (m machineStates) Describe(ch chan<- *prometheus.Desc) { ch <- machinesDesc }

func (m machineStates) Collect(ch chan<- prometheus.Metric) {
	ctx, cancel := context.WithTimeout(context.Background(), listTimeout)
	defer cancel()
	list := &infrav1.LibvirtMachineList{}
	if err := m.reader.List(ctx, list); err != nil {
		ch <- prometheus.NewInvalidMetric(machinesDesc, err)
		return
	}
	counts := map[string]map[string]int{}
	for i := range list.Items {
		lm := &list.Items[i]
		if counts[lm.Namespace] == nil {
			counts[lm.Namespace] = map[string]int{MachinePending: 0, MachineProvisioned: 0, MachineDeleting: 0, MachineFailed: 0}
		}
		counts[lm.Namespace][MachineState(lm)]++
	}
	for ns, byState := range counts {
		for state, n := range byState {
			ch <- prometheus.MustNewConstMetric(machinesDesc, prometheus.GaugeValue, float64(n), ns, state)
		}
	}
}

const hostConnectedHelp = "1 when the manager's connection to a libvirt host is up, 0 while it is down (reconnecting), by host name (as status.domain.host shows it), URI and " +
	"credentials (namespace/Secret of a failure domain's credentialsRef, empty for the manager's own); one series per connection open when scraped."

var hostConnectedDesc = prometheus.NewDesc("capl_libvirt_host_connected", hostConnectedHelp, []string{"host", "uri", "credentials"}, nil)

// HostConnection is one connection of the manager to a libvirt host.
type HostConnection struct {
	// Host names the host as status.domain.host does; URI is its libvirt
	// URI; Credentials is namespace/Secret of the credentials the
	// connection was made with, empty for the manager's own.
	Host, URI, Credentials string
	Connected              bool
}

// hostConnections collects capl_libvirt_host_connected.
type hostConnections struct{ list func() []HostConnection }

// NewHostConnections is the collector of capl_libvirt_host_connected,
// calling list when scraped.
func NewHostConnections(list func() []HostConnection) prometheus.Collector {
	return hostConnections{list: list}
}

func (h hostConnections) Describe(ch chan<- *prometheus.Desc) { ch <- hostConnectedDesc }

func (h hostConnections) Collect(ch chan<- prometheus.Metric) {
	for _, c := range h.list() {
		v := 0.0
		if c.Connected {
			v = 1
		}
		ch <- prometheus.MustNewConstMetric(hostConnectedDesc, prometheus.GaugeValue, v, c.Host, c.URI, c.Credentials)
	}
}

// Serve is a manager Runnable that registers collectors bound to one
// manager (its cache, its hosts) with Registry while the manager runs,
// and unregisters them when it stops, so that a process building another
// manager later (the tests restart it) serves that one's. While another
// manager of the same process serves them, the later one's are left out.
type Serve struct {
	Registry   prometheus.Registerer
	Collectors []prometheus.Collector
}

// Start registers the collectors, waits for ctx to end and unregisters them.
func (s Serve) Start(ctx context.Context) error {
	var registered []prometheus.Collector
	for _, c := range s.Collectors {
		var already prometheus.AlreadyRegisteredError
		switch err := s.Registry.Register(c); {
		case err == nil:
			registered = append(registered, c)
		case errors.As(err, &already):
			ctrl.Log.WithName("metrics").Info("Another manager of this process serves these metrics")
		default:
			return err
		}
	}
	<-ctx.Done()
	for _, c := range registered {
		s.Registry.Unregister(c)
	}
	return nil
}

// NeedLeaderElection is false: every replica serves its own /metrics.
func (Serve) NeedLeaderElection() bool { return false }
