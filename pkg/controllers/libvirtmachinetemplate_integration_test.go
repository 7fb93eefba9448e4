package controllers_test

import (
	"context"
	"errors"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/util/wait"
	"k8s.io/utils/ptr"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/controller"
	metricsserver "sigs.k8s.io/controller-runtime/pkg/metrics/server"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/controllers"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
)

// TestTemplateCapacityForTheAutoscaler: a LibvirtMachineTemplate reports
// what its machines offer, and the cluster autoscaler's Cluster API
// provider can read it as it does, from the unstructured template:
// status.capacity as quantities, status.nodeInfo's architecture and
// operating system. Data disks are not ephemeral storage; host devices
// the operator gave a resource count as that resource (nvidia.com/gpu),
// the others as nothing.
func TestTemplateCapacityForTheAutoscaler(t *testing.T) {
	if testing.Short() && !testprereq.InCI() {
		t.Skip("integration test: not run with -short outside CI")
	}
	env, err := testenv.Start()
	if errors.Is(err, testenv.ErrNoAssets) {
		testprereq.Missing(t, "%v", err)
	}
	must(t, err)
	t.Cleanup(func() { _ = env.Stop() })
	scheme, err := manager.NewScheme()
	must(t, err)
	mgr, err := ctrl.NewManager(env.Config, ctrl.Options{Scheme: scheme, Metrics: metricsserver.Options{BindAddress: "0"}})
	must(t, err)
	devices, err := tenancy.ParseHostDevices([]string{"gpu0=0000:65:00.0/nvidia.com/gpu", "gpu1=0000:66:00.0/nvidia.com/gpu", "nic0=0000:17:00.1"})
	must(t, err)
	must(t, (&controllers.LibvirtMachineTemplateReconciler{Client: mgr.GetClient(), Tenancy: tenancy.Policy{HostDevices: devices}}).
		SetupWithManager(mgr, controller.Options{SkipNameValidation: ptr.To(true)}))
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go func() { _ = mgr.Start(ctx) }()

	for _, tc := range []struct {
		name string
		spec infrav1.LibvirtMachineSpec
		want map[corev1.ResourceName]string
	}{
		{"sized", infrav1.LibvirtMachineSpec{
			VirtualHardware: infrav1.VirtualHardware{CPUs: 4, MemoryMiB: 6144, DomainType: infrav1.DomainTypeKVM},
			DiskSizeGiB:     40,
			DataDisks:       []infrav1.DataDisk{{Name: "longhorn", SizeGiB: 100}},
		}, map[corev1.ResourceName]string{corev1.ResourceCPU: "4", corev1.ResourceMemory: "6Gi", corev1.ResourceEphemeralStorage: "40Gi"}},
		{"gpus", infrav1.LibvirtMachineSpec{
			VirtualHardware: infrav1.VirtualHardware{CPUs: 8, MemoryMiB: 16384, DomainType: infrav1.DomainTypeKVM},
			HostDevices:     []infrav1.HostDevice{{Name: "gpu0"}, {Name: "nic0"}, {Name: "gpu1"}},
		}, map[corev1.ResourceName]string{corev1.ResourceCPU: "8", corev1.ResourceMemory: "16Gi", corev1.ResourceEphemeralStorage: "20Gi",
			"nvidia.com/gpu": "2"}},
		{"defaults", infrav1.LibvirtMachineSpec{},
			map[corev1.ResourceName]string{corev1.ResourceCPU: "2", corev1.ResourceMemory: "2Gi", corev1.ResourceEphemeralStorage: "20Gi"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tmpl := &infrav1.LibvirtMachineTemplate{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "capacity-" + tc.name}}
			tmpl.Spec.Template.Spec = tc.spec
			tmpl.Spec.Template.Spec.Image = infrav1.ImageSource{Volume: &infrav1.VolumeReference{Name: "base"}}
			must(t, env.Client.Create(ctx, tmpl))

			// As the autoscaler reads it: an unstructured object of the
			// infrastructure reference's kind.
			u := &unstructured.Unstructured{}
			u.SetGroupVersionKind(infrav1.GroupVersion.WithKind("LibvirtMachineTemplate"))
			var capacity map[string]string
			err := wait.PollUntilContextTimeout(ctx, 100*time.Millisecond, time.Minute, true, func(ctx context.Context) (bool, error) {
				if err := env.Client.Get(ctx, client.ObjectKeyFromObject(tmpl), u); err != nil {
					return false, err
				}
				capacity, _, err = unstructured.NestedStringMap(u.Object, "status", "capacity")
				return len(capacity) > 0, err
			})
			if err != nil {
				t.Fatalf("no status.capacity on the template: %v", err)
			}
			for name, want := range tc.want {
				got, err := resource.ParseQuantity(capacity[string(name)])
				if err != nil || got.Cmp(resource.MustParse(want)) != 0 {
					t.Errorf("status.capacity[%s] = %q (%v), want %s", name, capacity[string(name)], err, want)
				}
			}
			if len(capacity) != len(tc.want) {
				t.Errorf("status.capacity %v has resources beyond %v", capacity, tc.want)
			}
			arch, _, _ := unstructured.NestedString(u.Object, "status", "nodeInfo", "architecture")
			os, _, _ := unstructured.NestedString(u.Object, "status", "nodeInfo", "operatingSystem")
			if arch != "amd64" || os != "linux" {
				t.Errorf("status.nodeInfo = %s/%s, want amd64/linux", arch, os)
			}
			t.Logf("%s: capacity %v, nodeInfo %s/%s", tmpl.Name, capacity, arch, os)
		})
	}
}
