package webhooks_test

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime/schema"
	"k8s.io/apimachinery/pkg/util/validation/field"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

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
		{name: "endpoint pool with type None", obj: cluster(func(s *infrav1.LibvirtClusterSpec) {
			noneWithHost(s)
			s.Network = infrav1.ClusterNetwork{Bridge: "br0"}
			s.LoadBalancer.AddressFromPool = &lanPool
		}), field: "spec", detail: "loadBalancer.addressFromPool applies only to type HAProxy"},
		{name: "endpoint pool on the network the provider makes", obj: cluster(func(s *infrav1.LibvirtClusterSpec) {
			s.LoadBalancer.AddressFromPool = &lanPool
		}), field: "spec", detail: "loadBalancer.addressFromPool needs network.bridge or network.name"},
		{name: "endpoint pool changed", obj: cluster(func(s *infrav1.LibvirtClusterSpec) {
			s.Network = infrav1.ClusterNetwork{Bridge: "br0"}
			s.LoadBalancer.AddressFromPool = &infrav1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "lan"}
		}), update: onCluster(func(s *infrav1.LibvirtClusterSpec) { s.LoadBalancer.AddressFromPool.Name = "other" }),
			field: "spec.loadBalancer.addressFromPool", detail: "is immutable"},
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
		{name: "data disk named in capitals", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.DataDisks = []infrav1.DataDisk{{Name: "Etcd", SizeGiB: 1}}
		}), field: "spec.dataDisks[0].name"},
		{name: "two data disks of one name", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.DataDisks = []infrav1.DataDisk{{Name: "data", SizeGiB: 1}, {Name: "data", SizeGiB: 2}}
		}), field: "spec.dataDisks[1]"},
		{name: "data disk of 0 GiB", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.DataDisks = []infrav1.DataDisk{{Name: "data"}}
		}), field: "spec.dataDisks[0].sizeGiB"},
		{name: "host device named by its address", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.HostDevices = []infrav1.HostDevice{{Name: "0000:65:00.0"}}
		}), field: "spec.hostDevices[0].name"},
		{name: "host device twice", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.HostDevices = []infrav1.HostDevice{{Name: "gpu0"}, {Name: "gpu0"}}
		}), field: "spec.hostDevices[1]"},
		{name: "nameserver that is no address", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.Network = &infrav1.NetworkAttachment{Bridge: "br0", AddressesFromPools: []infrav1.IPPoolReference{lanPool}, Nameservers: []string{"dns.example"}}
		}), field: "spec.network.nameservers[0]"},
		{name: "pools on a network the provider made", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.Network = &infrav1.NetworkAttachment{Name: "capl-other.web", AddressesFromPools: []infrav1.IPPoolReference{lanPool}}
		}), field: "spec.network.addressesFromPools"},
		{name: "nameservers without pools", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.Network = &infrav1.NetworkAttachment{Bridge: "br0", Nameservers: []string{"10.231.0.2"}}
		}), field: "spec.network", detail: "nameservers go with addressesFromPools"},
		{name: "pool without apiGroup", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.Network = &infrav1.NetworkAttachment{Bridge: "br0", AddressesFromPools: []infrav1.IPPoolReference{{Kind: "InClusterIPPool", Name: "lan"}}}
		}), field: "spec.network.addressesFromPools[0].apiGroup"},
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
		{name: "machine data disk added", obj: machine(func(*infrav1.LibvirtMachineSpec) {}),
			update: onMachine(func(s *infrav1.LibvirtMachineSpec) { s.DataDisks = []infrav1.DataDisk{{Name: "data", SizeGiB: 1}} }),
			field:  "spec.dataDisks", detail: "is immutable"},
		{name: "machine host device added", obj: machine(func(*infrav1.LibvirtMachineSpec) {}),
			update: onMachine(func(s *infrav1.LibvirtMachineSpec) { s.HostDevices = []infrav1.HostDevice{{Name: "gpu0"}} }),
			field:  "spec.hostDevices", detail: "is immutable"},
		{name: "machine pools changed", obj: machine(func(s *infrav1.LibvirtMachineSpec) {
			s.Network = &infrav1.NetworkAttachment{Bridge: "br0", AddressesFromPools: []infrav1.IPPoolReference{lanPool}}
		}), update: onMachine(func(s *infrav1.LibvirtMachineSpec) { s.Network.AddressesFromPools[0].Name = "other" }), field: "spec.network", detail: "is immutable"},
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

// lanPool is an in-cluster IPAM pool the rejections name.
var lanPool = infrav1.IPPoolReference{APIGroup: "ipam.cluster.x-k8s.io", Kind: "InClusterIPPool", Name: "lan"}
