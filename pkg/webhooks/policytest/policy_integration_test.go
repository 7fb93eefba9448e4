package policytest_test

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/spf13/pflag"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// c talks to the API server whose webhooks enforce the policy; nil with -short.
var c client.Client

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() && !testprereq.InCI() {
		os.Exit(m.Run())
	}
	os.Exit(run(m))
}

func run(m *testing.M) int {
	policy, err := flagPolicy("--libvirt-uris=*")
	if err != nil {
		fmt.Println(err)
		return 1
	}
	env, err := testenv.Start(plane.WithProviderWebhooks())
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer func() { _ = env.Stop() }()
	mgr, err := env.StartManager(plane.ProviderWebhooksWithPolicy(nil, &policy))
	if err != nil {
		fmt.Println(err)
		return 1
	}
	defer func() { _ = mgr.Stop() }()
	c = env.Client
	return m.Run()
}

// flagPolicy is the policy of the manager's flags: their defaults but args.
func flagPolicy(args ...string) (tenancy.Policy, error) {
	var opts manager.Options
	fs := pflag.NewFlagSet("manager", pflag.ContinueOnError)
	opts.AddFlags(fs)
	if err := fs.Parse(args); err != nil {
		return tenancy.Policy{}, err
	}
	return opts.Tenancy()
}

// onTwoHosts spreads s over the manager's host and uri, on a host bridge
// (a NAT network lives on one host), with credentials when secret is set.
func onTwoHosts(s *infrav1.LibvirtClusterSpec, uri, secret string) {
	s.FailureDomains = []infrav1.FailureDomainSpec{{Name: "local", ControlPlane: ptr.To(true)}, {Name: "remote", URI: uri}}
	if secret != "" {
		s.FailureDomains[1].CredentialsRef = &infrav1.SecretReference{Name: secret}
	}
	s.Network = infrav1.ClusterNetwork{Bridge: "br0"}
	s.LoadBalancer.Type = infrav1.LoadBalancerNone
	s.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "192.168.1.240", Port: 6443}
}

// TestPolicyRejections: under the flags' defaults with --libvirt-uris=*,
// the API server refuses a public network range, a failure domain that
// would connect with the manager's own credentials or to a denied
// address, an HAProxy VM larger than one machine may be, and an endpoint
// from a cluster-wide IPAM pool not granted, naming the field; private
// ranges, hosts with credentials and namespaced pools pass.
func TestPolicyRejections(t *testing.T) {
	if testing.Short() && !testprereq.InCI() {
		t.Skip("integration test: not run with -short outside CI")
	}
	if c == nil {
		t.Fatal("no API server: TestMain did not start envtest")
	}
	for i, tc := range []struct {
		name   string
		spec   func(*infrav1.LibvirtClusterSpec)
		field  string // "" accepts
		detail string
	}{
		{"a public network range", func(s *infrav1.LibvirtClusterSpec) { s.Network.CIDR = "8.8.8.0/24" },
			"spec.network.cidr", "--network-cidrs"},
		{"a private network range", func(s *infrav1.LibvirtClusterSpec) { s.Network.CIDR = "10.20.0.0/24" }, "", ""},
		{"any host without credentials", func(s *infrav1.LibvirtClusterSpec) { onTwoHosts(s, "qemu+ssh://kvm1/system", "") },
			"spec.failureDomains[1].uri", "needs credentialsRef"},
		{"upper-case libssh without credentials", func(s *infrav1.LibvirtClusterSpec) { onTwoHosts(s, "qemu+LIBSSH://kvm1/system", "") },
			"spec.failureDomains[1].uri", "needs credentialsRef"},
		{"a loopback host", func(s *infrav1.LibvirtClusterSpec) { onTwoHosts(s, "qemu+tls://127.0.0.1:16514/system", "tls") },
			"spec.failureDomains[1].uri", "127.0.0.0/8"},
		{"any host with credentials", func(s *infrav1.LibvirtClusterSpec) { onTwoHosts(s, "qemu+ssh://kvm1/system", "kvm1") }, "", ""},
		{"an HAProxy VM with more vCPUs than a machine may have", func(s *infrav1.LibvirtClusterSpec) { s.LoadBalancer.CPUs = 64 },
			"spec.loadBalancer.cpus", "--max-machine-vcpus"},
		{"an HAProxy VM with more memory than a machine may have", func(s *infrav1.LibvirtClusterSpec) { s.LoadBalancer.MemoryMiB = 200 << 10 },
			"spec.loadBalancer.memoryMiB", "--max-machine-memory"},
		{"an endpoint from a cluster-wide pool the operator did not grant", func(s *infrav1.LibvirtClusterSpec) {
			s.Network = infrav1.ClusterNetwork{Name: "lan"}
			s.LoadBalancer.AddressFromPool = &infrav1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "GlobalInClusterIPPool", Name: "lan"}
		}, "spec.loadBalancer.addressFromPool", "--ipam-pools"},
		{"an endpoint from a namespaced pool, granted by default", func(s *infrav1.LibvirtClusterSpec) {
			s.Network = infrav1.ClusterNetwork{Name: "lan"}
			s.LoadBalancer.AddressFromPool = &infrav1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "lan"}
		}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
			defer cancel()
			lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: fmt.Sprintf("policy-%d", i)}}
			tc.spec(&lc.Spec)
			err := c.Create(ctx, lc)
			if err == nil {
				t.Cleanup(func() { _ = c.Delete(context.Background(), lc) })
			}
			if tc.field == "" {
				if err != nil {
					t.Fatalf("refused: %v", err)
				}
				return
			}
			if err := refusedAt(err, tc.field, tc.detail); err != nil {
				t.Fatal(err)
			}
		})
	}
}

// refusedAt checks that err is an Invalid error whose every cause is at
// field, one of them saying detail.
func refusedAt(err error, field, detail string) error {
	var status *apierrors.StatusError
	if err == nil || !apierrors.IsInvalid(err) || !errors.As(err, &status) || status.ErrStatus.Details == nil {
		return fmt.Errorf("got %v; want Invalid at %s", err, field)
	}
	said := false
	for _, cause := range status.ErrStatus.Details.Causes {
		if cause.Field != field {
			return fmt.Errorf("refused at %s (%s); want only %s", cause.Field, cause.Message, field)
		}
		said = said || strings.Contains(cause.Message, detail)
	}
	if !said {
		return fmt.Errorf("%v does not say %q", err, detail)
	}
	return nil
}
