package plane

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"
)

// The files of etcd's certificates in their directory (etcdCertsDirName
// in the state directory, or the work directory of a throwaway control
// plane). All are 0600.
const (
	etcdCAName         = "ca.crt"
	etcdServerCertName = "server.crt"
	etcdServerKeyName  = "server.key"
	etcdClientCertName = "apiserver-etcd-client.crt"
	etcdClientKeyName  = "apiserver-etcd-client.key"
)

// etcdCertRenewBefore is how long before its expiry a certificate of etcd
// is made anew at a start, so that a plane restarted now and then never
// runs into an expired one.
const etcdCertRenewBefore = 30 * 24 * time.Hour

// etcdCertHosts are the names the plane's own etcd's serving certificate
// is valid for: it listens on loopback only.
var etcdCertHosts = []string{loopbackHost, "localhost"}

// etcdPKI is a directory of etcd's certificates: its authority, its
// serving (and peer) certificate and kube-apiserver's client certificate.
type etcdPKI string

func (p etcdPKI) path(name string) string { return filepath.Join(string(p), name) }

// ensureEtcdPKI keeps the certificates in dir when they form a set valid
// beyond now+etcdCertRenewBefore, and otherwise makes the whole set anew,
// the serving certificate for hosts (etcdCertHosts when none are given):
// a plane of an older version, whose etcd served plain HTTP, has none,
// and a set with a file missing cannot be completed, since the
// authority's key is never written (it signs these two certificates and
// nothing else, so that no other client can ever be issued one).
func ensureEtcdPKI(dir string, now time.Time, hosts ...string) error {
	p := etcdPKI(dir)
	if len(hosts) == 0 {
		hosts = etcdCertHosts
	}
	if err := p.check(now.Add(etcdCertRenewBefore)); err == nil {
		return p.restrict()
	} else if !errors.Is(err, os.ErrNotExist) && !errors.Is(err, errInvalidEtcdPKI) {
		return err
	}
	return p.generate(hosts)
}

// errInvalidEtcdPKI marks a set of certificates that must be made anew.
var errInvalidEtcdPKI = errors.New("invalid etcd certificates")

// check is nil when every file is there, each key matches its
// certificate, and both certificates chain to the authority for their
// use and are still valid at validAt.
func (p etcdPKI) check(validAt time.Time) error {
	caPEM, err := os.ReadFile(p.path(etcdCAName))
	if err != nil {
		return err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return fmt.Errorf("%w: %s holds no certificate", errInvalidEtcdPKI, p.path(etcdCAName))
	}
	for _, pair := range []struct {
		cert, key string
		usage     x509.ExtKeyUsage
	}{
		{etcdServerCertName, etcdServerKeyName, x509.ExtKeyUsageServerAuth},
		{etcdServerCertName, etcdServerKeyName, x509.ExtKeyUsageClientAuth},
		{etcdClientCertName, etcdClientKeyName, x509.ExtKeyUsageClientAuth},
	} {
		if err := p.checkPair(pair.cert, pair.key, roots, pair.usage, validAt); err != nil {
			return err
		}
	}
	return nil
}

// checkPair checks one certificate and its key (see check).
func (p etcdPKI) checkPair(certName, keyName string, roots *x509.CertPool, usage x509.ExtKeyUsage, validAt time.Time) error {
	certPEM, err := os.ReadFile(p.path(certName))
	if err != nil {
		return err
	}
	keyPEM, err := os.ReadFile(p.path(keyName))
	if err != nil {
		return err
	}
	pair, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		return fmt.Errorf("%w: %s: %v", errInvalidEtcdPKI, certName, err)
	}
	cert := pair.Leaf
	if cert == nil {
		if cert, err = x509.ParseCertificate(pair.Certificate[0]); err != nil {
			return fmt.Errorf("%w: %s: %v", errInvalidEtcdPKI, certName, err)
		}
	}
	if _, err := cert.Verify(x509.VerifyOptions{Roots: roots, CurrentTime: validAt, KeyUsages: []x509.ExtKeyUsage{usage}}); err != nil {
		return fmt.Errorf("%w: %s: %v", errInvalidEtcdPKI, certName, err)
	}
	return nil
}

// restrict makes every file 0600, as generate writes them.
func (p etcdPKI) restrict() error {
	for _, name := range []string{etcdCAName, etcdServerCertName, etcdServerKeyName, etcdClientCertName, etcdClientKeyName} {
		if err := os.Chmod(p.path(name), 0o600); err != nil {
			return err
		}
	}
	return os.Chmod(string(p), 0o700)
}

// generate makes a new authority, etcd's serving and peer certificate for
// hosts and kube-apiserver's client certificate, and writes them with the
// certificate authority last, so that a set interrupted half-way fails
// check and is made anew.
func (p etcdPKI) generate(hosts []string) error {
	ca, err := newAuthority("capl-etcd-ca")
	if err != nil {
		return err
	}
	// etcd presents its serving certificate to peers as a client too.
	server, err := ca.hostCertificate([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, hosts...)
	if err != nil {
		return err
	}
	client, err := ca.clientCertificate("kube-apiserver-etcd-client")
	if err != nil {
		return err
	}
	if err := os.MkdirAll(string(p), 0o700); err != nil {
		return err
	}
	_ = os.Remove(p.path(etcdCAName))
	for _, f := range []struct {
		name string
		data []byte
	}{
		{etcdServerCertName, server.cert}, {etcdServerKeyName, server.key},
		{etcdClientCertName, client.cert}, {etcdClientKeyName, client.key},
		{etcdCAName, ca.certPEM},
	} {
		if err := writeFileAtomic(p.path(f.name), f.data); err != nil {
			return fmt.Errorf("writing etcd's certificates: %w", err)
		}
	}
	return p.restrict()
}

// clientTLS is the TLS configuration of a client of etcd holding
// kube-apiserver's certificate: the control plane's readiness check.
func (p etcdPKI) clientTLS() (*tls.Config, error) {
	caPEM, err := os.ReadFile(p.path(etcdCAName))
	if err != nil {
		return nil, err
	}
	roots := x509.NewCertPool()
	if !roots.AppendCertsFromPEM(caPEM) {
		return nil, fmt.Errorf("%s holds no certificate", p.path(etcdCAName))
	}
	pair, err := tls.LoadX509KeyPair(p.path(etcdClientCertName), p.path(etcdClientKeyName))
	if err != nil {
		return nil, err
	}
	return &tls.Config{RootCAs: roots, Certificates: []tls.Certificate{pair}, MinVersion: tls.VersionTLS12}, nil
}
