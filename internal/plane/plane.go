package plane

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	addonsv1 "sigs.k8s.io/cluster-api/api/addons/v1beta2"
	bootstrapv1 "sigs.k8s.io/cluster-api/api/bootstrap/kubeadm/v1beta2"
	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// ErrNotRunning is returned by Attach when no plane runs in the state directory.
var ErrNotRunning = errors.New("the management plane is not running")

const (
	// startTimeout bounds Start's wait for the API server and a ready
	// manager: etcd and kube-apiserver start in seconds, the manager's caches sync in seconds,
	// a cold host (page cache empty) takes longer.
	startTimeout = 3 * time.Minute
	// stopTimeout bounds Stop's wait for the plane to exit: the manager gets
	// managerStopGrace, the rest stops in seconds.
	stopTimeout  = managerStopGrace + time.Minute
	pollInterval = 250 * time.Millisecond
)

// Plane is a running management plane, reached through its state directory.
type Plane struct {
	// StateDir is the plane's state directory.
	StateDir string
	// Kubeconfig is the admin kubeconfig of the plane's API server.
	Kubeconfig string
	// Config reaches the API server as an administrator.
	Config *rest.Config
	// Client knows the provider's, Cluster API's core and Kubernetes' kinds.
	Client client.Client
	// Endpoints is where the manager answers.
	Endpoints Endpoints
}

// Start starts the plane of o.StateDir as a detached `<serveBinary> serve`
// process (its own session, output appended to serve.log), unless one runs
// already, in which case it attaches to it. It returns once the API server
// answers and the manager reports ready.
func Start(ctx context.Context, o Options, serveBinary string) (*Plane, error) {
	o = o.withDefaults()
	dir := o.StateDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, err
	}
	ctx, cancel := context.WithTimeout(ctx, startTimeout)
	defer cancel()
	exited := make(chan error, 1)
	if pid := servePID(dir); pid != 0 {
		o.Log("management plane already running (pid %d), reusing it", pid)
	} else {
		// Resolved here, so that what is missing is said before the plane
		// starts, and the plane runs what this process found.
		var err error
		if o.ManagerBinary, o.Assets, err = o.binaries(); err != nil {
			return nil, err
		}
		if exited, err = spawnServe(o, serveBinary); err != nil {
			return nil, err
		}
	}
	logPath := filepath.Join(dir, serveLogName)
	for {
		if p, err := Attach(dir); err == nil {
			if _, err := p.WaitManagerReady(ctx, 0); err != nil {
				return nil, fmt.Errorf("%w (see %s and %s)", err, logPath, filepath.Join(dir, managerLogName))
			}
			return p, nil
		}
		select {
		case err := <-exited:
			return nil, fmt.Errorf("the management plane exited (%v):\n%s", err, tail(logPath, 20))
		case <-ctx.Done():
			return nil, fmt.Errorf("the management plane did not come up in %s (see %s):\n%s", startTimeout, logPath, tail(logPath, 20))
		case <-time.After(pollInterval):
		}
	}
}

// spawnServe starts `serveBinary serve` in its own session, so that it
// outlives `capl-dev up` and a terminal's hangup; the channel reports its
// exit while this process lives.
func spawnServe(o Options, serveBinary string) (chan error, error) {
	if serveBinary == "" {
		return nil, errors.New("no capl-dev binary to run `serve` with")
	}
	args := []string{"serve", "--state-dir=" + o.StateDir, "--libvirt-uri=" + o.LibvirtURI, "--manager=" + o.ManagerBinary,
		"--assets=" + o.Assets, "--image-dir=" + o.ImageDir, "--registry-port=" + strconv.Itoa(o.RegistryPort),
		"--libvirt-tls-port=" + strconv.Itoa(o.LibvirtTLSPort)}
	for _, l := range o.RegistryLayouts {
		args = append(args, "--registry-layout="+l)
	}
	for _, a := range o.ManagerArgs {
		args = append(args, "--manager-arg="+a)
	}
	out, err := os.OpenFile(filepath.Join(o.StateDir, serveLogName), os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer out.Close()
	// A stale endpoints.json of a plane that was killed must not be taken
	// for the new one's.
	_ = os.Remove(filepath.Join(o.StateDir, endpointsFileName))
	cmd := exec.Command(serveBinary, args...)
	cmd.Stdout, cmd.Stderr = out, out
	cmd.SysProcAttr = &syscall.SysProcAttr{Setsid: true}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting the management plane: %w", err)
	}
	o.Log("management plane starting (pid %d, log %s)", cmd.Process.Pid, filepath.Join(o.StateDir, serveLogName))
	exited := make(chan error, 1)
	// Reaped here while this process lives; after that the plane is an orphan.
	go func() { exited <- cmd.Wait() }()
	return exited, nil
}

