package plane

import (
	"context"
	"fmt"
	"log"
	"net"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/controller-runtime/pkg/client"
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
// etcd (data in <StateDir>/etcd, kept; client certificates required) and
// kube-apiserver (Secrets encrypted at rest, service-account keys of the
// state directory), every server of the plane on loopback only but the
// OCI registry (serveRegistry), with
// Cluster API's CRDs, the kubeadm providers' CRDs, the provider's CRDs and
// every webhook configuration of them; kube-controller-manager and the
// manager binary as child processes restarted whenever they exit; Cluster
// API's core, kubeadm bootstrap and kubeadm control-plane managers and
// their webhooks in this process.
//
// Cluster API runs in process, built from the pinned module's exported
// reconcilers and webhooks exactly as its three main.go's wire them (see
// plane.CAPI), rather than as its manager binaries built from the module
// proxy: that is the same code without three more binaries to build (each
// a minute or more of linking on a small host), supervise, give ports,
// certificates and kubeconfigs; it costs one process's memory instead of
// three. Its webhooks share one server on their own port, since the
// provider's manager, a separate process, serves the port the webhook
// configurations are installed with.
//
// Serve writes serve.pid, kubeconfig, webhook-certs/, etcd-pki/ (etcd's
// certificates: etcd serves TLS on loopback and requires a client
// certificate, which kube-apiserver holds), the keys (once) and,
// once everything runs, endpoints.json. When ctx ends it stops the
// manager, Cluster API, kube-controller-manager, kube-apiserver and etcd,
// removes serve.pid and endpoints.json, and returns nil.
func Serve(ctx context.Context, o Options) error {
	o = o.withDefaults()
	manager, assets, err := o.binaries()
	if err != nil {
		return err
	}
	kcm, err := kubeControllerManagerBinary(assets)
	if err != nil {
		return err
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
	if err := ensureKeys(dir); err != nil {
		return err
	}

	// The ports stay bound until etcd and kube-apiserver, which pick free
	// ports too, run, so that they cannot take them.
	reserved, err := reservePorts(4)
	if err != nil {
		return err
	}
	defer reserved.release()
	webhookPort, healthPort, metricsPort, capiWebhookPort := reserved.ports[0], reserved.ports[1], reserved.ports[2], reserved.ports[3]

	log.Printf("starting etcd (data in %s) and kube-apiserver", filepath.Join(dir, etcdDirName))
	env, err := StartEnvironment(assets,
		WithEtcdDataDir(filepath.Join(dir, etcdDirName)),
		WithEtcdCertDir(filepath.Join(dir, etcdCertsDirName)),
		WithAPIServerFlags(apiServerFlags(dir)),
		WithProviderWebhooks(),
		WithClusterAPIWebhooks(),
		WithWebhookServing(loopbackHost, webhookPort),
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
	pc, err := planeClient(env.Config)
	if err != nil {
		return err
	}
	if err := recordInventory(ctx, pc); err != nil {
		return err
	}
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

	kcmConfig, err := env.UserKubeconfig("system:kube-controller-manager")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(filepath.Join(dir, kcmKubeconfigName), kcmConfig); err != nil {
		return err
	}
	children, stopChildren := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	defer wg.Wait()
	defer stopChildren()
	wg.Go(func() {
		(&supervisor{
			name: "kube-controller-manager", binary: kcm, args: kubeControllerManagerArgs(dir),
			env: os.Environ(), stopGrace: 10 * time.Second,
			logPath: filepath.Join(dir, kcmLogName), pidPath: filepath.Join(dir, kcmPIDName),
		}).run(children)
	})

	log.Printf("starting Cluster API's core, kubeadm bootstrap and kubeadm control-plane controllers and webhooks")
	reserved.release()
	if err := env.RouteWebhooks(ctx, clusterAPIWebhookPrefix, loopbackHost, capiWebhookPort); err != nil {
		return fmt.Errorf("routing Cluster API's webhooks: %w", err)
	}
	capi, err := env.StartClusterAPI(ClusterAPIOptions{
		Kubeadm: true, WebhookHost: loopbackHost, WebhookPort: capiWebhookPort, WebhookCertDir: env.WebhookCertDir(),
	})
	if err != nil {
		return err
	}
	defer func() {
		log.Printf("stopping Cluster API's controllers")
		if err := capi.Stop(); err != nil {
			log.Printf("stopping Cluster API's controllers: %v", err)
		}
	}()

	sup := &supervisor{
		name:      "manager",
		binary:    manager,
		args:      managerArgs(o, managerPorts{webhook: webhookPort, health: healthPort, metrics: metricsPort}, certDir),
		env:       append(os.Environ(), "KUBECONFIG="+filepath.Join(dir, kubeconfigName)),
		stopGrace: managerStopGrace,
		logPath:   filepath.Join(dir, managerLogName),
		pidPath:   filepath.Join(dir, managerPIDName),
	}
	// The manager stops first, while Cluster API and the API server still
	// answer its last reconciles.
	managerCtx, stopManager := context.WithCancel(context.Background())
	managerDone := make(chan struct{})
	go func() { sup.run(managerCtx); close(managerDone) }()
	defer func() {
		log.Printf("stopping the manager")
		stopManager()
		<-managerDone
	}()

	// Down sweeps libvirt by the namespaces and pools the plane used; they
	// are recorded while objects exist, whoever created them.
	scopeCtx, stopScope := context.WithCancel(context.Background())
	defer stopScope()
	go recordScopeEvery(scopeCtx, env, dir, scopeRecordInterval)
	go watchMoves(scopeCtx, pc, dir)
	etcdsDone := make(chan struct{})
	go func() { serveWorkloadEtcds(scopeCtx, pc, dir, assets); close(etcdsDone) }()
	defer func() {
		stopScope()
		<-etcdsDone
	}()

	registryURL, err := serveRegistry(scopeCtx, o)
	if err != nil {
		return err
	}
	libvirtClientDir, err := serveLibvirtTLS(scopeCtx, o)
	if err != nil {
		return err
	}
	libvirtTLSPort := 0
	if libvirtClientDir != "" {
		libvirtTLSPort = o.LibvirtTLSPort
	}
	if err := writeJSON(filepath.Join(dir, endpointsFileName), Endpoints{
		ManagerMetricsURL: fmt.Sprintf("http://127.0.0.1:%d/metrics", metricsPort),
		ManagerHealthURL:  fmt.Sprintf("http://127.0.0.1:%d/readyz", healthPort),
		WebhookPort:       webhookPort,
		APIServerURL:      env.Config.Host,
		RegistryURL:       registryURL,
		LibvirtTLSPort:    libvirtTLSPort,
		LibvirtClientDir:  libvirtClientDir,
		ServePID:          os.Getpid(),
	}); err != nil {
		return err
	}
	log.Printf("management plane running: KUBECONFIG=%s", filepath.Join(dir, kubeconfigName))
	<-ctx.Done()
	log.Printf("stopping the management plane")
	return nil
}

// managerPorts are the loopback ports of the manager's servers.
type managerPorts struct {
	webhook, health, metrics int
}

// managerArgs are the manager's flags in the plane: every server it runs
// binds loopback (the API server calls the webhooks there; guests reach
// the host's other addresses through their gateway), then o.ManagerArgs,
// which may override any of them (the last of a flag counts).
func managerArgs(o Options, ports managerPorts, certDir string) []string {
	return append([]string{
		"--libvirt-uri=" + o.LibvirtURI,
		"--leader-elect=false",
		"--webhook-host=" + loopbackHost,
		"--webhook-port=" + strconv.Itoa(ports.webhook),
		"--webhook-cert-dir=" + certDir,
		"--health-addr=" + tcpAddress(loopbackHost, ports.health),
		"--diagnostics-address=" + tcpAddress(loopbackHost, ports.metrics),
		"--insecure-diagnostics",
		"--image-file-dirs=" + o.ImageDir,
	}, o.ManagerArgs...)
}

// loopbackHost is the address every server of the plane binds.
const loopbackHost = "127.0.0.1"

// clusterAPIWebhookPrefix starts the names of Cluster API's webhook
// configurations (WithClusterAPIWebhooks).
const clusterAPIWebhookPrefix = "capi-"

// supervisor runs a binary (the manager, kube-controller-manager) and
// starts it again whenever it exits, as a kubelet restarts a crashed pod.
type supervisor struct {
	name, binary     string
	args, env        []string
	logPath, pidPath string
	// stopGrace is how long it may take to stop after SIGTERM before it
	// is killed.
	stopGrace time.Duration
}

func (s *supervisor) run(ctx context.Context) {
	defer func() { _ = os.Remove(s.pidPath) }()
	for restarts := 0; ; restarts++ {
		err := s.runOnce(ctx)
		if ctx.Err() != nil {
			return
		}
		log.Printf("%s exited (%v); restarting it in %s (restart %d)", s.name, err, restartDelay, restarts+1)
		select {
		case <-ctx.Done():
			return
		case <-time.After(restartDelay):
		}
	}
}

// runOnce starts the binary and waits for it to exit, or stops it (SIGTERM,
// then SIGKILL after stopGrace) when ctx ends.
func (s *supervisor) runOnce(ctx context.Context) error {
	c, err := startChild(s.name, s.binary, s.args, s.env, s.logPath)
	if err != nil {
		return err
	}
	if err := writePID(s.pidPath, c.pid); err != nil {
		log.Printf("writing %s: %v", s.pidPath, err)
	}
	log.Printf("%s started, pid %d, log %s", s.name, c.pid, s.logPath)
	select {
	case <-c.exited:
		return c.err
	case <-ctx.Done():
	}
	err = c.stop(s.stopGrace)
	log.Printf("%s pid %d stopped (%v)", s.name, c.pid, err)
	return err
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

// planeClient is the serve process's own client of the plane, knowing
// Scheme's kinds, for the clusterctl inventory and the watch for moves.
func planeClient(cfg *rest.Config) (client.WithWatch, error) {
	scheme, err := Scheme()
	if err != nil {
		return nil, err
	}
	return client.NewWithWatch(cfg, client.Options{Scheme: scheme})
}

// recordInventory installs the clusterctl inventory of the providers the
// plane runs (installInventory).
func recordInventory(ctx context.Context, c client.Client) error {
	version, err := clusterAPIVersion()
	if err != nil {
		return fmt.Errorf("recording the clusterctl inventory: %w", err)
	}
	ictx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	if err := installInventory(ictx, c, version); err != nil {
		return fmt.Errorf("recording the clusterctl inventory: %w", err)
	}
	return nil
}

// recordScopeEvery records the plane's scope every interval until ctx ends.
func recordScopeEvery(ctx context.Context, env *Environment, dir string, interval time.Duration) {
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
