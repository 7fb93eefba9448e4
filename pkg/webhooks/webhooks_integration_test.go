package webhooks_test

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const namespace = "default"

func ctx(t *testing.T) context.Context {
	c, cancel := context.WithTimeout(context.Background(), time.Minute)
	t.Cleanup(cancel)
	return c
}

func meta(name string) metav1.ObjectMeta { return metav1.ObjectMeta{Name: name, Namespace: namespace} }

var volumeImage = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "capl-debian-12.qcow2"}}

// create stores obj and removes it when t ends.
func create(t *testing.T, obj client.Object) error {
	t.Helper()
	err := c.Create(ctx(t), obj)
	if err == nil {
		t.Cleanup(func() { _ = c.Delete(context.Background(), obj) })
	}
	return err
}

func TestDefaults(t *testing.T) {
	requireEnv(t)
	haproxyDefaults := infrav1.LoadBalancer{
		Type: infrav1.LoadBalancerHAProxy,
		VirtualHardware: infrav1.VirtualHardware{
			CPUs: 1, MemoryMiB: 512, DomainType: infrav1.DomainTypeKVM, CPUMode: infrav1.CPUModeHostPassthrough,
		},
	}
	defaultPool := infrav1.StoragePool{Name: "capi-libvirt", Path: "/var/lib/libvirt/capi-libvirt"}
	machineDefaults := func(img infrav1.ImageSource) infrav1.LibvirtMachineSpec {
		return infrav1.LibvirtMachineSpec{
			Image: img,
			VirtualHardware: infrav1.VirtualHardware{
				CPUs: 2, MemoryMiB: 2048, DomainType: infrav1.DomainTypeKVM, CPUMode: infrav1.CPUModeHostPassthrough,
			},
			DiskSizeGiB: 20,
		}
	}
	clusterCases := []struct {
		name string
		in   infrav1.LibvirtClusterSpec
		want infrav1.LibvirtClusterSpec
	}{{
		name: "empty spec: HAProxy on 6443 with 1 vCPU and 512 MiB under KVM, default pool",
		want: infrav1.LibvirtClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Port: 6443},
			LoadBalancer:         haproxyDefaults,
			StoragePool:          defaultPool,
		},
	}, {
		name: "qemu load balancer gets cpuMode maximum",
		in:   infrav1.LibvirtClusterSpec{LoadBalancer: infrav1.LoadBalancer{VirtualHardware: infrav1.VirtualHardware{DomainType: infrav1.DomainTypeQEMU}}},
		want: infrav1.LibvirtClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Port: 6443},
			LoadBalancer: infrav1.LoadBalancer{Type: infrav1.LoadBalancerHAProxy, VirtualHardware: infrav1.VirtualHardware{
				CPUs: 1, MemoryMiB: 512, DomainType: infrav1.DomainTypeQEMU, CPUMode: infrav1.CPUModeMaximum,
			}},
			StoragePool: defaultPool,
		},
	}, {
		name: "type None: the user's host gets port 6443, no load-balancer hardware",
		in: infrav1.LibvirtClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "192.168.150.10"},
			LoadBalancer:         infrav1.LoadBalancer{Type: infrav1.LoadBalancerNone},
		},
		want: infrav1.LibvirtClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "192.168.150.10", Port: 6443},
			// domainType comes from the CRD's own default.
			LoadBalancer: infrav1.LoadBalancer{Type: infrav1.LoadBalancerNone, VirtualHardware: infrav1.VirtualHardware{DomainType: infrav1.DomainTypeKVM}},
			StoragePool:  defaultPool,
		},
	}, {
		name: "a named pool gets no path: it must exist",
		in:   infrav1.LibvirtClusterSpec{StoragePool: infrav1.StoragePool{Name: "fast"}},
		want: infrav1.LibvirtClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Port: 6443},
			LoadBalancer:         haproxyDefaults,
			StoragePool:          infrav1.StoragePool{Name: "fast"},
		},
	}, {
		name: "a path alone keeps the default name",
		in:   infrav1.LibvirtClusterSpec{StoragePool: infrav1.StoragePool{Path: "/srv/capl"}},
		want: infrav1.LibvirtClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Port: 6443},
			LoadBalancer:         haproxyDefaults,
			StoragePool:          infrav1.StoragePool{Name: "capi-libvirt", Path: "/srv/capl"},
		},
	}, {
		name: "explicit values stay",
		in: infrav1.LibvirtClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Port: 7443},
			LoadBalancer: infrav1.LoadBalancer{VirtualHardware: infrav1.VirtualHardware{
				CPUs: 2, MemoryMiB: 1024, DomainType: infrav1.DomainTypeKVM, CPUMode: infrav1.CPUModeHostModel,
			}},
			StoragePool: infrav1.StoragePool{Name: "fast", Path: "/srv/fast"},
		},
		want: infrav1.LibvirtClusterSpec{
			ControlPlaneEndpoint: clusterv1.APIEndpoint{Port: 7443},
			LoadBalancer: infrav1.LoadBalancer{Type: infrav1.LoadBalancerHAProxy, VirtualHardware: infrav1.VirtualHardware{
				CPUs: 2, MemoryMiB: 1024, DomainType: infrav1.DomainTypeKVM, CPUMode: infrav1.CPUModeHostModel,
			}},
			StoragePool: infrav1.StoragePool{Name: "fast", Path: "/srv/fast"},
		},
	}}
	for i, tc := range clusterCases {
		t.Run("LibvirtCluster/"+tc.name, func(t *testing.T) {
			lc := &infrav1.LibvirtCluster{ObjectMeta: meta(name("defaults-cluster", i)), Spec: tc.in}
			if err := create(t, lc); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, lc.Spec); d != "" {
				t.Errorf("spec after create (-want +got):\n%s", d)
			}
		})
		t.Run("LibvirtClusterTemplate/"+tc.name, func(t *testing.T) {
			in := tc.in
			in.ControlPlaneEndpoint.Host = "" // templates name no host
			want := tc.want
			want.ControlPlaneEndpoint.Host = ""
			if want.LoadBalancer.Type == infrav1.LoadBalancerNone {
				want.ControlPlaneEndpoint.Port = 0
			}
			lt := &infrav1.LibvirtClusterTemplate{ObjectMeta: meta(name("defaults-clustertemplate", i))}
			lt.Spec.Template.Spec = in
			if err := create(t, lt); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(want, lt.Spec.Template.Spec); d != "" {
				t.Errorf("spec.template.spec after create (-want +got):\n%s", d)
			}
		})
	}

	urlImage := infrav1.ImageSource{URL: "https://images.example/debian.qcow2", Checksum: "sha256:" + strings.Repeat("ab", 32)}
	qemu := machineDefaults(volumeImage)
	qemu.DomainType, qemu.CPUMode = infrav1.DomainTypeQEMU, infrav1.CPUModeMaximum
	explicit := infrav1.LibvirtMachineSpec{
		Image: urlImage,
		VirtualHardware: infrav1.VirtualHardware{
			CPUs: 4, MemoryMiB: 8192, DomainType: infrav1.DomainTypeQEMU, CPUMode: infrav1.CPUModeHostModel, TCGTranslationCacheMiB: 64,
		},
		DiskSizeGiB: 40,
		Network:     &infrav1.NetworkAttachment{Bridge: "br0"},
	}
	machineCases := []struct {
		name     string
		in, want infrav1.LibvirtMachineSpec
	}{
		{"volume image only: 2 vCPUs, 2048 MiB, 20 GiB under KVM", infrav1.LibvirtMachineSpec{Image: volumeImage}, machineDefaults(volumeImage)},
		{"url image only", infrav1.LibvirtMachineSpec{Image: urlImage}, machineDefaults(urlImage)},
		{"qemu gets cpuMode maximum", infrav1.LibvirtMachineSpec{Image: volumeImage, VirtualHardware: infrav1.VirtualHardware{DomainType: infrav1.DomainTypeQEMU}}, qemu},
		{"explicit values stay", explicit, explicit},
	}
	for i, tc := range machineCases {
		t.Run("LibvirtMachine/"+tc.name, func(t *testing.T) {
			m := &infrav1.LibvirtMachine{ObjectMeta: meta(name("defaults-machine", i)), Spec: tc.in}
			if err := create(t, m); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, m.Spec); d != "" {
				t.Errorf("spec after create (-want +got):\n%s", d)
			}
		})
		t.Run("LibvirtMachineTemplate/"+tc.name, func(t *testing.T) {
			mt := &infrav1.LibvirtMachineTemplate{ObjectMeta: meta(name("defaults-machinetemplate", i))}
			mt.Spec.Template.Spec = tc.in
			if err := create(t, mt); err != nil {
				t.Fatal(err)
			}
			if d := cmp.Diff(tc.want, mt.Spec.Template.Spec); d != "" {
				t.Errorf("spec.template.spec after create (-want +got):\n%s", d)
			}
		})
	}
}