// Attach connects to the plane running in stateDir; ErrNotRunning when
// none runs or it has not finished starting.
func Attach(stateDir string) (*Plane, error) {
	pid := servePID(stateDir)
	if pid == 0 {
		return nil, ErrNotRunning
	}
	ep, err := readEndpoints(stateDir)
	if errors.Is(err, os.ErrNotExist) || (err == nil && ep.ServePID != pid) {
		return nil, fmt.Errorf("%w: pid %d is still starting", ErrNotRunning, pid)
	}
	if err != nil {
		return nil, err
	}
	kubeconfig := filepath.Join(stateDir, kubeconfigName)
	data, err := os.ReadFile(kubeconfig)
	if err != nil {
		return nil, err
	}
	cfg, err := clientcmd.RESTConfigFromKubeConfig(data)
	if err != nil {
		return nil, fmt.Errorf("reading %s: %w", kubeconfig, err)
	}
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	c, err := client.New(cfg, client.Options{Scheme: scheme})
	if err != nil {
		return nil, err
	}
	return &Plane{StateDir: stateDir, Kubeconfig: kubeconfig, Config: cfg, Client: c, Endpoints: ep}, nil
}

// ManagerPID is the pid of the current manager child.
func (p *Plane) ManagerPID() (int, error) {
	pid, err := readPID(filepath.Join(p.StateDir, managerPIDName))
	if err != nil {
		return 0, err
	}
	if !processAlive(pid, "") {
		return 0, fmt.Errorf("manager pid %d is not running", pid)
	}
	return pid, nil
}

// KillManager kills the manager child with SIGKILL, as a crash would; the
// supervisor starts a new one (see WaitManagerReady).
func (p *Plane) KillManager() (oldPID int, err error) {
	pid, err := p.ManagerPID()
	if err != nil {
		return 0, err
	}
	if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
		return 0, fmt.Errorf("killing manager pid %d: %w", pid, err)
	}
	return pid, nil
}

// WaitManagerReady waits for a manager other than notPID (0: any) to run
// and answer 200 on /readyz, and returns its pid.
func (p *Plane) WaitManagerReady(ctx context.Context, notPID int) (newPID int, err error) {
	hc := &http.Client{Timeout: 2 * time.Second}
	var last error
	for {
		pid, err := p.ManagerPID()
		switch {
		case err != nil:
			last = err
		case pid == notPID:
			last = fmt.Errorf("manager pid %d not replaced yet", pid)
		case notPID != 0 && processAlive(notPID, ""):
			last = fmt.Errorf("old manager pid %d still running", notPID)
		default:
			if last = getOK(ctx, hc, p.Endpoints.ManagerHealthURL); last == nil {
				// The health port is the same for every manager: make sure
				// the one that answered is still the one we named.
				if again, err := p.ManagerPID(); err == nil && again == pid {
					return pid, nil
				}
			}
		}
		select {
		case <-ctx.Done():
			return 0, fmt.Errorf("waiting for the manager to be ready: %w (last: %v)", ctx.Err(), last)
		case <-time.After(pollInterval):
		}
	}
}

func getOK(ctx context.Context, hc *http.Client, url string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := hc.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("%s: %s: %s", url, resp.Status, strings.TrimSpace(string(body)))
	}
	return nil
}

// ManagerRSSBytes is the resident set size (VmRSS) of the current manager.
func (p *Plane) ManagerRSSBytes() (uint64, error) {
	pid, err := p.ManagerPID()
	if err != nil {
		return 0, err
	}
	return rssBytes(pid)
}

