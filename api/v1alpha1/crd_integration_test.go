package v1alpha1_test

import (
	"context"
	"flag"
	"os"
	"os/exec"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"

	corev1 "k8s.io/api/core/v1"
	apiextensionsv1 "k8s.io/apiextensions-apiserver/pkg/apis/apiextensions/v1"
	"k8s.io/apimachinery/pkg/api/equality"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/contract"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
)

var env *testenv.Environment

func TestMain(m *testing.M) {
	flag.Parse()
	if testing.Short() {
		os.Exit(m.Run())
	}
	var err error
	if env, err = testenv.Start(); err != nil {
		println(err.Error())
		os.Exit(1)
	}
	code := m.Run()
	if err := env.Stop(); err != nil {
		println(err.Error())
	}
	os.Exit(code)
}

func requireEnv(t *testing.T) {
	t.Helper()
	if env == nil {
		t.Skip("integration test: needs envtest (not run with -short)")
	}
}

const namespace = "default"

// TestCRDNamesFollowTheContract checks that Cluster API finds our CRDs: it
// looks them up by contract.CalculateCRDName and reads the contract label.
func TestCRDNamesFollowTheContract(t *testing.T) {
	requireEnv(t)
	for _, kind := range []string{"LibvirtCluster", "LibvirtClusterTemplate", "LibvirtMachine", "LibvirtMachineTemplate"} {
		t.Run(kind, func(t *testing.T) {
			name := contract.CalculateCRDName(infrav1.GroupVersion.Group, kind)
			crd := &apiextensionsv1.CustomResourceDefinition{}
			if err := env.Client.Get(context.Background(), types.NamespacedName{Name: name}, crd); err != nil {
				t.Fatalf("CRD %s: %v", name, err)
			}
			if got := crd.Labels["cluster.x-k8s.io/v1beta2"]; got != infrav1.GroupVersion.Version {
				t.Errorf("CRD %s label cluster.x-k8s.io/v1beta2 = %q, want %q", name, got, infrav1.GroupVersion.Version)
			}
			if crd.Spec.Names.Kind != kind {
				t.Errorf("CRD %s serves kind %q, want %q", name, crd.Spec.Names.Kind, kind)
			}
		})
	}
}

