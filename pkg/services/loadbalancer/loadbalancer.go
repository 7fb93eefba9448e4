// Package loadbalancer serves a cluster's control-plane endpoint: an
// HAProxy VM built by the machine services (address, disk, seed, domain)
// on a scope.LoadBalancerScope, whose reserved address is the endpoint and
// whose configuration follows the cluster's control-plane machines. The
// configuration is written, checked and reloaded through the guest agent,
// only when it changes. With load balancer type None the user's endpoint
// is checked for presence only.
package loadbalancer

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/netip"
	"strconv"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"

	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/address"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/disk"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Waits of the load balancer. The guest agent's connect event and the
// domain's lifecycle events normally come first; these cover lost events.
const (
	recheckAgent   = 15 * time.Second
	recheckServing = 5 * time.Second
	dialTimeout    = 3 * time.Second
	// shutdownTimeout is short: the VM holds no state, and it is only
	// deleted once no machine of the cluster remains.
	shutdownTimeout = time.Second
	// servingBound is how long HAProxy may take to serve before
	// LoadBalancerReady says it does not (LoadBalancerNotServing) rather
	// than that it is on its way: a TCG VM on a busy host boots in minutes.
	servingBound = 15 * time.Minute
)

// userData is the HAProxy VM's cloud-config. It configures nothing: the
// controller writes haproxy.cfg through the guest agent once the VM runs,
// so the seed holds no secret and never changes.
const userData = `#cloud-config
# HAProxy VM of a cluster-api-provider-libvirt cluster. The provider writes
# /etc/haproxy/haproxy.cfg through the guest agent.
`

// Service owns the LoadBalancerReady condition.
type Service struct {
	scope  *scope.ClusterScope
	vm     *scope.LoadBalancerScope
	images disk.Importer
}

var _ services.Service = (*Service)(nil)

// New returns the load balancer service of s; images imports the VM's
// image when spec.loadBalancer.image names a URL.
func New(s *scope.ClusterScope, images disk.Importer) *Service {
	return &Service{scope: s, vm: s.LoadBalancer(), images: images}
}

// Reconcile serves the endpoint. The cluster is provisioned once the
// HAProxy VM runs (type HAProxy) or the endpoint is set (type None);
// LoadBalancerReady turns True when the endpoint accepts connections.
func (svc *Service) Reconcile(ctx context.Context) error {
	if !svc.scope.LoadBalancerEnabled() {
		return svc.reconcileUserEndpoint()
	}
	watch := []func(context.Context) error{domain.New(svc.vm, shutdownTimeout).Reconcile, svc.provisioned, svc.reconcileConfig}
	if svc.scope.IsProvisioned() {
		// Once the VM ran (provisioned), its reservation, disk and seed are
		// settled: ensuring them on every reconcile would only cost libvirt
		// calls. They are ensured again when the domain has to be defined
		// anew and one of them is missing.
		if err := runAll(ctx, watch); err == nil || !virt.IsNotFound(err) {
			return err
		}
	}
	return runAll(ctx, append([]func(context.Context) error{
		svc.reconcileAddress,
		disk.New(svc.vm, svc.images).Reconcile,
		seed.NewWithUserData(svc.vm, []byte(userData)).Reconcile,
	}, watch...))
}

// provisioned reports the infrastructure provisioned once the HAProxy VM
// runs: its address is the published endpoint, and the control plane's
// first machine, which needs it only minutes into its own boot, then boots
// alongside it rather than after it.
func (svc *Service) provisioned(context.Context) error {
	svc.scope.SetProvisioned()
	return nil
}

// runAll runs steps in order until one fails.
func runAll(ctx context.Context, steps []func(context.Context) error) error {
	for _, step := range steps {
		if err := step(ctx); err != nil {
			return err
		}
	}
	return nil
}

// reconcileUserEndpoint: with type None the user serves the endpoint,
// which must be set; the infrastructure is provisioned with the network.
func (svc *Service) reconcileUserEndpoint() error {
	s := svc.scope
	ep := &s.LibvirtCluster.Spec.ControlPlaneEndpoint
	if ep.Host == "" {
		s.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.ControlPlaneEndpointMissingReason,
			"loadBalancer.type None: set spec.controlPlaneEndpoint to the endpoint you serve (e.g. a kube-vip address)")
		return services.Requeue(0, "no control-plane endpoint")
	}
	ep.Port = s.EndpointPort()
	s.MarkTrue(infrav1.LoadBalancerReadyCondition, infrav1.LoadBalancerDisabledReason,
		fmt.Sprintf("The user serves %s", net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port)))))
	s.SetProvisioned()
	return nil
}

