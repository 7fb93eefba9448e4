package hosts

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/url"
	"os"
	"os/exec"
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
// libvirt's transports read keys and certificates from files only. A
// qemu+ssh connection also runs a wrapper script from there, so it must
// not be mounted noexec.
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
	if c.uri, err = credentialsURI(ref.URI, kind, dir); err == nil {
		err = c.writeSSHClient()
	}
	if err != nil {
		c.remove()
		return nil, err
	}
	return c, nil
}

// writeSSHClient writes the OpenSSH client's configuration and wrapper
// when the connection runs it.
func (c *credentials) writeSSHClient() error {
	if !runsOpenSSH(c.ref.URI) {
		return nil
	}
	ssh, err := exec.LookPath("ssh")
	if err != nil {
		return fmt.Errorf("libvirt URI %s runs the OpenSSH client, which the manager cannot find: %w", c.ref.URI, err)
	}
	if strings.ContainsAny(c.dir, "\"\n") {
		return fmt.Errorf("credentials directory %q: a double quote or a line break cannot be written into an ssh_config", c.dir)
	}
	files, wrapper := SSHClientFiles(ssh, c.dir)
	for _, name := range []string{sshConfigFile, wrapper} {
		if err := writePrivate(filepath.Join(c.dir, name), []byte(files[name])); err != nil {
			return err
		}
	}
	return os.Chmod(filepath.Join(c.dir, wrapper), 0o700)
}

// SSHClientFiles returns the files writeSSHClient writes into the
// credentials directory dir of a qemu+ssh connection, by name, and the name
// of the wrapper among them, which libvirt runs instead of ssh (the URI's
// command=, mode 0700): a #!/bin/sh script that execs the OpenSSH client at
// path ssh with the connection's own configuration, the other file. The
// manager's container image carries /bin/sh for it; its test
// (images/manager) runs these files there.
func SSHClientFiles(ssh, dir string) (files map[string]string, wrapper string) {
	return map[string]string{
		sshConfigFile:  sshConfig(dir),
		sshWrapperFile: sshWrapper(ssh, dir),
	}, sshWrapperFile
}

// credentialsURI is uri with the transport options that make it use the
// files in dir.
//
// qemu+ssh runs the OpenSSH client, as libvirt does by default, but
// through a wrapper in dir that hands it a configuration of its own
// (sshConfig): the tenant's key and known_hosts only, never the manager's
// keys, agent or ~/.ssh/config. The URI's libssh transports go through
// libvirt's libssh2 client, which takes a key file and a known_hosts file
// as parameters. The OpenSSH client is the default because libvirt's
// embedded SSH clients proved fragile under a volume stream (libssh
// crashed the process; libssh2 once stalled a read-back for minutes),
// while to libvirt the OpenSSH client is a pipe, like a TCP socket.
func credentialsURI(uri, kind, dir string) (string, error) {
	u, err := url.Parse(uri)
	if err != nil {
		return "", err
	}
	q := u.Query()
	switch {
	case kind == tenancy.CredentialsTLS:
		q.Set("pkipath", dir)
	case runsOpenSSH(uri):
		q.Set("command", filepath.Join(dir, sshWrapperFile))
		q.Set("no_tty", "1")
	default:
		u.Scheme = "qemu+libssh2"
		q.Set("keyfile", filepath.Join(dir, "id"))
		q.Set("known_hosts", filepath.Join(dir, "known_hosts"))
		q.Set("known_hosts_verify", "normal")
		q.Set("sshauth", "privkey")
	}
	u.RawQuery = q.Encode()
	return u.String(), nil
}

// runsOpenSSH tells whether libvirt reaches uri through the OpenSSH client.
func runsOpenSSH(uri string) bool {
	u, err := url.Parse(uri)
	return err == nil && strings.EqualFold(u.Scheme, "qemu+ssh")
}

// The files the OpenSSH transport adds to a credentials directory.
const (
	sshConfigFile  = "ssh_config"
	sshWrapperFile = "ssh"
)

// sshConfig is the OpenSSH client configuration of a connection whose
// files are in dir. It is the only configuration the client reads (-F):
// strict host key checking against the Secret's known_hosts, public-key
// authentication with the Secret's key alone (no agent, no default
// identities, no Kerberos), no proxy, multiplexing or forwarding that a
// configuration on the manager's side could have added, and keepalives
// that end a connection whose host went silent.
func sshConfig(dir string) string {
	return strings.Join([]string{
		"Host *",
		"  UserKnownHostsFile " + quoteSSHConfig(filepath.Join(dir, "known_hosts")),
		"  GlobalKnownHostsFile none",
		"  StrictHostKeyChecking yes",
		"  UpdateHostKeys no",
		"  CheckHostIP no",
		"  IdentityFile " + quoteSSHConfig(filepath.Join(dir, "id")),
		"  IdentitiesOnly yes",
		"  IdentityAgent none",
		"  PreferredAuthentications publickey",
		"  PasswordAuthentication no",
		"  KbdInteractiveAuthentication no",
		"  GSSAPIAuthentication no",
		"  BatchMode yes",
		"  ProxyCommand none",
		"  ProxyJump none",
		"  ControlMaster no",
		"  ControlPath none",
		"  PermitLocalCommand no",
		"  ForwardAgent no",
		"  ForwardX11 no",
		"  ClearAllForwardings yes",
		"  ConnectTimeout 15",
		"  ServerAliveInterval 10",
		"  ServerAliveCountMax 3",
		"",
	}, "\n")
}

// sshWrapper is the program libvirt runs instead of ssh: the ssh binary
// with the connection's own configuration, libvirt's arguments passed on.
// It needs a /bin/sh where the manager runs (dash, in images/manager's image).
func sshWrapper(ssh, dir string) string {
	return "#!/bin/sh\nexec " + quoteShell(ssh) + " -F " + quoteShell(filepath.Join(dir, sshConfigFile)) + " \"$@\"\n"
}

// quoteSSHConfig quotes a path for ssh_config, which takes double quotes;
// credentials directories never hold a double quote (checked on creation).
func quoteSSHConfig(path string) string { return `"` + path + `"` }

// quoteShell quotes s for sh in single quotes.
func quoteShell(s string) string { return "'" + strings.ReplaceAll(s, "'", `'\''`) + "'" }

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
		data := secret.Data[key]
		if key == SSHPrivateKeyKey && !bytes.HasSuffix(data, []byte("\n")) {
			// OpenSSH reads no key whose last line is unterminated, as
			// one pasted into a Secret's stringData often is.
			data = append(bytes.Clone(data), '\n')
		}
		if err := writePrivate(filepath.Join(c.dir, name), data); err != nil {
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
