package webhooks_test

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testenv"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testlibvirt"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
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

func name(prefix string, i int) string {
	return prefix + "-" + string(rune('a'+i))
}

// rejection is one bad input: an object to create, or (with update) an
// object to create and a change that must be refused. field is the exact
// path every cause of the error must have (checkRejection); detail, when
// set, is a fragment of the cause's message that tells this rule from any
// other at the same path (needed where the path is as coarse as "spec").
type rejection struct {
	name   string
	obj    func() client.Object
	update func(client.Object)
	field  string
	detail string
}

// checkRejection returns why err is not the refusal tc expects: an Invalid
// error whose causes all have exactly tc.field as their field path (no
// prefix, no other field), with tc.detail in a message when set.
func checkRejection(tc rejection, err error) error {
	if err == nil {
		return fmt.Errorf("accepted; want a rejection naming %s", tc.field)
	}
	var status apierrors.APIStatus
	if !apierrors.IsInvalid(err) || !errors.As(err, &status) {
		return fmt.Errorf("got %v; want an Invalid error", err)
	}
	var causes []metav1.StatusCause
	if d := status.Status().Details; d != nil {
		causes = d.Causes
	}
	if len(causes) == 0 {
		return fmt.Errorf("the error names no field; want %s: %v", tc.field, err)
	}
	detail := tc.detail == ""
	for _, c := range causes {
		if c.Field != tc.field {
			return fmt.Errorf("cause at %q (%s), want every cause at exactly %q: %v", c.Field, c.Message, tc.field, err)
		}
		detail = detail || strings.Contains(c.Message, tc.detail)
	}
	if !detail {
		return fmt.Errorf("no cause at %s says %q: %v", tc.field, tc.detail, err)
	}
	return nil
}

func validCluster() *infrav1.LibvirtCluster {
	return &infrav1.LibvirtCluster{Spec: infrav1.LibvirtClusterSpec{Network: infrav1.ClusterNetwork{CIDR: "192.168.150.0/24"}}}
}

func cluster(f func(*infrav1.LibvirtClusterSpec)) func() client.Object {
	return func() client.Object { lc := validCluster(); f(&lc.Spec); return lc }
}

func clusterTemplate(f func(*infrav1.LibvirtClusterSpec)) func() client.Object {
	return func() client.Object {
		lt := &infrav1.LibvirtClusterTemplate{}
		lt.Spec.Template.Spec = validCluster().Spec
		f(&lt.Spec.Template.Spec)
		return lt
	}
}

func machine(f func(*infrav1.LibvirtMachineSpec)) func() client.Object {
	return func() client.Object {
		m := &infrav1.LibvirtMachine{Spec: infrav1.LibvirtMachineSpec{Image: *volumeImage.DeepCopy()}}
		f(&m.Spec)
		return m
	}
}

func machineTemplate(f func(*infrav1.LibvirtMachineSpec)) func() client.Object {
	return func() client.Object {
		mt := &infrav1.LibvirtMachineTemplate{}
		mt.Spec.Template.Spec.Image = *volumeImage.DeepCopy()
		f(&mt.Spec.Template.Spec)
		return mt
	}
}

func onCluster(f func(*infrav1.LibvirtClusterSpec)) func(client.Object) {
	return func(o client.Object) { f(&o.(*infrav1.LibvirtCluster).Spec) }
}

func onMachine(f func(*infrav1.LibvirtMachineSpec)) func(client.Object) {
	return func(o client.Object) { f(&o.(*infrav1.LibvirtMachine).Spec) }
}

func noneWithHost(s *infrav1.LibvirtClusterSpec) {
	s.LoadBalancer.Type = infrav1.LoadBalancerNone
	s.ControlPlaneEndpoint.Host = "192.168.150.10"
}