// PIDs are the plane's processes by name: serve (with Cluster API's
// controllers), manager, kube-controller-manager, etcd and kube-apiserver.
func (p *Plane) PIDs() (map[string]int, error) {
	pids := map[string]int{"serve": p.Endpoints.ServePID}
	for name, file := range map[string]string{"manager": managerPIDName, "kube-controller-manager": kcmPIDName} {
		pid, err := readPID(filepath.Join(p.StateDir, file))
		if err != nil {
			return nil, err
		}
		pids[name] = pid
	}
	procs, err := orphanedControlPlane(p.StateDir)
	if err != nil {
		return nil, err
	}
	for _, proc := range procs {
		pids[filepath.Base(proc.args[0])] = proc.pid
	}
	return pids, nil
}

// RSSBytes is the resident set size of each process of PIDs, by name.
func (p *Plane) RSSBytes() (map[string]uint64, error) {
	pids, err := p.PIDs()
	if err != nil {
		return nil, err
	}
	rss := map[string]uint64{}
	for name, pid := range pids {
		if rss[name], err = rssBytes(pid); err != nil {
			return nil, fmt.Errorf("%s: %w", name, err)
		}
	}
	return rss, nil
}

// rssBytes is the VmRSS of pid.
func rssBytes(pid int) (uint64, error) {
	status, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0, err
	}
	for _, line := range strings.Split(string(status), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(rest)
			if len(f) != 2 || f[1] != "kB" {
				return 0, fmt.Errorf("unexpected VmRSS line %q", line)
			}
			kb, err := strconv.ParseUint(f[0], 10, 64)
			return kb * 1024, err
		}
	}
	return 0, fmt.Errorf("no VmRSS in /proc/%d/status", pid)
}

// ManagerMetrics returns the manager's /metrics in Prometheus text format.
func (p *Plane) ManagerMetrics(ctx context.Context) (string, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, p.Endpoints.ManagerMetricsURL, nil)
	if err != nil {
		return "", err
	}
	resp, err := (&http.Client{Timeout: 10 * time.Second}).Do(req)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return "", err
	}
	if resp.StatusCode != http.StatusOK {
		return "", fmt.Errorf("%s: %s", p.Endpoints.ManagerMetricsURL, resp.Status)
	}
	return string(body), nil
}

// Stop sends the plane SIGTERM and waits for it to exit (its manager,
// Cluster API's controllers, kube-controller-manager, kube-apiserver and
// etcd stop; etcd's data and the keys stay).
func (p *Plane) Stop(ctx context.Context) error {
	return stopServe(ctx, p.StateDir)
}

func stopServe(ctx context.Context, dir string) error {
	pid := servePID(dir)
	if pid == 0 {
		return nil
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil && !errors.Is(err, syscall.ESRCH) {
		return fmt.Errorf("stopping the management plane (pid %d): %w", pid, err)
	}
	ctx, cancel := context.WithTimeout(ctx, stopTimeout)
	defer cancel()
	for processAlive(pid, "serve") {
		select {
		case <-ctx.Done():
			return fmt.Errorf("the management plane (pid %d) did not stop: %w (see %s)", pid, ctx.Err(), filepath.Join(dir, serveLogName))
		case <-time.After(pollInterval):
		}
	}
	return nil
}

// tail is the last n lines of a log file, for error messages.
func tail(path string, n int) string {
	data, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	lines := strings.Split(strings.TrimRight(string(data), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Scheme holds the provider's kinds, those of Cluster API's providers the
// plane runs that its clients create (ClusterResourceSets, kubeadm's
// control plane and bootstrap kinds), CRDs and clusterctl's inventory.
func Scheme() (*runtime.Scheme, error) {
	scheme, err := manager.NewScheme()
	if err != nil {
		return nil, err
	}
	for _, add := range []func(*runtime.Scheme) error{
		addonsv1.AddToScheme, controlplanev1.AddToScheme, bootstrapv1.AddToScheme,
		apiextensionsv1.AddToScheme, clusterctlv1.AddToScheme,
	} {
		if err := add(scheme); err != nil {
			return nil, err
		}
	}
	return scheme, nil
}
