package plane

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"time"

	"k8s.io/client-go/rest"
	"k8s.io/client-go/tools/clientcmd"
	clientcmdapi "k8s.io/client-go/tools/clientcmd/api"
)

const (
	// controlPlaneStartTimeout bounds how long etcd and kube-apiserver
	// each have to become ready; kube-apiserver's first start on a busy
	// two-core host takes tens of seconds.
	controlPlaneStartTimeout = 3 * time.Minute
	// controlPlaneStopGrace is how long each has to exit after SIGTERM.
	controlPlaneStopGrace = 20 * time.Second
	// serviceClusterIPRange is the Service range of the management API
	// server; nothing routes to it, since no Pod runs there.
	serviceClusterIPRange = "10.0.0.0/24"
)

// controlPlane is etcd and kube-apiserver running as children of this
// process, and the authority of the certificates that reach them.
type controlPlane struct {
	// workDir holds the certificates, keys, logs and, unless the caller
	// named one, etcd's data; stop removes it.
	workDir   string
	etcd      *child
	apiServer *child
	// admin reaches the API server in group system:masters.
	admin   *rest.Config
	clients *authority
}

// controlPlaneSpec says what startControlPlane runs.
type controlPlaneSpec struct {
	// assets is the directory of the etcd and kube-apiserver binaries.
	assets string
	// etcdDataDir keeps etcd's data across starts; empty, the data lives
	// in the work directory, without fsync, and goes with stop.
	etcdDataDir string
	// etcdCertDir keeps etcd's certificates across starts (ensureEtcdPKI);
	// empty, they are made in the work directory at each start.
	etcdCertDir string
	// apiServerFlags are added to kube-apiserver's flags, replacing the
	// defaults of the same names.
	apiServerFlags map[string]string
}

// startControlPlane runs etcd, then kube-apiserver, each started once
// the previous answers, and returns when the API server is ready.
func startControlPlane(ctx context.Context, spec controlPlaneSpec) (_ *controlPlane, err error) {
	workDir, err := os.MkdirTemp("", "capl-control-plane-")
	if err != nil {
		return nil, err
	}
	// Not the named result: a failed start returns nil, and the deferred
	// stop must still see what it started.
	cp := &controlPlane{workDir: workDir}
	defer func() {
		if err != nil {
			err = errors.Join(err, cp.stop())
		}
	}()
	etcd, err := cp.startEtcd(ctx, spec)
	if err != nil {
		return nil, err
	}
	if err := cp.startAPIServer(ctx, spec, etcd); err != nil {
		return nil, err
	}
	return cp, nil
}

// etcdEndpoint is where a running etcd serves its clients and the
// certificates that reach it.
type etcdEndpoint struct {
	clientURL string
	pki       etcdPKI
}

// etcdSettings are what etcdArgs turns into flags.
type etcdSettings struct {
	dataDir              string
	clientPort, peerPort int
	pki                  etcdPKI
	// unsafeNoFsync skips fsync, for throw-away data.
	unsafeNoFsync bool
}

// etcdArgs are etcd's flags: client and peer URLs on loopback only (guests
// reach the host's other addresses through their gateway), both TLS with
// client certificates of the plane's etcd authority required, so that no
// other local process or user reads or writes the plane's objects (its
// Secrets included) without going through kube-apiserver's
// authentication and RBAC.
func etcdArgs(s etcdSettings) []string {
	clientURL := etcdClientURL(s.clientPort)
	args := []string{
		"--data-dir=" + s.dataDir,
		"--listen-client-urls=" + clientURL,
		"--advertise-client-urls=" + clientURL,
		"--listen-peer-urls=https://" + tcpAddress(loopbackHost, s.peerPort),
		"--cert-file=" + s.pki.path(etcdServerCertName),
		"--key-file=" + s.pki.path(etcdServerKeyName),
		"--trusted-ca-file=" + s.pki.path(etcdCAName),
		"--client-cert-auth=true",
		"--peer-cert-file=" + s.pki.path(etcdServerCertName),
		"--peer-key-file=" + s.pki.path(etcdServerKeyName),
		"--peer-trusted-ca-file=" + s.pki.path(etcdCAName),
		"--peer-client-cert-auth=true",
	}
	if s.unsafeNoFsync {
		args = append(args, "--unsafe-no-fsync=true")
	}
	return args
}