func TestRejections(t *testing.T) {
	requireEnv(t)
	sum := "sha256:" + strings.Repeat("cd", 32)
	cases := []rejection{
		// LibvirtCluster, refused by the webhook.
		{name: "cidr in the loopback block", obj: cluster(func(s *infrav1.LibvirtClusterSpec) { s.Network.CIDR = "127.0.0.0/24" }), field: "spec.network.cidr"},
		{name: "cidr in the link-local block", obj: cluster(func(s *infrav1.LibvirtClusterSpec) { s.Network.CIDR = "169.254.10.0/24" }), field: "spec.network.cidr"},
		{name: "cidr in the multicast block", obj: cluster(func(s *infrav1.LibvirtClusterSpec) { s.Network.CIDR = "224.1.0.0/16" }), field: "spec.network.cidr"},
		{name: "type None without an endpoint host", obj: cluster(func(s *infrav1.LibvirtClusterSpec) { s.LoadBalancer.Type = infrav1.LoadBalancerNone }), field: "spec.controlPlaneEndpoint.host"},
		{name: "type None with load-balancer cpus", obj: cluster(func(s *infrav1.LibvirtClusterSpec) { noneWithHost(s); s.LoadBalancer.CPUs = 2 }), field: "spec.loadBalancer.cpus"},
		{name: "type None with load-balancer memory", obj: cluster(func(s *infrav1.LibvirtClusterSpec) { noneWithHost(s); s.LoadBalancer.MemoryMiB = 1024 }), field: "spec.loadBalancer.memoryMiB"},
		{name: "type None with a load-balancer cpuMode", obj: cluster(func(s *infrav1.LibvirtClusterSpec) {
			noneWithHost(s)
			s.LoadBalancer.CPUMode = infrav1.CPUModeHostModel
		}), field: "spec.loadBalancer.cpuMode"},
		{name: "HAProxy on a host bridge without an endpoint", obj: cluster(func(s *infrav1.LibvirtClusterSpec) { s.Network = infrav1.ClusterNetwork{Bridge: "br0"} }), field: "spec.controlPlaneEndpoint.host"},
		{name: "HAProxy on a host bridge with a DNS name as endpoint", obj: cluster(func(s *infrav1.LibvirtClusterSpec) {
			s.Network = infrav1.ClusterNetwork{Bridge: "br0"}
			s.ControlPlaneEndpoint.Host = "api.lan"
		}), field: "spec.controlPlaneEndpoint.host", detail: "static address"},
		{name: "load-balancer image url with credentials", obj: cluster(func(s *infrav1.LibvirtClusterSpec) {
			s.LoadBalancer.Image = &infrav1.ImageSource{URL: "https://user:secret@images.example/haproxy.qcow2", Checksum: sum}
		}), field: "spec.loadBalancer.image.url"},
		// LibvirtCluster, refused by the CRD (OpenAPI, list-map keys, CEL).
		{name: "duplicate failure-domain names", obj: cluster(func(s *infrav1.LibvirtClusterSpec) {
			s.FailureDomains = []infrav1.FailureDomainSpec{{Name: "host-a"}, {Name: "host-a"}}
		}), field: "spec.failureDomains[1]"},
		{name: "cidr with host bits", obj: cluster(func(s *infrav1.LibvirtClusterSpec) { s.Network.CIDR = "192.168.150.1/24" }), field: "spec.network.cidr"},
		{name: "network name and bridge", obj: cluster(func(s *infrav1.LibvirtClusterSpec) {
			s.Network = infrav1.ClusterNetwork{Name: "default", Bridge: "br0"}
		}), field: "spec.network", detail: "at most one of name, bridge and cidr"},
		{name: "qemu load balancer with host-passthrough", obj: cluster(func(s *infrav1.LibvirtClusterSpec) {
			s.LoadBalancer.DomainType, s.LoadBalancer.CPUMode = infrav1.DomainTypeQEMU, infrav1.CPUModeHostPassthrough
		}), field: "spec.loadBalancer", detail: "host-passthrough needs domainType kvm"},
		// LibvirtCluster updates.
		{name: "endpoint host changed once set", obj: cluster(noneWithHost),
			update: onCluster(func(s *infrav1.LibvirtClusterSpec) { s.ControlPlaneEndpoint.Host = "192.168.150.11" }), field: "spec.controlPlaneEndpoint", detail: "is immutable"},
		{name: "endpoint port changed once set", obj: cluster(noneWithHost),
			update: onCluster(func(s *infrav1.LibvirtClusterSpec) { s.ControlPlaneEndpoint.Port = 7443 }), field: "spec.controlPlaneEndpoint", detail: "is immutable"},
		{name: "network cidr changed", obj: cluster(func(*infrav1.LibvirtClusterSpec) {}),
			update: onCluster(func(s *infrav1.LibvirtClusterSpec) { s.Network.CIDR = "192.168.151.0/24" }), field: "spec.network", detail: "is immutable"},
		{name: "load-balancer type changed", obj: cluster(func(*infrav1.LibvirtClusterSpec) {}),
			update: onCluster(func(s *infrav1.LibvirtClusterSpec) {
				noneWithHost(s)
				s.LoadBalancer.VirtualHardware = infrav1.VirtualHardware{DomainType: infrav1.DomainTypeKVM}
			}), field: "spec.loadBalancer.type"},
		// LibvirtClusterTemplate.
		{name: "template with an endpoint host", obj: clusterTemplate(noneWithHost), field: "spec.template.spec.controlPlaneEndpoint.host"},
		{name: "template cidr in a reserved block", obj: clusterTemplate(func(s *infrav1.LibvirtClusterSpec) { s.Network.CIDR = "240.0.0.0/24" }), field: "spec.template.spec.network.cidr"},
		{name: "template spec changed", obj: clusterTemplate(func(*infrav1.LibvirtClusterSpec) {}),
			update: func(o client.Object) {
				o.(*infrav1.LibvirtClusterTemplate).Spec.Template.Spec.StoragePool.Name = "other"
			}, field: "spec.template.spec", detail: "is immutable: create a new template"},
		// LibvirtMachine, refused by the webhook.
		{name: "file url with a host", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.Image = infrav1.ImageSource{URL: "file://images/debian.qcow2", Checksum: sum}
		}), field: "spec.image.url"},
		{name: "http url without a host", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.Image = infrav1.ImageSource{URL: "http:///debian.qcow2", Checksum: sum}
		}), field: "spec.image.url"},
		{name: "volume named ..", obj: machine(func(s *infrav1.LibvirtMachineSpec) { s.Image.Volume.Name = ".." }), field: "spec.image.volume.name"},
		{name: "volume named like an import marker", obj: machine(func(s *infrav1.LibvirtMachineSpec) { s.Image.Volume.Name = "debian.qcow2.partial" }), field: "spec.image.volume.name"},
		// LibvirtMachine, refused by the CRD.
		{name: "image with volume and url", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.Image.URL, s.Image.Checksum = "https://images.example/debian.qcow2", sum
		}), field: "spec.image", detail: "exactly one of volume and url"},
		{name: "url without checksum", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.Image = infrav1.ImageSource{URL: "https://images.example/debian.qcow2"}
		}), field: "spec.image", detail: "checksum is required when url is set"},
		{name: "negative cpus", obj: machine(func(s *infrav1.LibvirtMachineSpec) { s.CPUs = -1 }), field: "spec.cpus"},
		{name: "qemu with host-passthrough", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.DomainType, s.CPUMode = infrav1.DomainTypeQEMU, infrav1.CPUModeHostPassthrough
		}), field: "spec", detail: "host-passthrough needs domainType kvm"},
		// LibvirtMachine updates.
		{name: "machine cpus changed", obj: machine(func(*infrav1.LibvirtMachineSpec) {}),
			update: onMachine(func(s *infrav1.LibvirtMachineSpec) { s.CPUs = 4 }), field: "spec.cpus"},
		{name: "machine memory changed", obj: machine(func(*infrav1.LibvirtMachineSpec) {}),
			update: onMachine(func(s *infrav1.LibvirtMachineSpec) { s.MemoryMiB = 4096 }), field: "spec.memoryMiB"},
		{name: "machine image changed", obj: machine(func(*infrav1.LibvirtMachineSpec) {}),
			update: onMachine(func(s *infrav1.LibvirtMachineSpec) { s.Image.Volume.Name = "other.qcow2" }), field: "spec.image", detail: "is immutable"},
		{name: "machine cpu model changed", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.DomainType, s.CPUMode, s.CPUModel = infrav1.DomainTypeQEMU, infrav1.CPUModeCustom, "Nehalem"
		}), update: onMachine(func(s *infrav1.LibvirtMachineSpec) { s.CPUModel = "Westmere" }), field: "spec.cpuModel", detail: "is immutable"},
		{name: "machine disk changed", obj: machine(func(*infrav1.LibvirtMachineSpec) {}),
			update: onMachine(func(s *infrav1.LibvirtMachineSpec) { s.DiskSizeGiB = 40 }), field: "spec.diskSizeGiB"},
		{name: "machine network changed", obj: machine(func(*infrav1.LibvirtMachineSpec) {}),
			update: onMachine(func(s *infrav1.LibvirtMachineSpec) { s.Network = &infrav1.NetworkAttachment{Bridge: "br0"} }), field: "spec.network", detail: "is immutable"},
		{name: "providerID changed once set", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.ProviderID = "libvirt:///0e7c2c1e-8a9e-4d56-9d3c-5e3f5a0b7c11"
		}), update: onMachine(func(s *infrav1.LibvirtMachineSpec) {
			s.ProviderID = "libvirt:///1e7c2c1e-8a9e-4d56-9d3c-5e3f5a0b7c11"
		}), field: "spec", detail: "providerID is immutable once set"},
		// LibvirtMachineTemplate.
		{name: "template image url with credentials", obj: machineTemplate(func(s *infrav1.LibvirtMachineSpec) {
			s.Image = infrav1.ImageSource{URL: "https://user@images.example/debian.qcow2", Checksum: sum}
		}), field: "spec.template.spec.image.url"},
		{name: "template with a providerID", obj: machineTemplate(func(s *infrav1.LibvirtMachineSpec) {
			s.ProviderID = "libvirt:///0e7c2c1e-8a9e-4d56-9d3c-5e3f5a0b7c11"
		}), field: "spec.template.spec", detail: "providerID must not be set in a template"},
		{name: "template spec changed", obj: machineTemplate(func(*infrav1.LibvirtMachineSpec) {}),
			update: func(o client.Object) { o.(*infrav1.LibvirtMachineTemplate).Spec.Template.Spec.CPUs = 8 }, field: "spec.template.spec",
			detail: "is immutable: create a new template"},
	}
	if len(cases) < 20 {
		t.Fatalf("only %d bad inputs", len(cases))
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.obj()
			obj.SetNamespace(namespace)
			obj.SetName(name("bad", i%26) + strings.Repeat("x", i/26))
			err := create(t, obj)
			if tc.update != nil {
				if err != nil {
					t.Fatalf("creating the object to update: %v", err)
				}
				tc.update(obj)
				err = c.Update(ctx(t), obj)
			}
			if err := checkRejection(tc, err); err != nil {
				t.Fatal(err)
			}
			t.Logf("refused: %v", err)
		})
	}
}

