package domain_test

import (
	"context"
	"errors"
	"strings"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/cloudinit"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/pci"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/domain"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// condition is the last state a step condition was set to.
type condition struct {
	status  bool
	reason  string
	message string
}

// vm is the VM the domain service runs, over a fake host, with the
// conditions its plan step sets kept in memory: the domain service's
// decisions are pure logic on what the host answers.
type vm struct {
	*scope.VM
	conditions map[string]condition
	// root and seed are the volumes the disk and seed steps handed over.
	root, seed *virt.VolumeInfo
}

// parts are the VM's parts as its plan hands them to the domain step.
func (v *vm) parts() domain.Parts {
	return domain.Parts{
		RootDisk: func() *virt.VolumeInfo { return v.root }, Seed: func() *virt.VolumeInfo { return v.seed },
		DataDisks: func() []virt.VolumeInfo { return nil }, HostDevices: func() []pci.Address { return nil },
		StaticAddresses: func() []cloudinit.StaticAddress { return nil },
	}
}

// newVM is a machine's VM whose root disk and seed the steps before the
// domain's ensured.
func newVM(host *fakehost.Host, memoryMiB int32) *vm {
	root := virt.VolumeInfo{Pool: "pool", Name: "m0-root", Path: "/pools/pool/m0-root", Format: "qcow2"}
	seed := virt.VolumeInfo{Pool: "pool", Name: "m0-seed", Path: "/pools/pool/m0-seed", Format: "raw"}
	host.Volumes["pool/m0-root"], host.Volumes["pool/m0-seed"] = root, seed
	return &vm{VM: &scope.VM{
		Domain: "capl-ns.m0", UUID: "0b9d6c86-1111-4e2e-9c55-3b6f1b0d7a11",
		Owner:   virt.Owner{Kind: "LibvirtMachine", Namespace: "ns", Name: "m0"},
		Network: scope.NetworkRef{Name: "net"}, MAC: "52:54:00:00:00:01", Pool: virt.PoolSpec{Name: "pool"},
		Hardware: infrav1.VirtualHardware{CPUs: 1, MemoryMiB: memoryMiB, DomainType: "qemu", CPUMode: "maximum"},
	}, conditions: map[string]condition{}, root: &root, seed: &seed}
}

// SetCondition keeps the condition a plan step sets (services.Reporter).
func (v *vm) SetCondition(condType string, status metav1.ConditionStatus, reason, message string) {
	v.conditions[condType] = condition{status: status == metav1.ConditionTrue, reason: reason, message: message}
}

// reconcile runs svc as the plan's domain step does.
func (v *vm) reconcile(svc *domain.Service) error {
	return services.Plan{{Service: svc, Condition: infrav1.DomainReadyCondition}}.Run(context.Background(), v, false)
}

// TestDomainChecksHostMemory covers the refusal of a VM that asks more
// memory than the libvirt host has: no domain is defined, on the first
// reconcile or a retry, and deletion still works.
func TestDomainChecksHostMemory(t *testing.T) {
	const hostBytes = 23_400 << 20 // about 22.9 GiB
	tests := []struct {
		name      string
		memoryMiB int32
		hostErr   error
		// defined: the domain exists and runs after Reconcile.
		defined bool
		// reason of DomainReady and a fragment of its message.
		reason      string
		message     string
		terminal    bool
		wantAnError bool
	}{
		{name: "fits", memoryMiB: 512, defined: true, reason: infrav1.ReadyReason},
		{name: "exactly the host's memory", memoryMiB: 23_400, defined: true, reason: infrav1.ReadyReason},
		{name: "one MiB more than the host", memoryMiB: 23_401, reason: infrav1.InsufficientHostMemoryReason,
			message: "memoryMiB 23401 MiB exceeds the libvirt host's total memory 22.9 GiB", terminal: true, wantAnError: true},
		{name: "a TiB", memoryMiB: 1 << 20, reason: infrav1.InsufficientHostMemoryReason,
			message: "memoryMiB 1048576 MiB exceeds the libvirt host's total memory 22.9 GiB", terminal: true, wantAnError: true},
		{name: "host memory unreadable", memoryMiB: 512, hostErr: errors.New("connection reset"),
			reason: infrav1.LibvirtErrorReason, message: "connection reset", wantAnError: true},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			host := fakehost.New()
			host.MemoryBytes = hostBytes
			if tc.hostErr != nil {
				host.Errs["HostMemory"] = tc.hostErr
			}
			v := newVM(host, tc.memoryMiB)
			svc := domain.New(v.VM, host, v.parts(), domain.Options{})
			// The second reconcile is the controller's retry: it must not
			// define the domain either.
			for attempt := range 2 {
				err := v.reconcile(svc)
				if (err != nil) != tc.wantAnError {
					t.Fatalf("attempt %d: Reconcile() = %v, want an error: %v", attempt, err, tc.wantAnError)
				}
				te, isTerminal := services.AsTerminal(err)
				if isTerminal != tc.terminal {
					t.Fatalf("attempt %d: Reconcile() = %v, terminal %v, want %v", attempt, err, isTerminal, tc.terminal)
				}
				if isTerminal && (te.FailureReason != scope.FailureReasonCreate || !strings.Contains(te.Message, tc.message)) {
					t.Errorf("attempt %d: terminal failure %+v, want %s with %q", attempt, te, scope.FailureReasonCreate, tc.message)
				}
				c := v.conditions[infrav1.DomainReadyCondition]
				if c.reason != tc.reason || !strings.Contains(c.message, tc.message) || c.status != tc.defined {
					t.Errorf("attempt %d: DomainReady = %+v, want reason %s with %q", attempt, c, tc.reason, tc.message)
				}
				_, exists := host.Domains[v.Domain]
				if exists != tc.defined || host.Called("EnsureDomain") != tc.defined {
					t.Fatalf("attempt %d: domain exists %v, EnsureDomain called %v; want both %v", attempt, exists, host.Called("EnsureDomain"), tc.defined)
				}
				if tc.defined && v.State != "running" {
					t.Errorf("attempt %d: domain state %q, want running", attempt, v.State)
				}
			}
			if err := svc.Delete(context.Background()); err != nil {
				t.Fatalf("Delete() = %v", err)
			}
			if len(host.Domains) != 0 {
				t.Errorf("domains left after Delete: %v", host.Domains)
			}
			if _, ok := host.Volumes["pool/"+v.ConsoleLogVolume()]; ok {
				t.Error("the console log outlived the machine")
			}
		})
	}
}