// etcdClientURL is etcd's client URL on port.
func etcdClientURL(port int) string { return "https://" + tcpAddress(loopbackHost, port) }

// startEtcd runs a one-member etcd on local ports (etcdArgs), with the
// certificates of spec.etcdCertDir, made if missing.
func (cp *controlPlane) startEtcd(ctx context.Context, spec controlPlaneSpec) (etcdEndpoint, error) {
	ports, err := freePorts(2)
	if err != nil {
		return etcdEndpoint{}, err
	}
	s := etcdSettings{dataDir: spec.etcdDataDir, clientPort: ports[0], peerPort: ports[1], pki: etcdPKI(spec.etcdCertDir)}
	if s.dataDir == "" {
		// Throw-away data need not survive a host crash; skipping fsync
		// makes every write of a test run cheaper.
		s.dataDir, s.unsafeNoFsync = filepath.Join(cp.workDir, "etcd"), true
	}
	if s.pki == "" {
		s.pki = etcdPKI(filepath.Join(cp.workDir, "etcd-pki"))
	}
	if err := ensureEtcdPKI(string(s.pki), time.Now()); err != nil {
		return etcdEndpoint{}, fmt.Errorf("etcd's certificates: %w", err)
	}
	tlsConfig, err := s.pki.clientTLS()
	if err != nil {
		return etcdEndpoint{}, err
	}
	if cp.etcd, err = startChild("etcd", filepath.Join(spec.assets, "etcd"), etcdArgs(s), nil, filepath.Join(cp.workDir, "etcd.log")); err != nil {
		return etcdEndpoint{}, err
	}
	e := etcdEndpoint{clientURL: etcdClientURL(s.clientPort), pki: s.pki}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: tlsConfig}}
	return e, waitReady(ctx, cp.etcd, hc, e.clientURL+"/health")
}

// startAPIServer runs kube-apiserver on a local port with a fresh serving
// certificate, client-certificate authentication and RBAC, reaching etcd
// with its client certificate.
func (cp *controlPlane) startAPIServer(ctx context.Context, spec controlPlaneSpec, etcd etcdEndpoint) error {
	servers, err := newAuthority("capl-apiserver-ca")
	if err != nil {
		return err
	}
	if cp.clients, err = newAuthority("capl-client-ca"); err != nil {
		return err
	}
	serving, err := servers.servingCertificate("127.0.0.1", "localhost")
	if err != nil {
		return err
	}
	files := map[string][]byte{
		"apiserver.crt": serving.cert, "apiserver.key": serving.key,
		"client-ca.crt": cp.clients.certPEM,
	}
	if _, ok := spec.apiServerFlags["service-account-key-file"]; !ok {
		key, err := newServiceAccountKey()
		if err != nil {
			return err
		}
		files[serviceAccountKeyName] = key
	}
	for name, data := range files {
		if err := os.WriteFile(filepath.Join(cp.workDir, name), data, 0o600); err != nil {
			return err
		}
	}
	ports, err := freePorts(1)
	if err != nil {
		return err
	}
	saKey := filepath.Join(cp.workDir, serviceAccountKeyName)
	flags := map[string]string{
		"advertise-address":                "127.0.0.1",
		"bind-address":                     "127.0.0.1",
		"secure-port":                      strconv.Itoa(ports[0]),
		"tls-cert-file":                    filepath.Join(cp.workDir, "apiserver.crt"),
		"tls-private-key-file":             filepath.Join(cp.workDir, "apiserver.key"),
		"client-ca-file":                   filepath.Join(cp.workDir, "client-ca.crt"),
		"etcd-servers":                     etcd.clientURL,
		"etcd-cafile":                      etcd.pki.path(etcdCAName),
		"etcd-certfile":                    etcd.pki.path(etcdClientCertName),
		"etcd-keyfile":                     etcd.pki.path(etcdClientKeyName),
		"service-cluster-ip-range":         serviceClusterIPRange,
		"allow-privileged":                 "true",
		"authorization-mode":               "RBAC",
		"service-account-issuer":           serviceAccountIssuer,
		"service-account-key-file":         saKey,
		"service-account-signing-key-file": saKey,
		// Without kube-controller-manager's service-account controller no
		// namespace has a default ServiceAccount, and this plugin would
		// refuse every Pod; none runs here anyway.
		"disable-admission-plugins": "ServiceAccount",
	}
	maps.Copy(flags, spec.apiServerFlags)
	var args []string
	for _, name := range slices.Sorted(maps.Keys(flags)) {
		args = append(args, "--"+name+"="+flags[name])
	}
	if cp.apiServer, err = startChild("kube-apiserver", filepath.Join(spec.assets, "kube-apiserver"), args, nil, filepath.Join(cp.workDir, "kube-apiserver.log")); err != nil {
		return err
	}

	admin, err := cp.clients.clientCertificate("capl-admin", "system:masters")
	if err != nil {
		return err
	}
	cp.admin = &rest.Config{
		Host:            "https://127.0.0.1:" + strconv.Itoa(ports[0]),
		TLSClientConfig: rest.TLSClientConfig{CAData: servers.certPEM, CertData: admin.cert, KeyData: admin.key},
		// The plane's own controllers share one API server with nothing
		// else; client-side throttling would only slow them.
		QPS:   1000,
		Burst: 2000,
	}
	hc, err := rest.HTTPClientFor(cp.admin)
	if err != nil {
		return err
	}
	return waitReady(ctx, cp.apiServer, hc, cp.admin.Host+"/readyz")
}

