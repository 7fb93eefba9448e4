package references_test

import (
	"context"
	"net/netip"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/references"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

var (
	policy = tenancy.Policy{PoolDirs: []string{"/var/lib/libvirt"}, ImagePools: []string{"images"},
		Machine:      tenancy.Limits{VCPUs: 8, MemoryMiB: 16 << 10, DiskGiB: 100},
		NetworkCIDRs: []netip.Prefix{netip.MustParsePrefix("10.0.0.0/8"), netip.MustParsePrefix("192.168.0.0/16")}}
	networkA = naming.ClusterNetworkName("team-a", "prod")
	seedA    = naming.SeedVolumeName(naming.DomainName("team-a", "cp-0"))
)

// want is the condition a refused reference sets; zero when accepted.
type want struct{ condition, reason string }

// run runs the check as its plan step does: each refusal sets the
// condition it names on s.
func run(s services.Reporter, check services.Service) error {
	return services.Plan{{Service: check}}.Run(context.Background(), s, false)
}

func checkOutcome(t *testing.T, obj conditions.Getter, err error, w want) {
	t.Helper()
	if w.condition == "" {
		if err != nil {
			t.Fatalf("refused: %v (%+v)", err, obj.GetConditions())
		}
		return
	}
	if rq, ok := services.AsRequeue(err); !ok || rq.After != 0 {
		t.Fatalf("error %v, want a wait for a change", err)
	}
	c := conditions.Get(obj, w.condition)
	if c == nil || c.Status != metav1.ConditionFalse || c.Reason != w.reason || c.Message == "" {
		t.Fatalf("%s = %+v, want False/%s with a message", w.condition, c, w.reason)
	}
	t.Logf("%s: %s", c.Reason, c.Message)
}

func TestMachine(t *testing.T) {
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*infrav1.LibvirtCluster, *infrav1.LibvirtMachine)
		want   want
	}{
		{"own network, imported image", nil, want{}},
		{"another namespace's seed", func(_ *infrav1.LibvirtCluster, m *infrav1.LibvirtMachine) {
			m.Spec.Image = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Pool: "images", Name: seedA}}
		}, want{infrav1.DiskReadyCondition, infrav1.ImageNotAllowedReason}},
		{"a volume of the cluster's pool, no image pool", func(_ *infrav1.LibvirtCluster, m *infrav1.LibvirtMachine) {
			m.Spec.Image = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "ubuntu.qcow2"}}
		}, want{infrav1.DiskReadyCondition, infrav1.ImageNotAllowedReason}},
		{"the cluster's pool in /etc", func(c *infrav1.LibvirtCluster, _ *infrav1.LibvirtMachine) {
			c.Spec.StoragePool.Path = "/etc/pool"
		}, want{infrav1.DiskReadyCondition, infrav1.StoragePoolNotAllowedReason}},
		{"a cluster-wide IPAM pool not granted", func(_ *infrav1.LibvirtCluster, m *infrav1.LibvirtMachine) {
			m.Spec.Network = &infrav1.NetworkAttachment{Bridge: "br0", AddressesFromPools: []infrav1.IPPoolReference{{APIGroup: "ipam.cluster.x-k8s.io", Kind: "GlobalInClusterIPPool", Name: "lan"}}}
		}, want{infrav1.AddressReservedCondition, infrav1.IPPoolNotAllowedReason}},
		{"the namespace's own IPAM pool", func(_ *infrav1.LibvirtCluster, m *infrav1.LibvirtMachine) {
			m.Spec.Network = &infrav1.NetworkAttachment{Bridge: "br0", AddressesFromPools: []infrav1.IPPoolReference{{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "lan"}}}
		}, want{}},
		{"another namespace's network in the cluster's status", func(c *infrav1.LibvirtCluster, _ *infrav1.LibvirtMachine) {
			c.Status.Network.Name = networkA
		}, want{infrav1.AddressReservedCondition, infrav1.NetworkNotAllowedReason}},
		{"more vCPUs than one machine may have", func(_ *infrav1.LibvirtCluster, m *infrav1.LibvirtMachine) {
			m.Spec.CPUs = 512
		}, want{infrav1.DomainReadyCondition, infrav1.MachineSizeNotAllowedReason}},
		{"more memory than one machine may have", func(_ *infrav1.LibvirtCluster, m *infrav1.LibvirtMachine) {
			m.Spec.MemoryMiB = 1 << 20
		}, want{infrav1.DomainReadyCondition, infrav1.MachineSizeNotAllowedReason}},
		{"forged network annotation", func(_ *infrav1.LibvirtCluster, m *infrav1.LibvirtMachine) {
			m.Annotations = map[string]string{scope.NetworkAnnotation: "bridge:" + netalloc.BridgeName(networkA)}
		}, want{infrav1.AddressReservedCondition, infrav1.NetworkNotAllowedReason}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "prod"}}
			lc.Spec.StoragePool = infrav1.StoragePool{Name: "team-b", Path: "/var/lib/libvirt/team-b"}
			lc.Status.Network = &infrav1.NetworkStatus{Name: naming.ClusterNetworkName("team-b", "prod")}
			lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "cp-0"}}
			lm.Spec.Image = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: naming.ImageVolumeName("ab12ab12ab12ab12ab12ab12ab12ab12")}}
			if tc.mutate != nil {
				tc.mutate(lc, lm)
			}
			s, err := scope.NewMachineScope(scope.MachineScopeParams{
				Client: fake.NewClientBuilder().WithScheme(scheme).Build(), LibvirtCluster: lc, LibvirtMachine: lm, Host: fakehost.New(),
			})
			if err != nil {
				t.Fatal(err)
			}
			checkOutcome(t, lm, run(s, references.NewMachine(s, s.VM, policy, nil)), tc.want)
		})
	}
}