// TestDomainLogsConsoleToAPoolVolume: the serial console goes to a volume
// of the machine's pool, made before the domain, so that the log (kubeadm's
// output) is found and removed with the machine on any host.
func TestDomainLogsConsoleToAPoolVolume(t *testing.T) {
	host := fakehost.New()
	v := newVM(host, 512)
	if err := v.reconcile(domain.New(v.VM, host, v.parts(), domain.Options{})); err != nil {
		t.Fatal(err)
	}
	log, ok := host.Volumes["pool/"+v.ConsoleLogVolume()]
	if !ok {
		t.Fatal("no console log volume")
	}
	if got := host.Specs[v.Domain].ConsoleLogPath; got != log.Path {
		t.Errorf("console logged to %q, want the volume %q", got, log.Path)
	}
}

// TestDomainSteadyStateAsksOnce pins the libvirt calls of a reconcile
// that finds its domain running: one DomainInfo and nothing else; host
// memory is only read before defining.
func TestDomainSteadyStateAsksOnce(t *testing.T) {
	host := fakehost.New()
	v := newVM(host, 512)
	svc := domain.New(v.VM, host, v.parts(), domain.Options{})
	if err := v.reconcile(svc); err != nil {
		t.Fatal(err)
	}
	host.Calls = nil
	if err := v.reconcile(svc); err != nil {
		t.Fatal(err)
	}
	if got := strings.Join(host.Calls, ","); got != "DomainInfo" {
		t.Errorf("steady-state calls = %s, want DomainInfo", got)
	}
}

