// Package seed turns the machine's bootstrap Secret into a NoCloud seed ISO
// volume. The bootstrap data only ever lives in memory and in that 0600
// volume: never in a log line, an event, a condition or a local file.
package seed

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/types"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// FormatCloudConfig is the only bootstrap data format supported.
const FormatCloudConfig = "cloud-config"

// recheckSecret is how often a missing bootstrap Secret is looked for; the
// bootstrap provider normally creates it before naming it.
const recheckSecret = 30 * time.Second

// Service owns the BootstrapDataReady condition.
type Service struct {
	scope scope.VM
	// userData returns the seed's user-data: the machine's bootstrap
	// Secret, or what the caller generated.
	userData func(context.Context) ([]byte, error)
}

var _ services.Service = (*Service)(nil)

// New returns the seed service of s, whose user-data is the Machine's
// bootstrap data.
func New(s *scope.MachineScope) *Service {
	return &Service{scope: s, userData: func(ctx context.Context) ([]byte, error) { return bootstrapData(ctx, s) }}
}

// NewWithUserData returns the seed service of a VM whose user-data the
// caller generates (the load balancer's). It must not be secret: it is not
// read from a Secret and may be rebuilt at any time.
func NewWithUserData(s scope.VM, userData []byte) *Service {
	return &Service{scope: s, userData: func(context.Context) ([]byte, error) { return userData, nil }}
}

// Reconcile uploads the seed unless it is known complete: the volume exists
// and BootstrapDataReady was persisted True after an upload. A volume
// without that record may be an upload cut short by a crash, so it is
// written again (same bytes: BuildISO is deterministic). Once the seed is
// complete the Secret is not read again.
func (svc *Service) Reconcile(ctx context.Context) error {
	s := svc.scope
	pool := s.Pool().Name
	_, err := s.LibvirtHost().VolumeInfo(ctx, pool, s.SeedVolume())
	switch {
	case err == nil && s.IsTrue(infrav1.BootstrapDataReadyCondition):
		return nil
	case err != nil && !virt.IsNotFound(err):
		s.MarkFalse(infrav1.BootstrapDataReadyCondition, infrav1.LibvirtErrorReason, "Looking up the seed volume: %v", err)
		return err
	}
	userData, err := svc.userData(ctx)
	if err != nil {
		return err
	}
	iso, err := cloudinit.BuildISO(cloudinit.Seed{
		InstanceID:    s.DomainUUID(),
		LocalHostname: s.Hostname(),
		UserData:      userData,
	})
	if err != nil {
		// Validation errors name the instance-id and hostname only.
		s.MarkFalse(infrav1.BootstrapDataReadyCondition, infrav1.LibvirtErrorReason, "Building the seed: %v", err)
		return services.Requeue(0, "invalid seed")
	}
	if _, err := s.LibvirtHost().UploadVolume(ctx, pool, s.SeedVolume(), iso); err != nil {
		reason := infrav1.LibvirtErrorReason
		if errors.Is(err, virt.ErrPoolFull) {
			reason = infrav1.PoolFullReason
		}
		s.MarkFalse(infrav1.BootstrapDataReadyCondition, reason, "Uploading the seed: %v", err)
		return err
	}
	s.MarkTrue(infrav1.BootstrapDataReadyCondition, infrav1.ReadyReason, "")
	return nil
}

// bootstrapData reads value and format from the Machine's bootstrap Secret.
func bootstrapData(ctx context.Context, s *scope.MachineScope) ([]byte, error) {
	name := s.BootstrapDataSecretName()
	if name == nil {
		s.MarkFalse(infrav1.BootstrapDataReadyCondition, infrav1.WaitingForBootstrapDataReason, "Waiting for the bootstrap provider")
		return nil, services.Requeue(0, "no bootstrap data")
	}
	secret := &corev1.Secret{}
	err := s.Client.Get(ctx, types.NamespacedName{Namespace: s.Namespace(), Name: *name}, secret)
	if apierrors.IsNotFound(err) {
		s.MarkFalse(infrav1.BootstrapDataReadyCondition, infrav1.BootstrapSecretNotFoundReason, "Bootstrap Secret %s not found", *name)
		return nil, services.Requeue(recheckSecret, "bootstrap secret missing")
	}
	if err != nil {
		return nil, fmt.Errorf("reading bootstrap Secret %s: %w", *name, err)
	}
	value, ok := secret.Data["value"]
	if !ok || len(value) == 0 {
		s.MarkFalse(infrav1.BootstrapDataReadyCondition, infrav1.BootstrapSecretNotFoundReason, "Bootstrap Secret %s has no value", *name)
		return nil, services.Requeue(recheckSecret, "bootstrap secret empty")
	}
	if format := strings.TrimSpace(string(secret.Data["format"])); format != "" && format != FormatCloudConfig {
		// The format is a short keyword, not bootstrap data; cap it anyway.
		if len(format) > 32 {
			format = format[:32] + "…"
		}
		s.MarkFalse(infrav1.BootstrapDataReadyCondition, infrav1.UnsupportedBootstrapFormatReason,
			"Bootstrap Secret %s has format %q; only %s is supported", *name, format, FormatCloudConfig)
		return nil, services.Requeue(2*recheckSecret, "unsupported bootstrap format")
	}
	return value, nil
}

// Delete removes the seed volume.
func (svc *Service) Delete(ctx context.Context) error {
	s := svc.scope
	if err := s.LibvirtHost().DeleteVolume(ctx, s.Pool().Name, s.SeedVolume()); err != nil && !virt.IsNotFound(err) {
		return fmt.Errorf("deleting the seed: %w", err)
	}
	return nil
}