// TestCheckRejection pins down the assertion every rejection case relies
// on: an error only counts when each of its causes is at exactly the
// expected path, and says what the case expects where the path is coarse.
func TestCheckRejection(t *testing.T) {
	gk := schema.GroupKind{Group: infrav1.GroupVersion.Group, Kind: "LibvirtMachine"}
	invalid := func(errs ...*field.Error) error { return apierrors.NewInvalid(gk, "m", errs) }
	spec := field.NewPath("spec")
	tests := []struct {
		name string
		tc   rejection
		err  error
		ok   bool
	}{
		{"exact path", rejection{field: "spec.cpus"}, invalid(field.Invalid(spec.Child("cpus"), -1, "must be positive")), true},
		{"a deeper path is not the field", rejection{field: "spec"}, invalid(field.Invalid(spec.Child("cpus"), -1, "must be positive")), false},
		{"a shallower path is not the field", rejection{field: "spec.image.url"}, invalid(field.Invalid(spec.Child("image"), "", "x")), false},
		{"a sibling with a common prefix", rejection{field: "spec.network"}, invalid(field.Invalid(spec.Child("networkName"), "", "x")), false},
		{"another cause besides", rejection{field: "spec.cpus"},
			invalid(field.Invalid(spec.Child("cpus"), -1, "x"), field.Invalid(spec.Child("memoryMiB"), 1, "y")), false},
		{"the detail expected", rejection{field: "spec", detail: "needs domainType kvm"},
			invalid(field.Invalid(spec, "", "cpuMode host-passthrough needs domainType kvm; use maximum with qemu")), true},
		{"another rule at the same coarse path", rejection{field: "spec", detail: "needs domainType kvm"},
			invalid(field.Invalid(spec, "", "providerID is immutable once set")), false},
		{"accepted", rejection{field: "spec"}, nil, false},
		{"not Invalid", rejection{field: "spec"}, apierrors.NewBadRequest("spec: bad"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			if err := checkRejection(tt.tc, tt.err); (err == nil) != tt.ok {
				t.Errorf("checkRejection(%+v, %v) = %v; want ok %v", tt.tc, tt.err, err, tt.ok)
			}
		})
	}
}