// TestDomainFiltersSharedSegments: a NIC on a host bridge or on a libvirt
// network the provider did not make for the cluster gets the operator's
// filter; one on the cluster's own network does not.
func TestDomainFiltersSharedSegments(t *testing.T) {
	for _, tc := range []struct {
		name    string
		network scope.NetworkRef
		filter  string
		want    string
	}{
		{"the cluster's own network", scope.NetworkRef{Name: naming.ClusterNetworkName("ns", "prod")}, virt.CleanTrafficFilter, ""},
		{"an operator's network", scope.NetworkRef{Name: "default"}, virt.CleanTrafficFilter, virt.CleanTrafficFilter},
		{"a host bridge", scope.NetworkRef{Bridge: "br0"}, virt.CleanTrafficFilter, virt.CleanTrafficFilter},
		{"a host bridge, filter turned off", scope.NetworkRef{Bridge: "br0"}, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := fakehost.New()
			v := newVM(host, 512)
			v.Network = tc.network
			err := services.Plan{{Service: domain.New(v.VM, host, v.parts(), domain.Options{TrafficFilter: tc.filter}), Condition: infrav1.DomainReadyCondition}}.
				Run(context.Background(), v, false)
			if err != nil {
				t.Fatal(err)
			}
			if got := host.Specs[v.Domain].TrafficFilter; got != tc.want {
				t.Errorf("filter %q, want %q", got, tc.want)
			}
		})
	}
}

// TestDomainGetsTheCustomCPU: the model and features of cpuMode custom
// reach the domain definition.
func TestDomainGetsTheCustomCPU(t *testing.T) {
	host := fakehost.New()
	v := newVM(host, 512)
	v.Hardware.CPUMode, v.Hardware.CPUModel, v.Hardware.CPUFeatures = infrav1.CPUModeCustom, "Nehalem", []string{"aes"}
	plan := services.Plan{{Service: domain.New(v.VM, host, v.parts(), domain.Options{}), Condition: infrav1.DomainReadyCondition}}
	if err := plan.Run(context.Background(), v, false); err != nil {
		t.Fatal(err)
	}
	spec := host.Specs[v.Domain]
	if spec.CPUMode != virt.CPUModeCustom || spec.CPUModel != "Nehalem" || strings.Join(spec.CPUFeatures, ",") != "aes" {
		t.Errorf("domain CPU %q %q %v, want custom Nehalem [aes]", spec.CPUMode, spec.CPUModel, spec.CPUFeatures)
	}
}

// TestDomainFoundByIdentityNotReadAgain: the domain the identity step of
// the same reconcile found is used as it is (one libvirt read per
// reconcile of a running VM); without it the step reads the domain.
func TestDomainFoundByIdentityNotReadAgain(t *testing.T) {
	for _, tc := range []struct {
		name     string
		found    bool
		wantRead bool
	}{
		{name: "found by the identity step", found: true},
		{name: "not looked up by the identity step", wantRead: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			host := fakehost.New()
			v := newVM(host, 512)
			running := virt.DomainInfo{Name: v.Domain, UUID: v.UUID, State: "running", VCPUs: 1, MemoryMiB: 512}
			host.Domains[v.Domain] = running
			parts := v.parts()
			parts.Found = func() *virt.DomainInfo {
				if tc.found {
					return &running
				}
				return nil
			}
			host.Calls = nil
			if err := v.reconcile(domain.New(v.VM, host, parts, domain.Options{})); err != nil {
				t.Fatal(err)
			}
			if got := host.Called("DomainInfo"); got != tc.wantRead {
				t.Errorf("DomainInfo read: %v, want %v (calls %v)", got, tc.wantRead, host.Calls)
			}
			if c := v.conditions[infrav1.DomainReadyCondition]; !c.status {
				t.Errorf("DomainReady %+v, want True", c)
			}
		})
	}
}
