package controllers_test

import (
	"context"
	"errors"
	"net/netip"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// hookHost wraps the real Host to act around the create steps: simulate a
// crash right after a step succeeded in libvirt, or restart libvirtd before
// a step runs.
type hookHost struct {
	virt.Host
	before func(ctx context.Context, method, object string)
	after  func(ctx context.Context, method string, err error) error
}

func (w *hookHost) run(ctx context.Context, method, object string, fn func() error) error {
	if w.before != nil {
		w.before(ctx, method, object)
	}
	err := fn()
	if w.after != nil {
		err = w.after(ctx, method, err)
	}
	return err
}

func (w *hookHost) ReserveAddress(ctx context.Context, network string, r virt.Reservation) (ip netip.Addr, err error) {
	err = w.run(ctx, "ReserveAddress", r.MAC.String(), func() error { ip, err = w.Host.ReserveAddress(ctx, network, r); return err })
	return ip, err
}

func (w *hookHost) ImportImage(ctx context.Context, img virt.ImageImport) (info virt.VolumeInfo, err error) {
	err = w.run(ctx, "ImportImage", img.Volume, func() error { info, err = w.Host.ImportImage(ctx, img); return err })
	return info, err
}

func (w *hookHost) EnsureOverlay(ctx context.Context, spec virt.OverlaySpec) (info virt.VolumeInfo, err error) {
	err = w.run(ctx, "EnsureOverlay", spec.Name, func() error { info, err = w.Host.EnsureOverlay(ctx, spec); return err })
	return info, err
}

func (w *hookHost) UploadVolume(ctx context.Context, pool, name string, data []byte) (info virt.VolumeInfo, err error) {
	err = w.run(ctx, "UploadVolume", name, func() error { info, err = w.Host.UploadVolume(ctx, pool, name, data); return err })
	return info, err
}

func (w *hookHost) EnsureDomain(ctx context.Context, spec virt.DomainSpec) (info virt.DomainInfo, err error) {
	err = w.run(ctx, "EnsureDomain", spec.Name, func() error { info, err = w.Host.EnsureDomain(ctx, spec); return err })
	return info, err
}

func (w *hookHost) StartDomain(ctx context.Context, name string) error {
	return w.run(ctx, "StartDomain", name, func() error { return w.Host.StartDomain(ctx, name) })
}

var errSimulatedCrash = errors.New("simulated crash of the manager")

// restartLibvirtd stops libvirtd and starts it again; running guests keep
// running (QEMU does not depend on libvirtd). It runs on a reconcile's
// goroutine, so it reports errors instead of failing the test itself.
func restartLibvirtd(uri string) (time.Duration, error) {
	start := time.Now()
	if _, err := testlibvirt.StopLibvirtd(time.Minute); err != nil {
		return 0, err
	}
	if err := testlibvirt.StartLibvirtd(); err != nil {
		return 0, err
	}
	if err := testlibvirt.WaitLibvirtd(uri, time.Minute); err != nil {
		return 0, err
	}
	return time.Since(start), nil
}