func TestCluster(t *testing.T) {
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		mutate func(*infrav1.LibvirtCluster)
		want   want
	}{
		{"defaults", nil, want{}},
		{"pool at /", func(c *infrav1.LibvirtCluster) { c.Spec.StoragePool = infrav1.StoragePool{Name: "root", Path: "/"} },
			want{infrav1.StoragePoolReadyCondition, infrav1.StoragePoolNotAllowedReason}},
		{"pool outside the pool directories", func(c *infrav1.LibvirtCluster) { c.Spec.StoragePool = infrav1.StoragePool{Name: "x", Path: "/srv/x"} },
			want{infrav1.StoragePoolReadyCondition, infrav1.StoragePoolNotAllowedReason}},
		{"recorded pool not listed", func(c *infrav1.LibvirtCluster) {
			c.Annotations = map[string]string{scope.PoolAnnotation: "default"}
		}, want{}}, // no --storage-pools: any existing pool
		{"another namespace's network", func(c *infrav1.LibvirtCluster) { c.Spec.Network.Name = networkA },
			want{infrav1.NetworkReadyCondition, infrav1.NetworkNotAllowedReason}},
		{"a provider network's bridge", func(c *infrav1.LibvirtCluster) {
			c.Spec.Network.Bridge, c.Spec.LoadBalancer.Type = netalloc.BridgeName(networkA), infrav1.LoadBalancerNone
		}, want{infrav1.NetworkReadyCondition, infrav1.NetworkNotAllowedReason}},
		{"HAProxy image on another namespace's seed", func(c *infrav1.LibvirtCluster) {
			c.Spec.LoadBalancer.Image = &infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: seedA}}
		}, want{infrav1.LoadBalancerReadyCondition, infrav1.ImageNotAllowedReason}},
		{"a private network range", func(c *infrav1.LibvirtCluster) { c.Spec.Network.CIDR = "192.168.150.0/24" }, want{}},
		{"a public network range", func(c *infrav1.LibvirtCluster) { c.Spec.Network.CIDR = "8.8.8.0/24" },
			want{infrav1.NetworkReadyCondition, infrav1.NetworkNotAllowedReason}},
		{"a range outside the operator's", func(c *infrav1.LibvirtCluster) { c.Spec.Network.CIDR = "172.16.0.0/24" },
			want{infrav1.NetworkReadyCondition, infrav1.NetworkNotAllowedReason}},
		{"default HAProxy image", func(c *infrav1.LibvirtCluster) {
			c.Spec.StoragePool = infrav1.StoragePool{Name: "team-b", Path: "/var/lib/libvirt/team-b"}
		},
			want{}},
		{"HAProxy VM with more vCPUs than a machine may have", func(c *infrav1.LibvirtCluster) { c.Spec.LoadBalancer.CPUs = 64 },
			want{infrav1.LoadBalancerReadyCondition, infrav1.MachineSizeNotAllowedReason}},
		{"HAProxy VM with more memory than a machine may have", func(c *infrav1.LibvirtCluster) { c.Spec.LoadBalancer.MemoryMiB = 200 << 10 },
			want{infrav1.LoadBalancerReadyCondition, infrav1.MachineSizeNotAllowedReason}},
		{"large VM but no HAProxy", func(c *infrav1.LibvirtCluster) {
			c.Spec.LoadBalancer.Type, c.Spec.LoadBalancer.CPUs = infrav1.LoadBalancerNone, 64
		}, want{}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "prod"}}
			if tc.mutate != nil {
				tc.mutate(lc)
			}
			s, err := scope.NewClusterScope(scope.ClusterScopeParams{
				Client: fake.NewClientBuilder().WithScheme(scheme).Build(), LibvirtCluster: lc, Host: fakehost.New(),
			})
			if err != nil {
				t.Fatal(err)
			}
			checkOutcome(t, lc, run(s, references.NewCluster(s, policy, nil)), tc.want)
		})
	}
	strict := policy
	strict.Pools = []string{"capi-libvirt"}
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "prod",
		Annotations: map[string]string{scope.PoolAnnotation: "default"}}}
	s, err := scope.NewClusterScope(scope.ClusterScopeParams{Client: fake.NewClientBuilder().WithScheme(scheme).Build(), LibvirtCluster: lc, Host: fakehost.New()})
	if err != nil {
		t.Fatal(err)
	}
	checkOutcome(t, lc, run(s, references.NewCluster(s, strict, nil)),
		want{infrav1.StoragePoolReadyCondition, infrav1.StoragePoolNotAllowedReason})
}

