package hosts

import (
	"context"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
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
		wantErr   string
	}{
		{
			name:    "ssh through libssh2 with known_hosts",
			uri:     "qemu+ssh://root@kvm1/system",
			data:    map[string][]byte{SSHPrivateKeyKey: []byte("KEY"), KnownHostsKey: []byte("kvm1 ssh-ed25519 AAAA")},
			wantURI: "qemu+libssh2://root@kvm1/system", wantQuery: []string{"keyfile", "known_hosts", "known_hosts_verify=normal", "sshauth=privkey"},
			wantFiles: map[string]string{"id": "KEY", "known_hosts": "kvm1 ssh-ed25519 AAAA"},
		},
		{
			name:    "libssh through libssh2, whose client does not crash",
			uri:     "qemu+libssh://root@kvm1/system",
			data:    map[string][]byte{SSHPrivateKeyKey: []byte("KEY"), KnownHostsKey: []byte("kvm1 ssh-ed25519 AAAA")},
			wantURI: "qemu+libssh2://root@kvm1/system", wantQuery: []string{"keyfile", "known_hosts", "known_hosts_verify=normal", "sshauth=privkey"},
			wantFiles: map[string]string{"id": "KEY", "known_hosts": "kvm1 ssh-ed25519 AAAA"},
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
			c.remove()
			if _, err := os.Stat(c.dir); !os.IsNotExist(err) {
				t.Errorf("credentials directory %s left after remove (%v)", c.dir, err)
			}
		})
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
	if got := Hosts(lc, "qemu:///system"); got != 3 {
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
