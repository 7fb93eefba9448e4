package devplane

import (
	"context"
	"errors"
	"fmt"
	"log"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testenv"
)

const (
	// restartDelay is how long the supervisor waits before restarting a
	// manager that exited, so a manager failing at start does not spin.
	restartDelay = time.Second
	// managerStopGrace is how long a stopping manager may take to finish
	// its reconciles after SIGTERM before it is killed.
	managerStopGrace = 30 * time.Second
	// scopeRecordInterval is how often the plane records the namespaces
	// and pools of its clusters in scope.json: a cluster lives for minutes
	// before its first VM boots, so none is missed.
	scopeRecordInterval = 5 * time.Second
)

// Serve runs the plane in the foreground until ctx ends (capl-dev serve):
// etcd (data in <StateDir>/etcd, kept) and kube-apiserver with Cluster
// API's CRDs, the provider's CRDs and webhook configurations; Cluster API's
// core controllers in this process; and the manager binary as a child
// process restarted whenever it exits. It writes serve.pid, kubeconfig,
// webhook-certs/ and, once everything runs, endpoints.json. When ctx ends it
// stops the manager, the controllers, kube-apiserver and etcd, removes
// serve.pid and endpoints.json, and returns nil.
func Serve(ctx context.Context, o Options) error {
	o = o.withDefaults()
	if o.ManagerBinary == "" {
		return errors.New("no manager binary: build it with `make build` and pass --manager")
	}
	manager, err := filepath.Abs(o.ManagerBinary)
	if err != nil {
		return err
	}
	if _, err := os.Stat(manager); err != nil {
		return fmt.Errorf("manager binary: %w (build it with `make build`)", err)
	}
	dir := o.StateDir
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if pid := servePID(dir); pid != 0 && pid != os.Getpid() {
		return fmt.Errorf("the plane of %s already runs as pid %d", dir, pid)
	}
	_ = os.Remove(filepath.Join(dir, endpointsFileName))
	if err := stopOrphanedControlPlane(dir, log.Printf); err != nil {
		return err
	}
	if err := writePID(filepath.Join(dir, servePIDName), os.Getpid()); err != nil {
		return err
	}
	defer func() { _ = os.Remove(filepath.Join(dir, servePIDName)) }()
	defer func() { _ = os.Remove(filepath.Join(dir, endpointsFileName)) }()

	// The ports stay bound until the manager starts, so that etcd and
	// kube-apiserver, which pick free ports too, cannot take them.
	reserved, err := reservePorts(3)
	if err != nil {
		return err
	}
	defer reserved.release()
	webhookPort, healthPort, metricsPort := reserved.ports[0], reserved.ports[1], reserved.ports[2]

	log.Printf("starting etcd (data in %s) and kube-apiserver", filepath.Join(dir, etcdDirName))
	env, err := testenv.Start(
		testenv.WithEtcdDataDir(filepath.Join(dir, etcdDirName)),
		testenv.WithProviderWebhooks(),
		testenv.WithWebhookServing("127.0.0.1", webhookPort),
	)
	if err != nil {
		return err
	}
	defer func() {
		log.Printf("stopping kube-apiserver and etcd (etcd data kept)")
		if err := env.Stop(); err != nil {
			log.Printf("stopping kube-apiserver and etcd: %v", err)
		}
	}()
	if err := copyFile(env.Kubeconfig, filepath.Join(dir, kubeconfigName)); err != nil {
		return fmt.Errorf("writing the kubeconfig: %w", err)
	}
	certDir := filepath.Join(dir, webhookCertsName)
	if err := os.MkdirAll(certDir, 0o700); err != nil {
		return err
	}
	for _, f := range []string{"tls.crt", "tls.key"} {
		if err := copyFile(filepath.Join(env.WebhookCertDir(), f), filepath.Join(certDir, f)); err != nil {
			return fmt.Errorf("writing the webhook certificate: %w", err)
		}
	}

	log.Printf("starting Cluster API's core controllers (Cluster, Machine, MachineSet, MachineDeployment)")
	capi, err := env.StartCAPI()
	if err != nil {
		return err
	}
	defer func() {
		log.Printf("stopping Cluster API's controllers")
		if err := capi.Stop(); err != nil && !errors.Is(err, context.Canceled) {
			log.Printf("stopping Cluster API's controllers: %v", err)
		}
	}()

	sup := &supervisor{
		binary: manager,
		args: append([]string{
			"--libvirt-uri=" + o.LibvirtURI,
			"--leader-elect=false",
			"--webhook-port=" + strconv.Itoa(webhookPort),
			"--webhook-cert-dir=" + certDir,
			"--health-addr=127.0.0.1:" + strconv.Itoa(healthPort),
			"--diagnostics-address=127.0.0.1:" + strconv.Itoa(metricsPort),
			"--insecure-diagnostics",
		}, o.ManagerArgs...),
		env:     append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, kubeconfigName)),
		logPath: filepath.Join(dir, managerLogName),
		pidPath: filepath.Join(dir, managerPIDName),
	}
	reserved.release()
	supCtx, stopSup := context.WithCancel(context.Background())
	supDone := make(chan struct{})
	go func() { sup.run(supCtx); close(supDone) }()
	defer func() {
		log.Printf("stopping the manager")
		stopSup()
		<-supDone
	}()

	// Down sweeps libvirt by the namespaces and pools the plane used; they
	// are recorded while objects exist, whoever created them.
	scopeCtx, stopScope := context.WithCancel(context.Background())
	defer stopScope()
	go recordScopeEvery(scopeCtx, env, dir, scopeRecordInterval)
	go completeForegroundDeletionsEvery(scopeCtx, env.Client, 2*time.Second)

	if err := writeJSON(filepath.Join(dir, endpointsFileName), Endpoints{
		ManagerMetricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort),
		ManagerHealthURL:  fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort),
		WebhookPort:       webhookPort,
		APIServerURL:      env.Config.Host,
		ServePID:          os.Getpid(),
	}); err != nil {
		return err
	}
	log.Printf("management plane running: KUBECONFIG=%s", filepath.Join(dir, kubeconfigName))
	<-ctx.Done()
	log.Printf("stopping the management plane")
	return nil
}

