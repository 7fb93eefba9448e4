package hosts

import (
	"context"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
)

func TestCredentials(t *testing.T) {
	CredentialsDir = t.TempDir()
	for _, tc := range []struct {
		name      string
		uri       string
		data      map[string][]byte
		wantURI   string // scheme://host/path the transport uses
		wantQuery []string
		wantFiles map[string]string
		wantExec  []string // files the transport runs (0700)
		wantErr   string
	}{
		{
			name:    "ssh through the OpenSSH client with a configuration of its own",
			uri:     "qemu+ssh://root@kvm1/system",
			data:    map[string][]byte{SSHPrivateKeyKey: []byte("KEY"), KnownHostsKey: []byte("kvm1 ssh-ed25519 AAAA")},
			wantURI: "qemu+ssh://root@kvm1/system", wantQuery: []string{"command", "no_tty=1"},
			wantFiles: map[string]string{"id": "KEY\n", "known_hosts": "kvm1 ssh-ed25519 AAAA"},
			wantExec:  []string{sshWrapperFile},
		},
		{
			name:    "libssh through libssh2, whose client does not crash",
			uri:     "qemu+libssh://root@kvm1/system",
			data:    map[string][]byte{SSHPrivateKeyKey: []byte("KEY\n"), KnownHostsKey: []byte("kvm1 ssh-ed25519 AAAA")},
			wantURI: "qemu+libssh2://root@kvm1/system", wantQuery: []string{"keyfile", "known_hosts", "known_hosts_verify=normal", "sshauth=privkey"},
			wantFiles: map[string]string{"id": "KEY\n", "known_hosts": "kvm1 ssh-ed25519 AAAA"},
		},
		{
			name:    "libssh2 as asked",
			uri:     "qemu+libssh2://root@kvm1/system",
			data:    map[string][]byte{SSHPrivateKeyKey: []byte("KEY\n"), KnownHostsKey: []byte("kvm1 ssh-ed25519 AAAA")},
			wantURI: "qemu+libssh2://root@kvm1/system", wantQuery: []string{"keyfile", "known_hosts", "known_hosts_verify=normal", "sshauth=privkey"},
			wantFiles: map[string]string{"id": "KEY\n", "known_hosts": "kvm1 ssh-ed25519 AAAA"},
		},
		{
			name:    "tls through pkipath",
			uri:     "qemu+tls://kvm1/system",
			data:    map[string][]byte{TLSCertKey: []byte("CERT"), TLSKeyKey: []byte("PKEY"), CACertKey: []byte("CA")},
			wantURI: "qemu+tls://kvm1/system", wantQuery: []string{"pkipath"},
			wantFiles: map[string]string{"clientcert.pem": "CERT", "clientkey.pem": "PKEY", "cacert.pem": "CA"},
		},
		{
			name:    "no known_hosts: never trust an unknown host key",
			uri:     "qemu+ssh://kvm1/system",
			data:    map[string][]byte{SSHPrivateKeyKey: []byte("KEY")},
			wantErr: "lacks known_hosts",
		},
		{name: "tcp takes no credentials", uri: "qemu+tcp://kvm1/system", wantErr: "takes no credentials"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1", Name: "kvm1"}, Data: tc.data}
			reader := fake.NewClientBuilder().WithObjects(secret).Build()
			ref := Ref{URI: tc.uri, Namespace: "ns1", Secret: "kvm1"}
			c, err := newCredentials(ref)
			if err == nil {
				defer c.remove()
				err = c.refresh(context.Background(), reader)
			}
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("err = %v; want %q", err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			u, err := url.Parse(c.uri)
			if err != nil {
				t.Fatal(err)
			}
			if got := u.Scheme + "://" + u.User.String() + map[bool]string{true: "@", false: ""}[u.User != nil] + u.Host + u.Path; got != tc.wantURI {
				t.Errorf("transport URI %s; want %s", got, tc.wantURI)
			}
			for _, q := range tc.wantQuery {
				k, v, hasValue := strings.Cut(q, "=")
				if !u.Query().Has(k) || hasValue && u.Query().Get(k) != v {
					t.Errorf("transport URI %s lacks %s", c.uri, q)
				}
			}
			info, err := os.Stat(c.dir)
			if err != nil || info.Mode().Perm() != 0o700 {
				t.Errorf("credentials directory %s: %v, mode %v; want 0700", c.dir, err, info.Mode())
			}
			for name, want := range tc.wantFiles {
				path := filepath.Join(c.dir, name)
				got, err := os.ReadFile(path)
				if err != nil || string(got) != want {
					t.Errorf("%s = %q, %v; want %q", name, got, err, want)
				}
				if info, err := os.Stat(path); err != nil || info.Mode().Perm() != 0o600 {
					t.Errorf("%s mode %v (%v); want 0600", name, info.Mode(), err)
				}
			}
			for _, name := range tc.wantExec {
				if info, err := os.Stat(filepath.Join(c.dir, name)); err != nil || info.Mode().Perm() != 0o700 {
					t.Errorf("%s mode %v (%v); want 0700", name, info.Mode(), err)
				}
			}
			c.remove()
			if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
				t.Errorf("credentials directory %s left after remove (%v)", c.dir, err)
			}
		})
	}
}

