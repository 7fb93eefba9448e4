package cli

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// attach connects to the running plane of the state directory; when none
// runs, the error names the commands that start one. It warns when the
// plane runs binaries older than those on disk.
func (a *app) attach() (*plane.Plane, error) {
	p, err := plane.Attach(a.stateDir)
	if errors.Is(err, plane.ErrNotRunning) {
		return nil, fmt.Errorf("%w in %s: `capl-dev up --no-demo%s` starts one, `capl-dev start%s` restarts one that `capl-dev stop` stopped",
			err, a.stateDir, stateDirArg(a.stateDir), stateDirArg(a.stateDir))
	}
	if err != nil {
		return nil, fmt.Errorf("the plane in %s: %w (see %s/serve.log)", a.stateDir, err, a.stateDir)
	}
	a.warnStale(p)
	return p, nil
}

// warnStale warns when the plane runs binaries older than those on disk,
// naming the command that restarts it with the new ones.
func (a *app) warnStale(p *plane.Plane) {
	if why := planeStale(p); why != "" {
		fmt.Fprintf(a.err, "warning: the management plane runs an older build: %s; `capl-dev start --restart%s` restarts it with the new one (its clusters' VMs keep running)\n",
			why, stateDirArg(p.StateDir))
	}
}

// attachQuiet is attach without the warnings, for shell completion.
func (a *app) attachQuiet() (*plane.Plane, error) { return plane.Attach(a.stateDir) }

// planeStale tells why the plane's processes run binaries older than the
// files on disk (the plane's capl-dev or the manager rebuilt since it
// started), or "".
func planeStale(p *plane.Plane) string {
	var why []string
	if s := staleBinary(p.Endpoints.ServePID); s != "" {
		why = append(why, s)
	}
	if pid, err := p.ManagerPID(); err == nil {
		if s := staleBinary(pid); s != "" {
			why = append(why, s)
		}
	}
	return strings.Join(why, "; ")
}

// libvirtAnswerTimeout bounds how long a command waits for libvirtd
// before saying it does not answer: a local libvirtd answers in
// milliseconds, one that is not running refuses at once, and the
// provider's own reconnect budget (30 s) is for a libvirtd that restarts
// under a running manager, not for a person waiting at a prompt.
const libvirtAnswerTimeout = 3 * time.Second

// dial connects to libvirt at the command's URI. A libvirtd that does
// not answer is said as such within libvirtAnswerTimeout, with what to
// do about it.
func (a *app) dial(ctx context.Context) (*virt.Client, error) {
	return dialLibvirt(ctx, a.uri())
}

// dialLibvirt connects to libvirt at uri, within libvirtAnswerTimeout;
// the error of a libvirtd that does not answer says what to do.
func dialLibvirt(ctx context.Context, uri string) (*virt.Client, error) {
	ctx, cancel := context.WithTimeout(ctx, libvirtAnswerTimeout)
	defer cancel()
	h, err := virt.Dial(ctx, uri, virt.WithReconnectBudget(libvirtAnswerTimeout))
	if err != nil {
		return nil, libvirtDown(uri, err)
	}
	return h, nil
}

// libvirtDown is the error of a libvirtd that does not answer at uri.
func libvirtDown(uri string, err error) error {
	return fmt.Errorf("libvirtd does not answer at %s: %w; start it (`libvirtd -d` where no service manager runs it, as `make prepare-host` does, or `systemctl start libvirtd`); `virsh -c %s version` shows the same error",
		uri, err, uri)
}