// TestRoundTrip stores objects of every kind, spec and status, and reads
// them back: the whole object must come back equal, so no field is lost to
// a schema mistake (a property missing from the CRD is pruned by the API
// server). Some fields exclude each other (an image is a volume or a URL),
// so each kind has a few variants; together they set every field of the
// Go types, which roundTripCoverage checks by reflection, so a field added
// later cannot be left out of the test.
func TestRoundTrip(t *testing.T) {
	requireEnv(t)
	ctx := context.Background()
	// The API server keeps times to the second.
	now := metav1.NewTime(time.Now().Truncate(time.Second))
	urlImage := infrav1.ImageSource{URL: "https://images.example/debian-12.qcow2", Checksum: validChecksum}
	volumeImage := infrav1.ImageSource{Volume: &infrav1.VolumeReference{Pool: "images", Name: "capl-debian-12.qcow2"}}
	tcg := infrav1.VirtualHardware{CPUs: 2, MemoryMiB: 1024, DomainType: infrav1.DomainTypeQEMU, CPUMode: infrav1.CPUModeMaximum, TCGTranslationCacheMiB: 128, CPUShares: 512}
	kvm := infrav1.VirtualHardware{CPUs: 4, MemoryMiB: 4096, DomainType: infrav1.DomainTypeKVM, CPUMode: infrav1.CPUModeHostModel}
	customCPU := infrav1.VirtualHardware{
		CPUs: 1, MemoryMiB: 1024, DomainType: infrav1.DomainTypeQEMU,
		CPUMode: infrav1.CPUModeCustom, CPUModel: "Nehalem", CPUFeatures: []string{"aes", "pclmuldq"},
	}
	conditions := []metav1.Condition{{
		Type: infrav1.DomainReadyCondition, Status: metav1.ConditionFalse, ObservedGeneration: 1,
		LastTransitionTime: now, Reason: "DomainStarting", Message: "starting the domain",
	}}
	domain := &infrav1.DomainStatus{Name: "capl-default.roundtrip", UUID: "3c2b5f1e-8a7d-4c3b-9e1f-0a1b2c3d4e5f", MAC: "52:54:00:aa:bb:cc", State: "running", Host: "host-a"}

	machineSpecs := []infrav1.LibvirtMachineSpec{
		{ProviderID: infrav1.ProviderIDPrefix + domain.UUID, Image: urlImage, VirtualHardware: tcg, DiskSizeGiB: 20,
			Network: &infrav1.NetworkAttachment{Bridge: "br0"}, FailureDomain: "host-a"},
		{Image: volumeImage, VirtualHardware: kvm, DiskSizeGiB: 40, Network: &infrav1.NetworkAttachment{Name: "default",
			AddressesFromPools: []infrav1.IPPoolReference{{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "lan"}},
			Nameservers:        []string{"192.168.1.1", "fd00::1"}},
			DataDisks:   []infrav1.DataDisk{{Name: "etcd", SizeGiB: 10, Pool: "fast"}, {Name: "longhorn", SizeGiB: 100}},
			HostDevices: []infrav1.HostDevice{{Name: "gpu0"}, {Name: "nic0"}}},
		{Image: volumeImage, VirtualHardware: customCPU},
	}
	clusterSpecs := []infrav1.LibvirtClusterSpec{{
		ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "192.168.150.2", Port: 6443},
		Network:              infrav1.ClusterNetwork{CIDR: "192.168.150.0/24"},
		LoadBalancer:         infrav1.LoadBalancer{Type: infrav1.LoadBalancerHAProxy, Image: &volumeImage, VirtualHardware: tcg},
		StoragePool:          infrav1.StoragePool{Name: "capi-libvirt", Path: "/var/lib/libvirt/capi-libvirt"},
		FailureDomains:       []infrav1.FailureDomainSpec{{Name: "host-a", ControlPlane: ptr.To(true), Attributes: map[string]string{"rack": "r1"}}},
	}, {
		Network: infrav1.ClusterNetwork{Name: "default"},
		LoadBalancer: infrav1.LoadBalancer{Type: infrav1.LoadBalancerHAProxy, Image: &urlImage, VirtualHardware: kvm,
			AddressFromPool: &infrav1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "GlobalInClusterIPPool", Name: "endpoints"}},
	}, {
		Network:      infrav1.ClusterNetwork{Name: "default"},
		LoadBalancer: infrav1.LoadBalancer{Type: infrav1.LoadBalancerHAProxy, Image: &urlImage, VirtualHardware: customCPU},
	}, {
		ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "10.0.0.10", Port: 7443},
		Network:              infrav1.ClusterNetwork{Bridge: "br0"},
		// domainType is the CRD's default, so the object read back has it.
		LoadBalancer: infrav1.LoadBalancer{Type: infrav1.LoadBalancerNone, FailureDomain: "kvm1",
			VirtualHardware: infrav1.VirtualHardware{DomainType: infrav1.DomainTypeKVM}},
		FailureDomains: []infrav1.FailureDomainSpec{
			{Name: "kvm1", ControlPlane: ptr.To(true), URI: "qemu+ssh://root@kvm1/system", CredentialsRef: &infrav1.SecretReference{Name: "kvm-hosts"}},
			{Name: "kvm2", URI: "qemu+tls://kvm2/system"},
		},
	}}
	templateMeta := clusterv1.ObjectMeta{Labels: map[string]string{"role": "worker"}, Annotations: map[string]string{"note": "roundtrip"}}

	var machines, machineTemplates, clusters, clusterTemplates []client.Object
	for i, spec := range machineSpecs {
		m := &infrav1.LibvirtMachine{ObjectMeta: objectMeta("machine", i), Spec: spec, Status: infrav1.LibvirtMachineStatus{
			Conditions:           conditions,
			Initialization:       infrav1.Initialization{Provisioned: ptr.To(true)},
			Ready:                true,
			BootstrapDataRemoved: true,
			Addresses: []clusterv1.MachineAddress{
				{Type: clusterv1.MachineInternalIP, Address: "192.168.150.10"},
				{Type: clusterv1.MachineHostName, Address: "roundtrip"},
			},
			FailureDomain:  "host-a",
			Domain:         domain,
			FailureReason:  ptr.To("CreateError"),
			FailureMessage: ptr.To("the domain could not be defined"),
		}}
		machines = append(machines, m)
		spec.ProviderID, spec.FailureDomain = "", "" // refused in templates
		mt := &infrav1.LibvirtMachineTemplate{ObjectMeta: objectMeta("machinetemplate", i), Status: infrav1.LibvirtMachineTemplateStatus{
			Capacity: corev1.ResourceList{corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("4Gi"),
				corev1.ResourceEphemeralStorage: resource.MustParse("20Gi")},
			NodeInfo: infrav1.NodeInfo{Architecture: infrav1.ArchitectureAmd64, OperatingSystem: "linux"},
		}}
		mt.Spec.Template = infrav1.LibvirtMachineTemplateResource{ObjectMeta: templateMeta, Spec: spec}
		machineTemplates = append(machineTemplates, mt)
	}
	for i, spec := range clusterSpecs {
		c := &infrav1.LibvirtCluster{ObjectMeta: objectMeta("cluster", i), Spec: spec, Status: infrav1.LibvirtClusterStatus{
			Conditions:     conditions,
			Initialization: infrav1.Initialization{Provisioned: ptr.To(true)},
			Ready:          true,
			FailureDomains: []clusterv1.FailureDomain{{Name: "host-a", ControlPlane: ptr.To(true), Attributes: map[string]string{"rack": "r1"}}},
			Network:        &infrav1.NetworkStatus{Name: "capl-default.roundtrip", Bridge: "capl0123456789a", CIDR: "192.168.150.0/24", Managed: true},
			StoragePool:    &infrav1.StoragePoolStatus{Name: "capl-pool", Path: "/var/lib/libvirt/capl-pool"},
			LoadBalancer: &infrav1.LoadBalancerStatus{
				Domain:          domain,
				Address:         "192.168.150.2",
				Backends:        []infrav1.LoadBalancerBackend{{Machine: "cp-0", Address: "192.168.150.10", State: infrav1.BackendDraining}},
				ConfigHash:      "sha256:0123",
				LastReloadTime:  &now,
				NotServingSince: &now,
			},
			FailureReason:  ptr.To("CreateError"),
			FailureMessage: ptr.To("the network could not be created"),
		}}
		clusters = append(clusters, c)
		ct := &infrav1.LibvirtClusterTemplate{ObjectMeta: objectMeta("clustertemplate", i)}
		ct.Spec.Template = infrav1.LibvirtClusterTemplateResource{ObjectMeta: templateMeta, Spec: spec}
		clusterTemplates = append(clusterTemplates, ct)
	}

	for _, kind := range []struct {
		objs    []client.Object
		new     func() client.Object
		exempt  []string
		hasStat bool
	}{
		{machines, func() client.Object { return &infrav1.LibvirtMachine{} }, nil, true},
		{clusters, func() client.Object { return &infrav1.LibvirtCluster{} }, nil, true},
		{machineTemplates, func() client.Object { return &infrav1.LibvirtMachineTemplate{} },
			[]string{"spec.template.spec.providerID", "spec.template.spec.failureDomain"}, true},
		{clusterTemplates, func() client.Object { return &infrav1.LibvirtClusterTemplate{} }, nil, false},
	} {
		if missing := roundTripCoverage(kind.objs, kind.exempt); len(missing) > 0 {
			t.Errorf("%T: no variant sets %v: the round trip would not notice if the CRD lost them", kind.objs[0], missing)
		}
		for _, want := range kind.objs {
			got := kind.new()
			roundTrip(ctx, t, want, got, kind.hasStat)
			normalize(want)
			normalize(got)
			if !equality.Semantic.DeepEqual(want, got) {
				t.Errorf("%T %s did not round-trip (-sent +read back):\n%s", want, want.GetName(), cmp.Diff(want, got))
			}
		}
	}
}