// reconcileAddress reserves the VM's address before it first boots and
// publishes it as the control-plane endpoint at once.
func (svc *Service) reconcileAddress(ctx context.Context) error {
	s := svc.scope
	network := svc.vm.Network()
	switch {
	case network.IsZero():
		s.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.WaitingForNetworkReason, "Waiting for the cluster network")
		return services.Requeue(0, "no network")
	case network.Bridge != "":
		return svc.unsupported("host bridge " + network.Bridge)
	}
	if err := address.New(svc.vm).Reconcile(ctx); err != nil {
		return err
	}
	ip, err := svc.reservedAddress(ctx, network.Name)
	if err != nil {
		return err
	}
	s.LoadBalancerStatus().Address = ip.String()
	ep := &s.LibvirtCluster.Spec.ControlPlaneEndpoint
	switch ep.Host {
	case "":
		ep.Host, ep.Port = ip.String(), s.EndpointPort()
		s.Event(corev1.EventTypeNormal, "ControlPlaneEndpointSet", fmt.Sprintf("Control-plane endpoint is %s:%d, the HAProxy VM's reserved address", ep.Host, ep.Port))
		// Published before the VM exists: Cluster API and the control
		// plane provider need it to generate certificates.
		return s.PatchObject(ctx)
	case ip.String():
		return nil
	default:
		s.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.ControlPlaneEndpointConflictReason,
			"spec.controlPlaneEndpoint.host is %s but the HAProxy VM's address is %s; clear it, or use loadBalancer.type None", ep.Host, ip)
		return services.Requeue(0, "endpoint conflict")
	}
}

// reservedAddress is the IP the network's DHCP server keeps for the VM.
func (svc *Service) reservedAddress(ctx context.Context, network string) (netip.Addr, error) {
	entries, err := svc.scope.Host.Reservations(ctx, network)
	if errors.Is(err, virt.ErrNoDHCP) {
		return netip.Addr{}, svc.unsupported("network " + network + ", whose DHCP libvirt does not serve,")
	}
	if err != nil {
		svc.scope.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.LibvirtErrorReason, "Reading the reservations of network %s: %v", network, err)
		return netip.Addr{}, err
	}
	for _, e := range entries {
		if netalloc.SameMAC(e.MAC, svc.vm.MAC()) {
			return e.IP, nil
		}
	}
	svc.scope.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.ProvisioningReason, "No reservation for %s on network %s yet", svc.vm.MAC(), network)
	return netip.Addr{}, fmt.Errorf("no reservation for the HAProxy VM's MAC %s on network %s", svc.vm.MAC(), network)
}

func (svc *Service) unsupported(what string) error {
	svc.scope.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.UnsupportedNetworkReason,
		"The HAProxy VM cannot get a reserved address on %s; use loadBalancer.type None with your own endpoint", what)
	return services.Requeue(0, "unsupported network")
}

// reconcileConfig renders the configuration for the current backends and
// applies it when it differs from the one last applied; then it checks
// that the endpoint accepts connections. A configuration that was applied
// is only read back when the endpoint does not answer (e.g. the VM was
// recreated), so an unchanged backend set costs no guest-agent call and
// never reloads HAProxy.
func (svc *Service) reconcileConfig(ctx context.Context) error {
	s := svc.scope
	backends, err := DesiredBackends(ctx, s)
	if err != nil {
		return err
	}
	cfg, id, err := Config{FrontendPort: s.EndpointPort(), BackendPort: s.BackendPort(), Backends: backends}.Render()
	if err != nil {
		return err
	}
	st := s.LoadBalancerStatus()
	if st.ConfigHash == id {
		if err := svc.serving(); err == nil {
			return nil
		}
	}
	running, err := RunningConfigID(ctx, s.Host, svc.vm.DomainName())
	if errors.Is(err, virt.ErrAgentUnavailable) {
		svc.notServing("Waiting for the HAProxy VM's guest agent")
		return services.Requeue(recheckAgent, "guest agent not answering")
	}
	if err != nil {
		s.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.LibvirtErrorReason, "Asking HAProxy which configuration runs: %v", err)
		return err
	}
	if running != id {
		if err := svc.apply(ctx, cfg, id, backends); err != nil {
			return err
		}
	}
	// Also after a crash between the reload and the status patch: the
	// running configuration is recorded without reloading again.
	st.ConfigHash, st.Backends = id, backends
	if err := svc.serving(); err != nil {
		svc.notServing(fmt.Sprintf("HAProxy does not accept connections yet: %v", err))
		return services.Requeue(recheckServing, "endpoint not serving")
	}
	return nil
}