// TestAllowedUpdates checks what may change: what the provider sets once,
// template metadata, and what the controllers cope with.
func TestAllowedUpdates(t *testing.T) {
	requireEnv(t)
	cases := []struct {
		name   string
		obj    func() client.Object
		update func(client.Object)
	}{
		{"HAProxy endpoint host set by the provider", cluster(func(*infrav1.LibvirtClusterSpec) {}),
			onCluster(func(s *infrav1.LibvirtClusterSpec) { s.ControlPlaneEndpoint.Host = "192.168.150.2" })},
		{"storage pool and failure domains", cluster(func(*infrav1.LibvirtClusterSpec) {}),
			onCluster(func(s *infrav1.LibvirtClusterSpec) {
				s.StoragePool = infrav1.StoragePool{Name: "other"}
				s.FailureDomains = []infrav1.FailureDomainSpec{{Name: "host-a", ControlPlane: ptr.To(true)}}
			})},
		{"providerID set once", machine(func(*infrav1.LibvirtMachineSpec) {}),
			onMachine(func(s *infrav1.LibvirtMachineSpec) { s.ProviderID = "libvirt:///0e7c2c1e-8a9e-4d56-9d3c-5e3f5a0b7c11" })},
		{"machine labels", machine(func(*infrav1.LibvirtMachineSpec) {}),
			func(o client.Object) { o.SetLabels(map[string]string{"team": "a"}) }},
		{"template metadata", machineTemplate(func(*infrav1.LibvirtMachineSpec) {}),
			func(o client.Object) {
				o.(*infrav1.LibvirtMachineTemplate).Spec.Template.ObjectMeta.Labels = map[string]string{"team": "a"}
			}},
		{"cluster template unchanged spec", clusterTemplate(func(*infrav1.LibvirtClusterSpec) {}),
			func(o client.Object) { o.SetAnnotations(map[string]string{"note": "x"}) }},
	}
	for i, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			obj := tc.obj()
			obj.SetNamespace(namespace)
			obj.SetName(name("allowed", i))
			if err := create(t, obj); err != nil {
				t.Fatal(err)
			}
			tc.update(obj)
			if err := c.Update(ctx(t), obj); err != nil {
				t.Fatal(err)
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

// TestPlacementIsFixed: once the provider recorded where an object's
// volumes and network are, the API server refuses an edit or removal of
// that record (a tenant could otherwise orphan a root disk and a seed by
// repointing it before a delete), while other annotations still change.
func TestPlacementIsFixed(t *testing.T) {
	requireEnv(t)
	obj := machine(func(*infrav1.LibvirtMachineSpec) {})().(*infrav1.LibvirtMachine)
	obj.Namespace, obj.Name = namespace, name("placement", 0)
	obj.Annotations = map[string]string{scope.PoolAnnotation: "capi-libvirt", scope.NetworkAnnotation: "network:capl-" + namespace + ".c"}
	if err := create(t, obj); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		edit   func(a map[string]string)
		refuse bool
	}{
		{"another annotation", func(a map[string]string) { a["note"] = "x" }, false},
		{"the pool repointed", func(a map[string]string) { a[scope.PoolAnnotation] = "images" }, true},
		{"the network removed", func(a map[string]string) { delete(a, scope.NetworkAnnotation) }, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := &infrav1.LibvirtMachine{}
			if err := c.Get(ctx(t), client.ObjectKeyFromObject(obj), cur); err != nil {
				t.Fatal(err)
			}
			tc.edit(cur.Annotations)
			err := c.Update(ctx(t), cur)
			if tc.refuse && (err == nil || !strings.Contains(err.Error(), "cannot change")) {
				t.Fatalf("update: %v, want a refusal", err)
			}
			if !tc.refuse && err != nil {
				t.Fatal(err)
			}
		})
	}
	// clusterctl move marks each source object before deleting it with
	// this patch (cmd/clusterctl/client/cluster/mover.go), which replaces
	// every annotation, the placement included: it must pass, or the move
	// fails half way with the objects on both sides.
	cur := obj.DeepCopy()
	if err := c.Patch(ctx(t), cur, testenv.DeleteForMovePatch()); err != nil {
		t.Fatalf("clusterctl move's delete-for-move patch: %v", err)
	}
	if _, ok := cur.Annotations[clusterctlv1.DeleteForMoveAnnotation]; !ok || len(cur.Annotations) != 1 {
		t.Errorf("annotations after clusterctl's patch: %v", cur.Annotations)
	}
}