// TestInvalidObjectsAreRejected sends bad input straight to the API server
// and checks each is refused with the offending field or rule named.
func TestInvalidObjectsAreRejected(t *testing.T) {
	requireEnv(t)
	machine := func(mutate func(*infrav1.LibvirtMachine)) client.Object {
		m := validMachine("invalid")
		mutate(m)
		return m
	}
	cluster := func(mutate func(*infrav1.LibvirtCluster)) client.Object {
		c := validCluster("invalid")
		mutate(c)
		return c
	}
	tests := []struct {
		name string
		obj  client.Object
		want string // a fragment of the API server's message naming the field or rule
	}{
		{"zero CPUs", machine(func(m *infrav1.LibvirtMachine) { m.Spec.CPUs = -1 }), "spec.cpus"},
		{"too little memory", machine(func(m *infrav1.LibvirtMachine) { m.Spec.MemoryMiB = 64 }), "spec.memoryMiB"},
		{"negative disk", machine(func(m *infrav1.LibvirtMachine) { m.Spec.DiskSizeGiB = -5 }), "spec.diskSizeGiB"},
		{"md5 checksum", machine(func(m *infrav1.LibvirtMachine) { m.Spec.Image.Checksum = "md5:d41d8cd98f00b204e9800998ecf8427e" }), "spec.image.checksum"},
		{"short sha256", machine(func(m *infrav1.LibvirtMachine) { m.Spec.Image.Checksum = "sha256:abc" }), "spec.image.checksum"},
		{"ftp url", machine(func(m *infrav1.LibvirtMachine) { m.Spec.Image.URL = "ftp://images.example/x.qcow2" }), "spec.image.url"},
		{"url without checksum", machine(func(m *infrav1.LibvirtMachine) { m.Spec.Image.Checksum = "" }), "checksum is required when url is set"},
		{"volume and url", machine(func(m *infrav1.LibvirtMachine) { m.Spec.Image.Volume = &infrav1.VolumeReference{Name: "base"} }), "exactly one of volume and url"},
		{"no image", machine(func(m *infrav1.LibvirtMachine) { m.Spec.Image = infrav1.ImageSource{} }), "exactly one of volume and url"},
		{"volume name with slash", machine(func(m *infrav1.LibvirtMachine) {
			m.Spec.Image = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "../etc/passwd"}}
		}), "spec.image.volume.name"},
		{"unknown domain type", machine(func(m *infrav1.LibvirtMachine) { m.Spec.DomainType = "xen" }), "spec.domainType"},
		{"unknown cpu mode", machine(func(m *infrav1.LibvirtMachine) { m.Spec.CPUMode = "host" }), "spec.cpuMode"},
		{"custom cpu without model", machine(func(m *infrav1.LibvirtMachine) { m.Spec.CPUMode = infrav1.CPUModeCustom }), "cpuModel is set exactly when cpuMode is custom"},
		{"cpu model without custom", machine(func(m *infrav1.LibvirtMachine) { m.Spec.CPUModel = "Nehalem" }), "cpuModel is set exactly when cpuMode is custom"},
		{"cpu features without custom", machine(func(m *infrav1.LibvirtMachine) { m.Spec.CPUFeatures = []string{"aes"} }), "cpuFeatures apply only to cpuMode custom"},
		{"cpu model with a space", machine(func(m *infrav1.LibvirtMachine) {
			m.Spec.CPUMode, m.Spec.CPUModel = infrav1.CPUModeCustom, "Nehalem IBRS"
		}), "spec.cpuModel"},
		{"load balancer cpu model without custom", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.LoadBalancer.CPUModel = "qemu64" }), "cpuModel is set exactly when cpuMode is custom"},
		{"host-passthrough under TCG", machine(func(m *infrav1.LibvirtMachine) { m.Spec.CPUMode = infrav1.CPUModeHostPassthrough }), "host-passthrough needs domainType kvm"},
		{"tiny TCG cache", machine(func(m *infrav1.LibvirtMachine) { m.Spec.TCGTranslationCacheMiB = 1 }), "spec.tcgTranslationCacheMiB"},
		{"cpu shares of 1", machine(func(m *infrav1.LibvirtMachine) { m.Spec.CPUShares = 1 }), "cpuShares must be 0 (the host's default) or 2-10000"},
		{"cpu shares over 10000", machine(func(m *infrav1.LibvirtMachine) { m.Spec.CPUShares = 10001 }), "spec.cpuShares"},
		{"foreign providerID", machine(func(m *infrav1.LibvirtMachine) { m.Spec.ProviderID = "aws:///i-0123" }), "spec.providerID"},
		{"network name and bridge", machine(func(m *infrav1.LibvirtMachine) { m.Spec.Network.Name = "default" }), "at most one of name and bridge"},
		{"bridge name too long", machine(func(m *infrav1.LibvirtMachine) { m.Spec.Network.Bridge = "bridge-name-over-15" }), "spec.network.bridge"},
		{"cidr not a cidr", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.Network.CIDR = "192.168.150.0" }), "cidr must be an IPv4 CIDR"},
		{"cidr IPv6", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.Network.CIDR = "fd00::/64" }), "cidr must be an IPv4 CIDR"},
		{"cidr too small", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.Network.CIDR = "192.168.150.0/30" }), "between /16 and /28"},
		{"cidr host bits", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.Network.CIDR = "192.168.150.1/24" }), "no host bits set"},
		{"network name and cidr", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.Network.Name = "default" }), "at most one of name, bridge and cidr"},
		{"unknown load balancer", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.LoadBalancer.Type = "Nginx" }), "spec.loadBalancer.type"},
		{"credentials without a uri", cluster(func(c *infrav1.LibvirtCluster) {
			c.Spec.FailureDomains[0].CredentialsRef = &infrav1.SecretReference{Name: "kvm-hosts"}
		}), "credentialsRef needs a uri"},
		{"image without HAProxy", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.LoadBalancer.Type = infrav1.LoadBalancerNone }), "loadBalancer.image applies only to type HAProxy"},
		{"load balancer with no memory", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.LoadBalancer.MemoryMiB = 16 }), "spec.loadBalancer.memoryMiB"},
		{"endpoint port out of range", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.ControlPlaneEndpoint.Port = 70000 }), "spec.controlPlaneEndpoint.port"},
		{"relative pool path", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.StoragePool.Path = "var/lib/pool" }), "spec.storagePool.path"},
		{"failure domain name", cluster(func(c *infrav1.LibvirtCluster) { c.Spec.FailureDomains[0].Name = "Host_A" }), "spec.failureDomains[0].name"},
		{"duplicate failure domains", cluster(func(c *infrav1.LibvirtCluster) {
			c.Spec.FailureDomains = append(c.Spec.FailureDomains, c.Spec.FailureDomains[0])
		}), "spec.failureDomains[1]"},
		{"providerID in a template", &infrav1.LibvirtMachineTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "invalid", Namespace: namespace},
			Spec: infrav1.LibvirtMachineTemplateSpec{Template: infrav1.LibvirtMachineTemplateResource{Spec: func() infrav1.LibvirtMachineSpec {
				s := validMachine("x").Spec
				s.ProviderID = "libvirt:///3c2b5f1e-8a7d-4c3b-9e1f-0a1b2c3d4e5f"
				return s
			}()}},
		}, "providerID must not be set in a template"},
		{"bad cidr in a cluster template", &infrav1.LibvirtClusterTemplate{
			ObjectMeta: metav1.ObjectMeta{Name: "invalid", Namespace: namespace},
			Spec: infrav1.LibvirtClusterTemplateSpec{Template: infrav1.LibvirtClusterTemplateResource{Spec: infrav1.LibvirtClusterSpec{
				Network: infrav1.ClusterNetwork{CIDR: "10.0.0.0/8"},
			}}},
		}, "spec.template.spec.network.cidr"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := env.Client.Create(context.Background(), tt.obj)
			if err == nil {
				_ = env.Client.Delete(context.Background(), tt.obj)
				t.Fatalf("the API server accepted an invalid object")
			}
			if !apierrors.IsInvalid(err) {
				t.Fatalf("want an Invalid error, got %v", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error does not name %q:\n%v", tt.want, err)
			}
		})
	}
}