// userConfig reaches the API server as user in groups, authenticated by a
// client certificate; RBAC's bootstrap policy grants well-known users such
// as system:kube-controller-manager their permissions.
func (cp *controlPlane) userConfig(user string, groups ...string) (*rest.Config, error) {
	pair, err := cp.clients.clientCertificate(user, groups...)
	if err != nil {
		return nil, err
	}
	cfg := rest.CopyConfig(cp.admin)
	cfg.CertData, cfg.KeyData = pair.cert, pair.key
	return cfg, nil
}

// stop stops kube-apiserver, then etcd, and removes the work directory.
func (cp *controlPlane) stop() error {
	var errs []error
	for _, c := range []*child{cp.apiServer, cp.etcd} {
		if c != nil {
			errs = append(errs, c.stop(controlPlaneStopGrace))
		}
	}
	errs = append(errs, os.RemoveAll(cp.workDir))
	return errors.Join(errs...)
}

// waitReady polls url until it answers 200 OK, c exits, or
// controlPlaneStartTimeout passes.
func waitReady(ctx context.Context, c *child, hc *http.Client, url string) error {
	ctx, cancel := context.WithTimeout(ctx, controlPlaneStartTimeout)
	defer cancel()
	var last error
	for {
		attempt, cancelAttempt := context.WithTimeout(ctx, 5*time.Second)
		last = getOK(attempt, hc, url)
		cancelAttempt()
		if last == nil {
			return nil
		}
		select {
		case <-c.exited:
			return c.failure()
		case <-ctx.Done():
			return fmt.Errorf("%s not ready after %s: %v; the end of %s:\n%s", c.name, controlPlaneStartTimeout, last, c.logPath, tail(c.logPath, 20))
		case <-time.After(pollInterval):
		}
	}
}

// kubeconfig is a kubeconfig file's content for cfg, a client-certificate
// configuration, named after user.
func kubeconfig(cfg *rest.Config, user string) ([]byte, error) {
	const name = "capl-management"
	return clientcmd.Write(clientcmdapi.Config{
		Clusters:       map[string]*clientcmdapi.Cluster{name: {Server: cfg.Host, CertificateAuthorityData: cfg.CAData}},
		AuthInfos:      map[string]*clientcmdapi.AuthInfo{user: {ClientCertificateData: cfg.CertData, ClientKeyData: cfg.KeyData}},
		Contexts:       map[string]*clientcmdapi.Context{name: {Cluster: name, AuthInfo: user}},
		CurrentContext: name,
	})
}

// freePorts returns n local ports that were free a moment ago. A process
// that binds one later may race with another taking it; each caller
// starts its process right away.
func freePorts(n int) ([]int, error) {
	r, err := reservePorts(n)
	if err != nil {
		return nil, err
	}
	r.release()
	return r.ports, nil
}

// tcpAddress is host:port.
func tcpAddress(host string, port int) string { return net.JoinHostPort(host, strconv.Itoa(port)) }

// FreePort is a TCP port free on this host now.
func FreePort() (int, error) {
	ports, err := freePorts(1)
	if err != nil {
		return 0, err
	}
	return ports[0], nil
}