// TestTemplateDryRun checks the contract's SSA dry-run rule: the topology
// controller's server-side-apply dry-run with its annotation may change
// a template's spec (nothing is stored); the same apply without dry-run or
// without the annotation is refused.
func TestTemplateDryRun(t *testing.T) {
	requireEnv(t)
	mt := machineTemplate(func(*infrav1.LibvirtMachineSpec) {})().(*infrav1.LibvirtMachineTemplate)
	mt.ObjectMeta = meta("dryrun-machinetemplate")
	lt := clusterTemplate(func(*infrav1.LibvirtClusterSpec) {})().(*infrav1.LibvirtClusterTemplate)
	lt.ObjectMeta = meta("dryrun-clustertemplate")
	cases := []struct {
		kind   string
		obj    client.Object
		change func(u *unstructured.Unstructured)
	}{
		{"LibvirtMachineTemplate", mt, func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, int64(8), "spec", "template", "spec", "cpus")
		}},
		{"LibvirtClusterTemplate", lt, func(u *unstructured.Unstructured) {
			_ = unstructured.SetNestedField(u.Object, "other", "spec", "template", "spec", "storagePool", "name")
		}},
	}
	for _, tc := range cases {
		t.Run(tc.kind, func(t *testing.T) {
			if err := create(t, tc.obj); err != nil {
				t.Fatal(err)
			}
			stored := tc.obj.DeepCopyObject().(client.Object)
			apply := func(annotate bool, opts ...client.ApplyOption) error {
				raw, err := runtime.DefaultUnstructuredConverter.ToUnstructured(tc.obj)
				if err != nil {
					t.Fatal(err)
				}
				u := &unstructured.Unstructured{Object: raw}
				u.SetGroupVersionKind(infrav1.GroupVersion.WithKind(tc.kind))
				u.SetManagedFields(nil)
				u.SetResourceVersion("")
				u.SetCreationTimestamp(metav1.Time{})
				unstructured.RemoveNestedField(u.Object, "metadata", "uid")
				unstructured.RemoveNestedField(u.Object, "metadata", "generation")
				if annotate {
					u.SetAnnotations(map[string]string{clusterv1.TopologyDryRunAnnotation: ""})
				}
				tc.change(u)
				opts = append(opts, client.FieldOwner("capi-topology"), client.ForceOwnership)
				return c.Apply(ctx(t), client.ApplyConfigurationFromUnstructured(u), opts...)
			}
			if err := apply(true, client.DryRunAll); err != nil {
				t.Fatalf("topology dry-run apply refused: %v", err)
			}
			if err := apply(false, client.DryRunAll); err == nil || !strings.Contains(err.Error(), "spec.template.spec") {
				t.Fatalf("dry-run apply without the annotation: got %v, want a refusal naming spec.template.spec", err)
			}
			if err := apply(true); err == nil || !strings.Contains(err.Error(), "spec.template.spec") {
				t.Fatalf("annotated apply without dry-run: got %v, want a refusal naming spec.template.spec", err)
			}
			after := tc.obj.DeepCopyObject().(client.Object)
			if err := c.Get(ctx(t), client.ObjectKeyFromObject(tc.obj), after); err != nil {
				t.Fatal(err)
			}
			if after.GetResourceVersion() != stored.GetResourceVersion() {
				t.Fatalf("the template changed: resourceVersion %s, was %s", after.GetResourceVersion(), stored.GetResourceVersion())
			}
		})
	}
}