// notServing sets LoadBalancerReady False while HAProxy does not serve:
// WaitingForLoadBalancer, or LoadBalancerNotServing once that has lasted
// longer than servingBound.
func (svc *Service) notServing(message string) {
	s := svc.scope
	var since time.Time
	if c := conditions.Get(s.LibvirtCluster, infrav1.LoadBalancerReadyCondition); c != nil && c.Status == metav1.ConditionFalse {
		since = c.LastTransitionTime.Time
	}
	reason := notServingReason(since, time.Now(), servingBound)
	if reason == infrav1.LoadBalancerNotServingReason {
		message = fmt.Sprintf("HAProxy has not served for %s (since %s): %s; look at the VM's console (virsh console %s)",
			time.Since(since).Round(time.Second), since.UTC().Format(time.RFC3339), message, svc.vm.DomainName())
	}
	s.MarkFalse(infrav1.LoadBalancerReadyCondition, reason, "%s", message)
}

// notServingReason is LoadBalancerReady's reason when the endpoint has not
// served since since (zero: it just stopped, or never was False before).
func notServingReason(since, now time.Time, bound time.Duration) string {
	if !since.IsZero() && now.Sub(since) > bound {
		return infrav1.LoadBalancerNotServingReason
	}
	return infrav1.WaitingForLoadBalancerReason
}

// apply loads cfg into HAProxy and records it.
func (svc *Service) apply(ctx context.Context, cfg []byte, id string, backends []infrav1.LoadBalancerBackend) error {
	s := svc.scope
	start := time.Now()
	err := Apply(ctx, s.Host, svc.vm.DomainName(), cfg, id)
	var invalid *ConfigInvalidError
	var reload *ReloadError
	switch {
	case err == nil:
	case errors.Is(err, virt.ErrAgentUnavailable):
		s.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.WaitingForLoadBalancerReason, "Waiting for the HAProxy VM's guest agent: %v", err)
		return services.Requeue(recheckAgent, "guest agent not answering")
	case errors.As(err, &invalid):
		s.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.LoadBalancerConfigInvalidReason, "%v", err)
		return err
	case errors.As(err, &reload):
		s.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.LoadBalancerReloadFailedReason, "%v", err)
		return err
	default:
		s.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.LibvirtErrorReason, "Applying the HAProxy configuration: %v", err)
		return err
	}
	took := time.Since(start)
	s.LoadBalancerStatus().LastReloadTime = ptrNow()
	ctrl.LoggerFrom(ctx).Info("HAProxy configuration applied", "id", id, "backends", describe(backends), "took", took.String())
	s.Event(corev1.EventTypeNormal, "LoadBalancerReloaded",
		fmt.Sprintf("HAProxy loaded %s with backends [%s] in %s", id, describe(backends), took.Round(time.Millisecond)))
	return nil
}

// serving dials the endpoint from the manager's host and sets
// LoadBalancerReady when it accepts connections.
func (svc *Service) serving() error {
	s := svc.scope
	ep := s.LibvirtCluster.Spec.ControlPlaneEndpoint
	addr := net.JoinHostPort(ep.Host, strconv.Itoa(int(ep.Port)))
	conn, err := net.DialTimeout("tcp", addr, dialTimeout)
	if err != nil {
		return err
	}
	_ = conn.Close()
	backends := s.LoadBalancerStatus().Backends
	s.MarkTrue(infrav1.LoadBalancerReadyCondition, infrav1.ReadyReason,
		fmt.Sprintf("HAProxy accepts connections on %s; backends [%s]", addr, describe(backends)))
	return nil
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

// Delete removes the HAProxy VM in reverse order of creation: domain,
// seed, root disk, address reservation. Each treats not-found as success.
func (svc *Service) Delete(ctx context.Context) error {
	if svc.vm.MAC() == "" && svc.scope.LibvirtCluster.Status.LoadBalancer == nil {
		// Nothing was ever created: the MAC is persisted before anything is.
		return nil
	}
	for _, step := range []services.Service{
		domain.New(svc.vm, shutdownTimeout),
		seed.NewWithUserData(svc.vm, nil),
		disk.New(svc.vm, svc.images),
		address.New(svc.vm),
	} {
		if err := step.Delete(ctx); err != nil {
			svc.scope.MarkFalse(infrav1.LoadBalancerReadyCondition, infrav1.LibvirtErrorReason, "Deleting the HAProxy VM: %v", err)
			return err
		}
	}
	svc.scope.LibvirtCluster.Status.LoadBalancer = nil
	return nil
}
