package loadbalancer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// configSync keeps HAProxy's configuration in step with the cluster's
// control-plane machines and reports whether the endpoint serves.
type configSync struct {
	svc *Service
	vm  *scope.VM
}

func (configSync) Name() string { return "configuration" }

// Delete does nothing: the configuration goes with the VM.
func (configSync) Delete(context.Context) error { return nil }

// Reconcile renders the configuration for the current backends and
// applies it when it differs from the one last applied; then it checks
// that the endpoint accepts connections. A configuration that was applied
// is only read back when the endpoint does not answer (e.g. the VM was
// recreated), so an unchanged backend set costs no guest-agent call and
// never reloads HAProxy.
func (c configSync) Reconcile(ctx context.Context) (services.Result, error) {
	svc := c.svc
	s := svc.scope
	backends, err := DesiredBackends(ctx, s)
	if err != nil {
		return services.Result{}, err
	}
	cfg, id, err := Config{FrontendPort: s.EndpointPort(), BackendPort: s.BackendPort(), Backends: backends}.Render()
	if err != nil {
		return services.Result{}, err
	}
	st := s.LoadBalancerStatus()
	if st.ConfigHash == id {
		if res, err := c.serving(); err == nil {
			return res, nil
		}
	}
	running, err := RunningConfigID(ctx, s.Host, c.vm.Domain)
	if errors.Is(err, virt.ErrAgentUnavailable) {
		return services.Result{}, c.notServing("Waiting for the HAProxy VM's guest agent", services.Requeue(recheckAgent, "guest agent not answering"))
	}
	if err != nil {
		return services.Result{}, services.Fail(infrav1.LibvirtErrorReason, err, "Asking HAProxy which configuration runs: %v", err)
	}
	if running != id {
		if err := c.apply(ctx, cfg, id, backends); err != nil {
			return services.Result{}, err
		}
	}
	// Also after a crash between the reload and the status patch: the
	// running configuration is recorded without reloading again.
	st.ConfigHash, st.Backends = id, backends
	res, err := c.serving()
	if err != nil {
		return services.Result{}, c.notServing(fmt.Sprintf("HAProxy does not accept connections yet: %v", err),
			services.Requeue(recheckServing, "endpoint not serving"))
	}
	return res, nil
}

// notServing reports LoadBalancerReady False while HAProxy does not serve:
// WaitingForLoadBalancer, or LoadBalancerNotServing once that has lasted
// longer than servingBound since status.loadBalancer.notServingSince.
func (c configSync) notServing(message string, wait error) error {
	st := c.svc.scope.LoadBalancerStatus()
	if st.NotServingSince == nil {
		st.NotServingSince = ptrNow()
	}
	since := st.NotServingSince.Time
	reason := notServingReason(since, time.Now(), servingBound)
	if reason == infrav1.LoadBalancerNotServingReason {
		message = fmt.Sprintf("HAProxy has not served for %s (since %s): %s; look at the VM's console (virsh console %s)",
			time.Since(since).Round(time.Second), since.UTC().Format(time.RFC3339), message, c.vm.Domain)
	}
	return services.Fail(reason, wait, "%s", message)
}

// notServingReason is LoadBalancerReady's reason when the endpoint has not
// served since since (zero: it was never found not serving).
func notServingReason(since, now time.Time, bound time.Duration) string {
	if !since.IsZero() && now.Sub(since) > bound {
		return infrav1.LoadBalancerNotServingReason
	}
	return infrav1.WaitingForLoadBalancerReason
}

// apply loads cfg into HAProxy and records it.
func (c configSync) apply(ctx context.Context, cfg []byte, id string, backends []infrav1.LoadBalancerBackend) error {
	s := c.svc.scope
	start := time.Now()
	err := Apply(ctx, s.Host, c.vm.Domain, cfg, id)
	var invalid *ConfigInvalidError
	var reload *ReloadError
	switch {
	case err == nil:
	case errors.Is(err, virt.ErrAgentUnavailable):
		return services.Fail(infrav1.WaitingForLoadBalancerReason, services.Requeue(recheckAgent, "guest agent not answering"),
			"Waiting for the HAProxy VM's guest agent: %v", err)
	case errors.As(err, &invalid):
		return services.Fail(infrav1.LoadBalancerConfigInvalidReason, err, "%v", err)
	case errors.As(err, &reload):
		return services.Fail(infrav1.LoadBalancerReloadFailedReason, err, "%v", err)
	default:
		return services.Fail(infrav1.LibvirtErrorReason, err, "Applying the HAProxy configuration: %v", err)
	}
	took := time.Since(start)
	s.LoadBalancerStatus().LastReloadTime = ptrNow()
	ctrl.LoggerFrom(ctx).Info("HAProxy configuration applied", "id", id, "backends", describe(backends), "took", took.String())
	s.Event(corev1.EventTypeNormal, "LoadBalancerReloaded",
		fmt.Sprintf("HAProxy loaded %s with backends [%s] in %s", id, describe(backends), took.Round(time.Millisecond)))
	return nil
}

// serving dials the endpoint from the manager's host; once it accepts
// connections, LoadBalancerReady is True.
func (c configSync) serving() (services.Result, error) {
	s := c.svc.scope
	ep := s.LibvirtCluster.Spec.ControlPlaneEndpoint
	addr := net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port)))
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return services.Result{}, err
	}
	_ = conn.Close()
	s.LoadBalancerStatus().NotServingSince = nil
	backends := s.LoadBalancerStatus().Backends
	return services.Done(infrav1.ReadyReason, fmt.Sprintf("HAProxy accepts connections on %s; backends [%s]", addr, describe(backends))), nil
}

// describe lists backends for messages: "name=address(State)".
func describe(backends []infrav1.LoadBalancerBackend) string {
	parts := make([]string, 0, len(backends))
	for _, b := range backends {
		parts = append(parts, fmt.Sprintf("%s=%s(%s)", b.Machine, b.Address, b.State))
	}
	return strings.Join(parts, " ")
}

func ptrNow() *metav1.Time {
	t := metav1.Now()
	return &t
}