// TestProviderIDIsImmutable checks that a set providerID cannot change:
// Cluster API matches Nodes by it.
func TestProviderIDIsImmutable(t *testing.T) {
	requireEnv(t)
	ctx := context.Background()
	m := validMachine("immutable")
	m.Spec.ProviderID = "libvirt:///3c2b5f1e-8a7d-4c3b-9e1f-0a1b2c3d4e5f"
	if err := env.Client.Create(ctx, m); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = env.Client.Delete(context.Background(), m) })
	m.Spec.ProviderID = "libvirt:///00000000-0000-4000-8000-000000000000"
	err := env.Client.Update(ctx, m)
	if err == nil || !strings.Contains(err.Error(), "providerID is immutable") {
		t.Fatalf("changing providerID: want immutability error, got %v", err)
	}
}

// TestKubectlApplyRefusesInvalidMachine does what a user does: kubectl apply
// of a bad manifest, against the real API server.
func TestKubectlApplyRefusesInvalidMachine(t *testing.T) {
	requireEnv(t)
	tests := []struct {
		name, spec, want string
	}{
		{"zero CPUs", "cpus: 0\n  image: {volume: {name: base.qcow2}}", "spec.cpus"},
		{"bad checksum", "image: {url: https://images.example/x.qcow2, checksum: 'sha256:nothex'}", "spec.image.checksum"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			manifest := "apiVersion: infrastructure.cluster.x-k8s.io/v1alpha1\nkind: LibvirtMachine\nmetadata:\n  name: kubectl-invalid\n  namespace: default\nspec:\n  " + tt.spec + "\n"
			cmd := exec.Command(testenv.KubectlPath(), "--kubeconfig", env.Kubeconfig, "apply", "-f", "-")
			cmd.Stdin = strings.NewReader(manifest)
			out, err := cmd.CombinedOutput()
			if err == nil {
				t.Fatalf("kubectl apply accepted the manifest:\n%s", out)
			}
			if !strings.Contains(string(out), tt.want) || !strings.Contains(string(out), "Invalid value") {
				t.Errorf("kubectl output does not name %q:\n%s", tt.want, out)
			}
		})
	}
}

// TestRoundTripCoverage checks the check: a field no object sets is
// reported, with its JSON path, and one that some object sets is not.
func TestRoundTripCoverage(t *testing.T) {
	objs := []client.Object{
		&infrav1.LibvirtMachine{Spec: infrav1.LibvirtMachineSpec{Image: infrav1.ImageSource{URL: "https://x"}}},
		&infrav1.LibvirtMachine{Spec: infrav1.LibvirtMachineSpec{VirtualHardware: infrav1.VirtualHardware{CPUs: 1}}},
	}
	missing := roundTripCoverage(objs, []string{"spec.providerID"})
	for _, want := range []string{"spec.image.checksum", "spec.image.volume.name", "spec.memoryMiB", "status.conditions[].lastTransitionTime", "status.domain.uuid"} {
		if !slices.Contains(missing, want) {
			t.Errorf("missing %v lacks %s", missing, want)
		}
	}
	for _, set := range []string{"spec.image.url", "spec.cpus", "spec.providerID"} {
		if slices.Contains(missing, set) {
			t.Errorf("missing %v has %s, which is set or exempt", missing, set)
		}
	}
}