// TestFailureDomainHostFixed: a failure domain's uri cannot change, nor
// the failure domain go, while a LibvirtMachine is placed there; failure
// domains nobody uses change freely. On the code before this test every
// one of these updates passed (deletion then looked on the wrong host).
func TestFailureDomainHostFixed(t *testing.T) {
	requireEnv(t)
	const a, b = "qemu+tcp://192.0.2.10/system", "qemu+tcp://192.0.2.11/system"
	lc := cluster(func(s *infrav1.LibvirtClusterSpec) {
		s.Network = infrav1.ClusterNetwork{Bridge: "br0"}
		s.LoadBalancer = infrav1.LoadBalancer{Type: infrav1.LoadBalancerNone}
		s.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "192.0.2.100", Port: 6443}
		s.FailureDomains = []infrav1.FailureDomainSpec{{Name: "fd-a", URI: a, ControlPlane: ptr.To(true)}, {Name: "fd-b", URI: b, ControlPlane: ptr.To(true)}, {Name: "fd-c", URI: b}}
	})().(*infrav1.LibvirtCluster)
	lc.Namespace, lc.Name = namespace, name("fdfixed", 0)
	lc.Labels = map[string]string{clusterv1.ClusterNameLabel: lc.Name}
	if err := create(t, lc); err != nil {
		t.Fatal(err)
	}
	lm := machine(func(s *infrav1.LibvirtMachineSpec) { s.FailureDomain = "fd-a" })().(*infrav1.LibvirtMachine)
	lm.Namespace, lm.Name = namespace, name("fdfixed-m", 0)
	lm.Labels = map[string]string{clusterv1.ClusterNameLabel: lc.Name}
	if err := create(t, lm); err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name   string
		edit   func([]infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec
		refuse bool
	}{
		{"the used domain's host swapped", func(f []infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec {
			f[0].URI, f[1].URI = f[1].URI, f[0].URI
			return f
		}, true},
		{"the used domain removed", func(f []infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec { return f[1:] }, true},
		{"an unused domain's host changed", func(f []infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec {
			f[2].URI = a
			return f
		}, false},
		{"an unused domain removed", func(f []infrav1.FailureDomainSpec) []infrav1.FailureDomainSpec { return f[:2] }, false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			cur := &infrav1.LibvirtCluster{}
			if err := c.Get(ctx(t), client.ObjectKeyFromObject(lc), cur); err != nil {
				t.Fatal(err)
			}
			cur.Spec.FailureDomains = tc.edit(slices.Clone(cur.Spec.FailureDomains))
			err := c.Update(ctx(t), cur)
			if tc.refuse && (err == nil || !strings.Contains(err.Error(), lm.Name)) {
				t.Fatalf("update: %v, want a refusal naming %s", err, lm.Name)
			}
			if !tc.refuse && err != nil {
				t.Fatal(err)
			}
		})
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