// TestEveryRefusalReported: a machine and a cluster refused for several
// reasons report each on the condition of the step it stops, and the
// refusals on one condition share its message, the first one's reason.
func TestEveryRefusalReported(t *testing.T) {
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	type says struct {
		condition, reason string
		fragments         []string
	}
	check := func(t *testing.T, obj conditions.Getter, err error, want []says) {
		t.Helper()
		if rq, ok := services.AsRequeue(err); !ok || rq.After != 0 {
			t.Fatalf("error %v, want a wait for a change", err)
		}
		for _, w := range want {
			c := conditions.Get(obj, w.condition)
			if c == nil || c.Status != metav1.ConditionFalse || c.Reason != w.reason {
				t.Errorf("%s = %+v, want False/%s", w.condition, c, w.reason)
				continue
			}
			for _, f := range w.fragments {
				if !strings.Contains(c.Message, f) {
					t.Errorf("%s says %q, want it to say %q", w.condition, c.Message, f)
				}
			}
			t.Logf("%s %s: %s", w.condition, c.Reason, c.Message)
		}
	}
	t.Run("machine", func(t *testing.T) {
		lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "prod"}}
		lc.Spec.StoragePool = infrav1.StoragePool{Name: "team-b", Path: "/var/lib/libvirt/team-b"}
		lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "cp-0"}}
		lm.Spec.Image = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Pool: "images", Name: seedA}}
		lm.Spec.CPUs, lm.Spec.MemoryMiB = 512, 1<<20
		lm.Spec.Network = &infrav1.NetworkAttachment{Bridge: netalloc.BridgeName(networkA)}
		s, err := scope.NewMachineScope(scope.MachineScopeParams{
			Client: fake.NewClientBuilder().WithScheme(scheme).Build(), LibvirtCluster: lc, LibvirtMachine: lm, Host: fakehost.New(),
		})
		if err != nil {
			t.Fatal(err)
		}
		check(t, lm, run(s, references.NewMachine(s, s.VM, policy, nil)), []says{
			{infrav1.DiskReadyCondition, infrav1.ImageNotAllowedReason, []string{"spec.image.volume.name"}},
			{infrav1.AddressReservedCondition, infrav1.NetworkNotAllowedReason, []string{"Host bridge"}},
			{infrav1.DomainReadyCondition, infrav1.MachineSizeNotAllowedReason, []string{"cpus 512 vCPUs", "; memoryMiB 1048576 MiB"}},
		})
	})
	t.Run("cluster", func(t *testing.T) {
		lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "team-b", Name: "prod"}}
		lc.Spec.StoragePool = infrav1.StoragePool{Name: "x", Path: "/srv/x"}
		lc.Spec.Network.CIDR = "8.8.8.0/24"
		lc.Spec.LoadBalancer.CPUs, lc.Spec.LoadBalancer.MemoryMiB = 64, 200<<10
		lc.Spec.LoadBalancer.Image = &infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: seedA}}
		s, err := scope.NewClusterScope(scope.ClusterScopeParams{
			Client: fake.NewClientBuilder().WithScheme(scheme).Build(), LibvirtCluster: lc, Host: fakehost.New(),
		})
		if err != nil {
			t.Fatal(err)
		}
		check(t, lc, run(s, references.NewCluster(s, policy, nil)), []says{
			{infrav1.StoragePoolReadyCondition, infrav1.StoragePoolNotAllowedReason, []string{`spec.storagePool.path "/srv/x"`}},
			{infrav1.NetworkReadyCondition, infrav1.NetworkNotAllowedReason, []string{`spec.network.cidr "8.8.8.0/24"`}},
			{infrav1.LoadBalancerReadyCondition, infrav1.ImageNotAllowedReason,
				[]string{"spec.loadBalancer.image.volume.name", "; HAProxy VM: cpus 64 vCPUs", "; memoryMiB 204800 MiB"}},
		})
	})
}