// supervisor runs the manager binary and starts it again whenever it
// exits, as a kubelet restarts a crashed pod.
type supervisor struct {
	binary           string
	args, env        []string
	logPath, pidPath string
}

func (s *supervisor) run(ctx context.Context) {
	defer func() { _ = os.Remove(s.pidPath) }()
	for restarts := 0; ; restarts++ {
		err := s.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		log.Printf("manager exited (%v); restarting it in %s (restart %d)", err, restartDelay, restarts+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(restartDelay):
		}
	}
}

// runOnce starts the manager and waits for it to exit, or stops it (SIGTERM,
// then SIGKILL after managerStopGrace) when ctx ends.
func (s *supervisor) runOnce(ctx context.Context) error {
	out, err := os.OpenFile(s.logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return err
	}
	defer out.Close()
	// Pdeathsig fires when the thread that forked the child exits; pin this
	// goroutine to its thread for the child's whole life.
	runtime.LockOSThread()
	defer runtime.UnlockOSThread()
	cmd := exec.Command(s.binary, s.args...)
	cmd.Env = s.env
	cmd.Stdout, cmd.Stderr = out, out
	// The manager dies with the plane even when the plane is SIGKILLed,
	// so a restarted plane never meets a stale manager on its ports.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return err
	}
	pid := cmd.Process.Pid
	if err := writePID(s.pidPath, pid); err != nil {
		log.Printf("writing %s: %v", s.pidPath, err)
	}
	log.Printf("manager started, pid %d, log %s", pid, s.logPath)
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		return err
	case <-ctx.Done():
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case err := <-done:
		log.Printf("manager pid %d stopped (%v)", pid, err)
		return err
	case <-time.After(managerStopGrace):
		log.Printf("manager pid %d did not stop in %s; killing it", pid, managerStopGrace)
		_ = cmd.Process.Kill()
		return <-done
	}
}

// portReservation holds local ports bound until release.
type portReservation struct {
	listeners []net.Listener
	ports     []int
}

// reservePorts binds n distinct free local ports.
func reservePorts(n int) (*portReservation, error) {
	r := &portReservation{}
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			r.release()
			return nil, err
		}
		r.listeners = append(r.listeners, l)
		r.ports = append(r.ports, l.Addr().(*net.TCPAddr).Port)
	}
	return r, nil
}

// release frees the ports; it may be called more than once.
func (r *portReservation) release() {
	for _, l := range r.listeners {
		_ = l.Close()
	}
	r.listeners = nil
}

func copyFile(from, to string) error {
	data, err := os.ReadFile(from)
	if err != nil {
		return err
	}
	return writeFileAtomic(to, data)
}

// recordScopeEvery records the plane's scope every interval until ctx ends.
func recordScopeEvery(ctx context.Context, env *testenv.Environment, dir string, interval time.Duration) {
	for {
		if err := recordLiveScope(ctx, env.Client, dir); err != nil && ctx.Err() == nil {
			log.Printf("recording the plane's namespaces in %s: %v", scopeFileName, err)
		}
		select {
		case <-ctx.Done():
			return
		case <-time.After(interval):
		}
	}
}