// TestDiskSmallerThanImage checks the warning for a disk smaller than a
// base image whose size libvirt reports, on the real libvirtd: a 3 GiB
// overlay volume stands in for a base image.
func TestDiskSmallerThanImage(t *testing.T) {
	requireEnv(t)
	uri := testlibvirt.URI(t)
	if host == nil {
		t.Fatal("CAPL_TEST_LIBVIRT_URI is set but the webhooks have no libvirt connection")
	}
	pool := testlibvirt.Pool(t, uri, host)
	tiny := testlibvirt.Name(t)
	if _, err := host.UploadVolume(ctx(t), pool, tiny, make([]byte, 4096)); err != nil {
		t.Fatal(err)
	}
	base := testlibvirt.Name(t)
	if _, err := host.EnsureOverlay(ctx(t), virt.OverlaySpec{Pool: pool, Name: base, BackingPool: pool, BackingVolume: tiny, CapacityBytes: 3 << 30}); err != nil {
		t.Fatal(err)
	}
	img := infrav1.ImageSource{Volume: &infrav1.VolumeReference{Pool: pool, Name: base}}

	warnings.take("")
	small := &infrav1.LibvirtMachineTemplate{ObjectMeta: meta("disk-small")}
	small.Spec.Template.Spec = infrav1.LibvirtMachineSpec{Image: img, DiskSizeGiB: 2}
	if err := create(t, small); err != nil {
		t.Fatal(err)
	}
	if got := warnings.take("spec.template.spec.diskSizeGiB"); len(got) != 1 || !strings.Contains(got[0], "3.0 GiB") {
		t.Fatalf("warnings for a 2 GiB disk on a 3 GiB image: %q", got)
	}

	large := &infrav1.LibvirtMachine{ObjectMeta: meta("disk-large"), Spec: infrav1.LibvirtMachineSpec{Image: img, DiskSizeGiB: 4}}
	if err := create(t, large); err != nil {
		t.Fatal(err)
	}
	if got := warnings.take("diskSizeGiB"); len(got) != 0 {
		t.Fatalf("warnings for a 4 GiB disk on a 3 GiB image: %q", got)
	}

	// A machine's image without a pool is looked up in its cluster's
	// pool, found through the Cluster named by its cluster-name label; a
	// url image under the name the provider imports it as.
	lc := &infrav1.LibvirtCluster{ObjectMeta: meta("disk-cluster"), Spec: infrav1.LibvirtClusterSpec{StoragePool: infrav1.StoragePool{Name: pool}}}
	if err := create(t, lc); err != nil {
		t.Fatal(err)
	}
	cl := &clusterv1.Cluster{ObjectMeta: meta("disk-cluster"), Spec: clusterv1.ClusterSpec{
		InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtCluster", Name: lc.Name},
	}}
	if err := create(t, cl); err != nil {
		t.Fatal(err)
	}
	sum := strings.Repeat("ef", 32)
	if _, err := host.EnsureOverlay(ctx(t), virt.OverlaySpec{Pool: pool, Name: naming.ImageVolumeName(sum), BackingPool: pool, BackingVolume: tiny, CapacityBytes: 3 << 30}); err != nil {
		t.Fatal(err)
	}
	for i, img := range []infrav1.ImageSource{
		{Volume: &infrav1.VolumeReference{Name: base}},
		{URL: "https://images.example/debian.qcow2", Checksum: "sha256:" + sum},
	} {
		m := &infrav1.LibvirtMachine{ObjectMeta: meta(name("disk-in-cluster-pool", i)), Spec: infrav1.LibvirtMachineSpec{Image: img, DiskSizeGiB: 1}}
		m.Labels = map[string]string{clusterv1.ClusterNameLabel: cl.Name}
		if err := create(t, m); err != nil {
			t.Fatal(err)
		}
		if got := warnings.take("spec.diskSizeGiB"); len(got) != 1 {
			t.Fatalf("warnings for a 1 GiB disk on a 3 GiB image in the cluster's pool (%+v): %q", img, got)
		}
	}

	// Unknown sizes are not checked: a volume libvirt does not have.
	missing := &infrav1.LibvirtMachine{ObjectMeta: meta("disk-unknown"), Spec: infrav1.LibvirtMachineSpec{
		Image: infrav1.ImageSource{Volume: &infrav1.VolumeReference{Pool: pool, Name: "absent.qcow2"}}, DiskSizeGiB: 1,
	}}
	if err := create(t, missing); err != nil {
		t.Fatal(err)
	}
	if got := warnings.take("diskSizeGiB"); len(got) != 0 {
		t.Fatalf("warnings for an unknown image: %q", got)
	}
}

