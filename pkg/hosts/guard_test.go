package hosts

import (
	"context"
	"errors"
	"net/netip"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// denyLoopback is a policy of --libvirt-uris=* with the image imports'
// default deny list, and one URI the operator listed.
var denyLoopback = tenancy.Policy{
	ManagerURI:   "qemu:///system",
	LibvirtURIs:  []string{tenancy.Any, "qemu+tls://localhost/system"},
	HostDenyNets: []netip.Prefix{netip.MustParsePrefix("127.0.0.0/8"), netip.MustParsePrefix("::1/128"), netip.MustParsePrefix("169.254.0.0/16")},
}

func TestAddressGuard(t *testing.T) {
	names := map[string][]netip.Addr{
		"kvm1":       {netip.MustParseAddr("10.0.0.5")},
		"rebound":    {netip.MustParseAddr("10.0.0.6"), netip.MustParseAddr("127.0.0.1")},
		"metadata":   {netip.MustParseAddr("169.254.169.254")},
		"mapped":     {netip.MustParseAddr("::ffff:127.0.0.1")},
		"v6-literal": nil,
	}
	lookup := func(_ context.Context, host string) ([]netip.Addr, error) {
		a, ok := names[host]
		if !ok {
			return nil, errors.New("no such host")
		}
		return a, nil
	}
	for _, tc := range []struct {
		name, uri string
		guarded   bool
		want      string // "" connects; else a part of the error
	}{
		{"a name outside the deny list", "qemu+ssh://kvm1/system", true, ""},
		{"a name with one denied address", "qemu+ssh://rebound/system", true, "leads to 127.0.0.1, in 127.0.0.0/8"},
		{"a name into link-local", "qemu+tls://metadata:16514/system", true, "169.254.0.0/16"},
		{"a v4-mapped answer", "qemu+ssh://mapped/system", true, "127.0.0.0/8"},
		{"a literal", "qemu+ssh://[::1]/system", true, "::1/128"},
		{"a name that does not resolve", "qemu+ssh://nowhere/system", true, "resolving nowhere"},
		{"listed by the operator", "qemu+tls://localhost/system", false, ""},
		{"the manager's own", "qemu:///system", false, ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := guardFor(&denyLoopback, tc.uri, lookup)
			if (g != nil) != tc.guarded {
				t.Fatalf("guardFor(%s) = %v; want guarded %v", tc.uri, g, tc.guarded)
			}
			if g == nil {
				return
			}
			err := g.check()
			switch {
			case tc.want == "" && err != nil:
				t.Fatalf("check() = %v; want nil", err)
			case tc.want != "" && (err == nil || !strings.Contains(err.Error(), tc.want)):
				t.Fatalf("check() = %v; want an error with %q", err, tc.want)
			}
		})
	}
	if g := guardFor(&tenancy.Policy{LibvirtURIs: []string{tenancy.Any}}, "qemu+ssh://localhost/system", lookup); g != nil {
		t.Errorf("an empty deny list guards: %v", g)
	}
	if g := guardFor(nil, "qemu+ssh://localhost/system", lookup); g != nil {
		t.Errorf("no policy guards: %v", g)
	}
}

// TestSetRefusesDeniedName connects through a Set to a name that resolves
// to loopback, as a tenant's failure domain under --libvirt-uris=* would:
// libvirt is never asked to connect (it would report the port's state:
// "Connection refused"), the host is unreachable with the denial.
func TestSetRefusesDeniedName(t *testing.T) {
	CredentialsDir = t.TempDir()
	secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "t", Name: "tls"},
		Data: map[string][]byte{TLSCertKey: []byte("C"), TLSKeyKey: []byte("K"), CACertKey: []byte("CA")}}
	set := NewSet(nil, "qemu:///system", "manager", fake.NewClientBuilder().WithObjects(secret).Build())
	set.Guard(denyLoopback)
	set.lookup = func(context.Context, string) ([]netip.Addr, error) {
		return []netip.Addr{netip.MustParseAddr("127.0.0.1")}, nil
	}
	defer func() { _ = set.Close() }()
	h, err := set.Get(context.Background(), Ref{URI: "qemu+tls://capl-test.invalid:1/system", Namespace: "t", Secret: "tls"})
	if err != nil {
		t.Fatalf("Get: %v", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		err := Reachable(h)
		if err != nil && strings.Contains(err.Error(), "connecting to") {
			if !strings.Contains(err.Error(), "leads to 127.0.0.1, in 127.0.0.0/8") {
				t.Fatalf("Reachable = %v; want the denial", err)
			}
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("no connect attempt reported within 30s (Reachable = %v)", err)
		}
		time.Sleep(100 * time.Millisecond)
	}
}
