package hosts

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// The keys a credentials Secret holds, by transport: Kubernetes' own
// names for SSH-auth and TLS Secrets.
const (
	// SSHPrivateKeyKey holds the SSH private key (kubernetes.io/ssh-auth).
	SSHPrivateKeyKey = corev1.SSHAuthPrivateKey
	// KnownHostsKey holds the host keys the SSH connection accepts; there
	// is no connecting to an SSH host whose key nobody vouched for.
	KnownHostsKey = "known_hosts"
	// TLSCertKey, TLSKeyKey and CACertKey hold the client certificate, its
	// key and the CA of the host's certificate (kubernetes.io/tls plus ca.crt).
	TLSCertKey = corev1.TLSCertKey
	TLSKeyKey  = corev1.TLSPrivateKeyKey
	CACertKey  = "ca.crt"
)

// CredentialsDir is where connections' credentials are written, one
// directory (0700, files 0600) per connection, removed when it closes:
// libvirt's transports read keys and certificates from files only.
var CredentialsDir = os.TempDir()

// credentials are the files one connection's transport reads, written
// from its Secret, and the URI that points the transport at them.
type credentials struct {
	ref  Ref
	kind string // tenancy.CredentialsSSH or tenancy.CredentialsTLS
	dir  string
	uri  string

	mu      sync.Mutex
	version string // the Secret's resourceVersion last written
}

// newCredentials makes the directory of ref's credentials and the URI
// that uses them; refresh writes the files.
func newCredentials(ref Ref) (*credentials, error) {
	kind, err := tenancy.ParseLibvirtURI(ref.URI)
	if err != nil {
		return nil, fmt.Errorf("libvirt URI %s %w", ref.URI, err)
	}
	if kind == "" {
		return nil, fmt.Errorf("libvirt URI %s takes no credentials: only SSH and TLS transports do", ref.URI)
	}
	dir, err := os.MkdirTemp(CredentialsDir, "capl-credentials-")
	if err != nil {
		return nil, fmt.Errorf("making a directory for the credentials of %s: %w", ref.String(), err)
	}
	c := &credentials{ref: ref, kind: kind, dir: dir}
	if c.uri, err = credentialsURI(ref.URI, kind, dir); err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

// credentialsURI is uri with the transport options that make it use the
// files in dir. SSH goes through libvirt's libssh2 transport, which takes
// a known_hosts file (the ssh binary would read the manager's own
// configuration) and refuses an unknown host key.
func credentialsURI(uri, kind, dir string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", err
	}
	q := u.Query()
	switch kind {
	case tenancy.CredentialsSSH:
		u.Scheme = "qemu+libssh2"
		q.Set("keyfile", filepath.Join(dir, "id"))
		q.Set("known_hosts", filepath.Join(dir, "known_hosts"))
		q.Set("known_hosts_verify", "normal")
		q.Set("sshauth", "privkey")
	case tenancy.CredentialsTLS:
		q.Set("pkipath", dir)
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// files maps each file of the credentials to the Secret key it comes from.
func (c *credentials) files() map[string]string {
	if c.kind == tenancy.CredentialsSSH {
		return map[string]string{"id": SSHPrivateKeyKey, "known_hosts": KnownHostsKey}
	}
	return map[string]string{"clientcert.pem": TLSCertKey, "clientkey.pem": TLSKeyKey, "cacert.pem": CACertKey}
}

// refresh writes the Secret's current content unless it was written
// already; a Secret that is missing or lacks a key is an error naming it.
func (c *credentials) refresh(ctx context.Context, secrets client.Reader) error {
	secret := &corev1.Secret{}
	if err := secrets.Get(ctx, types.NamespacedName{Namespace: c.ref.Namespace, Name: c.ref.Secret}, secret); err != nil {
		return fmt.Errorf("reading the credentials Secret %s/%s of %s: %w", c.ref.Namespace, c.ref.Secret, c.ref.URI, err)
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if secret.ResourceVersion != "" && secret.ResourceVersion == c.version {
		return nil
	}
	var missing []string
	for _, key := range c.files() {
		if len(secret.Data[key]) == 0 {
			missing = append(missing, key)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("the credentials Secret %s/%s of %s (%s transport) lacks %s", c.ref.Namespace, c.ref.Secret, c.ref.URI,
			c.kind, strings.Join(missing, ", "))
	}
	for name, key := range c.files() {
		if err := writePrivate(filepath.Join(c.dir, name), secret.Data[key]); err != nil {
			return err
		}
	}
	c.version = secret.ResourceVersion
	return nil
}

// writePrivate replaces path with data, readable by its owner only.
func writePrivate(path string, data []byte) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".tmp-")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(data)
	if cerr := tmp.Close(); werr == nil {
		werr = cerr
	}
	if werr == nil {
		werr = os.Rename(tmp.Name(), path)
	}
	if werr != nil {
		_ = os.Remove(tmp.Name())
	}
	return werr
}

// remove deletes the credentials' files; nil credentials are nothing.
func (c *credentials) remove() {
	if c == nil {
		return
	}
	if err := os.RemoveAll(c.dir); err != nil && !errors.Is(err, os.ErrNotExist) {
		ctrl.Log.WithName("hosts").Error(err, "Removing a connection's credentials", "dir", c.dir)
	}
}
