package controllers_test

import (
	"context"
	"net/netip"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// crashPlan kills the manager right after chosen libvirt calls succeeded,
// once each: the step happened in libvirt, and nothing after it was
// persisted. Keys are "Method" or "Method object-prefix".
type crashPlan struct {
	mu    sync.Mutex
	steps []string
	hit   chan string
}

func newCrashPlan(steps ...string) *crashPlan {
	return &crashPlan{steps: steps, hit: make(chan string, 1)}
}

// take tells whether method on object is a pending step, and consumes it.
func (p *crashPlan) take(method, object string) (string, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, s := range p.steps {
		m, prefix, _ := strings.Cut(s, " ")
		if m == method && strings.HasPrefix(object, prefix) {
			p.steps = append(p.steps[:i], p.steps[i+1:]...)
			return s, true
		}
	}
	return "", false
}

func (p *crashPlan) pending() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.steps)
}

// run starts the manager with the plan's crashes until every step has
// crashed it once, calling check after each crash, then starts it plainly.
func (h *clusterHarness) run(p *crashPlan, timeout time.Duration, check func(step string)) {
	h.t.Helper()
	for p.pending() > 0 {
		h.startProvider(func(inner virt.Host) virt.Host { return &crashHost{Host: inner, plan: p} })
		select {
		case step := <-p.hit:
			h.stopProvider()
			h.t.Logf("manager killed right after %s; restarting", step)
			if check != nil {
				check(step)
			}
		case <-time.After(timeout):
			h.t.Fatalf("crash steps %v never ran", p.steps)
		}
	}
	h.startProvider(nil)
}

// crashHost wraps the provider's Host to crash the manager per its plan.
type crashHost struct {
	virt.Host
	plan    *crashPlan
	mu      sync.Mutex
	crashed bool
}

// after blocks the reconcile until the manager is stopped when method on
// object is a step of the plan (one step per manager: it dies with it).
func (w *crashHost) after(ctx context.Context, method, object string, err error) error {
	if err != nil {
		return err
	}
	w.mu.Lock()
	step, crash := "", false
	if !w.crashed {
		step, crash = w.plan.take(method, object)
		w.crashed = crash
	}
	w.mu.Unlock()
	if !crash {
		return nil
	}
	w.plan.hit <- step
	<-ctx.Done() // the manager dies before anything else is persisted
	return errSimulatedCrash
}

func (w *crashHost) EnsureNetwork(ctx context.Context, spec virt.NetworkSpec) (virt.NetworkInfo, error) {
	info, err := w.Host.EnsureNetwork(ctx, spec)
	return info, w.after(ctx, "EnsureNetwork", spec.Name, err)
}

func (w *crashHost) ReserveAddress(ctx context.Context, network string, r virt.Reservation) (netip.Addr, error) {
	ip, err := w.Host.ReserveAddress(ctx, network, r)
	return ip, w.after(ctx, "ReserveAddress", r.MAC.String(), err)
}

func (w *crashHost) ImportImage(ctx context.Context, img virt.ImageImport) (virt.VolumeInfo, error) {
	info, err := w.Host.ImportImage(ctx, img)
	return info, w.after(ctx, "ImportImage", img.Volume, err)
}

func (w *crashHost) EnsureOverlay(ctx context.Context, spec virt.OverlaySpec) (virt.VolumeInfo, error) {
	info, err := w.Host.EnsureOverlay(ctx, spec)
	return info, w.after(ctx, "EnsureOverlay", spec.Name, err)
}

func (w *crashHost) UploadVolume(ctx context.Context, pool, name string, data []byte) (virt.VolumeInfo, error) {
	info, err := w.Host.UploadVolume(ctx, pool, name, data)
	return info, w.after(ctx, "UploadVolume", name, err)
}

func (w *crashHost) EnsureDomain(ctx context.Context, spec virt.DomainSpec) (virt.DomainInfo, error) {
	info, err := w.Host.EnsureDomain(ctx, spec)
	return info, w.after(ctx, "EnsureDomain", spec.Name, err)
}

func (w *crashHost) StartDomain(ctx context.Context, name string) error {
	return w.after(ctx, "StartDomain", name, w.Host.StartDomain(ctx, name))
}

func (w *crashHost) GuestWriteFile(ctx context.Context, domain, path string, data []byte, mode os.FileMode) error {
	return w.after(ctx, "GuestWriteFile", path, w.Host.GuestWriteFile(ctx, domain, path, data, mode))
}

func (w *crashHost) GuestExec(ctx context.Context, domain, path string, args []string, stdin []byte) (virt.ExecResult, error) {
	res, err := w.Host.GuestExec(ctx, domain, path, args, stdin)
	if err == nil && res.ExitCode != 0 {
		return res, nil
	}
	return res, w.after(ctx, "GuestExec", strings.Join(append([]string{path}, args...), " "), err)
}

func (w *crashHost) DeleteDomain(ctx context.Context, name string) error {
	return w.after(ctx, "DeleteDomain", name, w.Host.DeleteDomain(ctx, name))
}

func (w *crashHost) DeleteVolume(ctx context.Context, pool, name string) error {
	return w.after(ctx, "DeleteVolume", name, w.Host.DeleteVolume(ctx, pool, name))
}

func (w *crashHost) ReleaseOwnedAddress(ctx context.Context, network string, r virt.Reservation) error {
	return w.after(ctx, "ReleaseOwnedAddress", r.MAC.String(), w.Host.ReleaseOwnedAddress(ctx, network, r))
}

func (w *crashHost) DeleteNetwork(ctx context.Context, name string) error {
	return w.after(ctx, "DeleteNetwork", name, w.Host.DeleteNetwork(ctx, name))
}
