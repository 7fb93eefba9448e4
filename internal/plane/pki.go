package plane

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// certificateLifetime bounds every certificate the plane issues. A plane
// makes new ones at every start, so a year only matters to a plane left
// running that long.
const certificateLifetime = 365 * 24 * time.Hour

// authority is a certificate authority that lives as long as one start of
// the plane: one signs kube-apiserver's serving certificate, one the
// clients' certificates (its --client-ca-file), one the webhook servers'.
// etcd's (etcdpki.go) is the exception: its certificates are kept in the
// state directory across starts, its key never written.
type authority struct {
	cert *x509.Certificate
	key  *ecdsa.PrivateKey
	// certPEM is cert, PEM-encoded, for CA bundles and files.
	certPEM []byte
}

// keyPair is a certificate and its private key, PEM-encoded.
type keyPair struct {
	cert, key []byte
}

func newAuthority(name string) (*authority, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	template, err := certificateTemplate(pkix.Name{CommonName: name})
	if err != nil {
		return nil, err
	}
	template.IsCA = true
	template.BasicConstraintsValid = true
	template.KeyUsage = x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, template, template, &key.PublicKey, key)
	if err != nil {
		return nil, fmt.Errorf("certificate authority %s: %w", name, err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	return &authority{cert: cert, key: key, certPEM: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})}, nil
}

// servingCertificate is for a server reached at hosts (names or IPs).
func (a *authority) servingCertificate(hosts ...string) (keyPair, error) {
	return a.hostCertificate([]x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth}, hosts...)
}

// hostCertificate is for a process reached at hosts (names or IPs), for
// usages.
func (a *authority) hostCertificate(usages []x509.ExtKeyUsage, hosts ...string) (keyPair, error) {
	template, err := certificateTemplate(pkix.Name{CommonName: hosts[0]})
	if err != nil {
		return keyPair{}, err
	}
	for _, h := range hosts {
		if ip := net.ParseIP(h); ip != nil {
			template.IPAddresses = append(template.IPAddresses, ip)
		} else {
			template.DNSNames = append(template.DNSNames, h)
		}
	}
	template.ExtKeyUsage = usages
	return a.issue(template)
}

// clientCertificate authenticates user, member of groups, to an API server
// whose --client-ca-file is a: it reads the user from the common name and
// the groups from the organisations.
func (a *authority) clientCertificate(user string, groups ...string) (keyPair, error) {
	template, err := certificateTemplate(pkix.Name{CommonName: user, Organization: groups})
	if err != nil {
		return keyPair{}, err
	}
	template.ExtKeyUsage = []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}
	return a.issue(template)
}

func (a *authority) issue(template *x509.Certificate) (keyPair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return keyPair{}, err
	}
	if template.KeyUsage == 0 {
		template.KeyUsage = x509.KeyUsageDigitalSignature
	}
	der, err := x509.CreateCertificate(rand.Reader, template, a.cert, &key.PublicKey, a.key)
	if err != nil {
		return keyPair{}, fmt.Errorf("certificate for %s: %w", template.Subject.CommonName, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return keyPair{}, err
	}
	return keyPair{
		cert: pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		key:  pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: keyDER}),
	}, nil
}

func certificateTemplate(subject pkix.Name) (*x509.Certificate, error) {
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
	if err != nil {
		return nil, err
	}
	now := time.Now()
	return &x509.Certificate{
		SerialNumber: serial,
		Subject:      subject,
		NotBefore:    now,
		NotAfter:     now.Add(certificateLifetime),
	}, nil
}

// WriteServingCertificate writes tls.crt and tls.key for a server reached
// at hosts into dir (created 0700), signed by a throwaway authority that
// nothing trusts: for a webhook server no API server calls.
func WriteServingCertificate(dir string, hosts ...string) error {
	ca, err := newAuthority("capl-throwaway-ca")
	if err != nil {
		return err
	}
	pair, err := ca.servingCertificate(hosts...)
	if err != nil {
		return err
	}
	return writeKeyPair(dir, pair)
}

// writeKeyPair writes pair as dir/tls.crt and dir/tls.key (0600), the
// names controller-runtime's webhook server reads.
func writeKeyPair(dir string, pair keyPair) error {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	for name, data := range map[string][]byte{"tls.crt": pair.cert, "tls.key": pair.key} {
		if err := os.WriteFile(filepath.Join(dir, name), data, 0o600); err != nil {
			return err
		}
	}
	return nil
}