// TestOpenSSHConfiguration asks the OpenSSH client itself (ssh -G, which
// prints the configuration it would connect with, without connecting)
// what the wrapper of a qemu+ssh connection makes it do: only the
// Secret's key and known_hosts, strict host key checking, no agent and
// nothing from the manager's own ~/.ssh/config.
func TestOpenSSHConfiguration(t *testing.T) {
	if _, err := exec.LookPath("ssh"); err != nil {
		testprereq.Missing(t, "no OpenSSH client (apt install openssh-client; hack/prepare-host.sh installs it)")
	}
	CredentialsDir = t.TempDir()
	home := t.TempDir()
	t.Setenv("HOME", home)
	t.Setenv("SSH_AUTH_SOCK", filepath.Join(home, "agent.sock"))
	must(t, os.MkdirAll(filepath.Join(home, ".ssh"), 0o700))
	// What an operator's own configuration might say, none of which may
	// reach a tenant's connection.
	must(t, os.WriteFile(filepath.Join(home, ".ssh", "config"), []byte(
		"Host *\n  StrictHostKeyChecking no\n  ProxyCommand nc %h %p\n  IdentityFile ~/.ssh/operator\n  ForwardAgent yes\n"), 0o600))
	c, err := newCredentials(Ref{URI: "qemu+ssh://root@kvm1:2222/system", Namespace: "ns1", Secret: "kvm1"})
	must(t, err)
	defer c.remove()
	out, err := exec.Command(filepath.Join(c.dir, sshWrapperFile), "-G", "-p", "2222", "-l", "root", "--", "kvm1").CombinedOutput()
	if err != nil {
		t.Fatalf("ssh -G through the wrapper: %v\n%s", err, out)
	}
	got := map[string][]string{}
	for _, line := range strings.Split(string(out), "\n") {
		k, v, _ := strings.Cut(line, " ")
		got[k] = append(got[k], v)
	}
	for key, want := range map[string]string{
		"stricthostkeychecking": "true",
		"userknownhostsfile":    filepath.Join(c.dir, "known_hosts"),
		"globalknownhostsfile":  "none",
		"identityfile":          filepath.Join(c.dir, "id"),
		"identitiesonly":        "yes",
		"identityagent":         "none",
		"batchmode":             "yes",
		"forwardagent":          "no",
		"port":                  "2222",
		"user":                  "root",
		"hostname":              "kvm1",
		"serveraliveinterval":   "10",
	} {
		if strings.Join(got[key], ",") != want {
			t.Errorf("ssh -G %s = %q; want %q", key, got[key], want)
		}
	}
	if p := got["proxycommand"]; len(p) > 0 && p[0] != "none" {
		t.Errorf("ssh -G proxycommand = %q: the manager's ~/.ssh/config reached a tenant's connection", p)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}

func TestPlacementHelpers(t *testing.T) {
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns1"}}
	lc.Spec.FailureDomains = []infrav1.FailureDomainSpec{
		{Name: "local"},
		{Name: "worker-1", URI: "qemu+ssh://kvm1/system", CredentialsRef: &infrav1.SecretReference{Name: "kvm1"}},
		{Name: "cp-1", URI: "qemu+ssh://kvm2/system", ControlPlane: ptr.To(true)},
		{Name: "same-as-manager", URI: "qemu:///system"},
	}
	if got := CountHosts(lc, "qemu:///system"); got != 3 {
		t.Errorf("Hosts = %d; want 3 (the manager's, kvm1, kvm2)", got)
	}
	if got := LoadBalancerFailureDomain(lc); got != "cp-1" {
		t.Errorf("LoadBalancerFailureDomain = %q; want the first control-plane one, cp-1", got)
	}
	lc.Spec.LoadBalancer.FailureDomain = "local"
	if got := LoadBalancerFailureDomain(lc); got != "local" {
		t.Errorf("LoadBalancerFailureDomain = %q; want the named one", got)
	}
	if ref, ok := FailureDomainRef(lc, "worker-1"); !ok || ref != (Ref{URI: "qemu+ssh://kvm1/system", Namespace: "ns1", Secret: "kvm1"}) {
		t.Errorf("FailureDomainRef(worker-1) = %+v, %v: the credentials must be the cluster's namespace's", ref, ok)
	}
	if _, ok := FailureDomainRef(lc, "elsewhere"); ok {
		t.Error("FailureDomainRef found a failure domain the cluster does not list")
	}
	if ref, ok := FailureDomainRef(&infrav1.LibvirtCluster{}, "anything"); !ok || !ref.IsDefault("qemu:///system") {
		t.Errorf("a cluster without failure domains: %+v, %v; want the manager's host", ref, ok)
	}
	if (Ref{URI: "qemu:///system", Namespace: "ns1", Secret: "s"}).IsDefault("qemu:///system") {
		t.Error("a Ref with credentials is never the manager's own connection")
	}
}