// TestFinalizerNamesDrawNoWarning: the API server warns on every write of
// an object whose finalizer is not domain-qualified with a path, as the
// legacy names are; the controllers' current names draw none.
func TestFinalizerNamesDrawNoWarning(t *testing.T) {
	requireEnv(t)
	for _, tc := range []struct {
		finalizer string
		obj       client.Object
		warned    bool
	}{
		{infrav1.MachineFinalizer, machine(func(*infrav1.LibvirtMachineSpec) {})(), false},
		{infrav1.ClusterFinalizer, validCluster(), false},
		// The check can fail: the legacy names are warned about.
		{infrav1.LegacyMachineFinalizer, machine(func(*infrav1.LibvirtMachineSpec) {})(), true},
		{infrav1.LegacyClusterFinalizer, validCluster(), true},
	} {
		t.Run(tc.finalizer, func(t *testing.T) {
			tc.obj.SetNamespace(namespace)
			tc.obj.SetName("finalizer-name")
			tc.obj.SetFinalizers([]string{tc.finalizer})
			warnings.take("")
			if err := c.Create(ctx(t), tc.obj, client.DryRunAll); err != nil {
				t.Fatal(err)
			}
			if got := warnings.take("finalizers"); (len(got) > 0) != tc.warned {
				t.Errorf("warnings on creating a %T with finalizer %q: %q, want warned %v", tc.obj, tc.finalizer, got, tc.warned)
			}
		})
	}
}
