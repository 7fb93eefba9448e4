// Package servicetest is the fixture the services' tests share: a
// LibvirtMachine with its Machine, Cluster, LibvirtCluster and bootstrap
// Secret in a fake client, over a fake libvirt host.
package servicetest

import (
	"context"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"k8s.io/client-go/tools/record"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/fakehost"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/imageimport"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/ipaddress"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/seed"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services/vmplan"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// SecretMarker is in the bootstrap data: no condition or event may
// contain it (NoLeaks).
const SecretMarker = "s3cr3t-bootstrap-token-do-not-leak"

// Fixture is a LibvirtMachine ready to be provisioned: cluster
// infrastructure provisioned, bootstrap data set, base image in the pool.
type Fixture struct {
	T        *testing.T
	Client   client.Client
	Host     *fakehost.Host
	Recorder *record.FakeRecorder
	LM       *infrav1.LibvirtMachine
	Machine  *clusterv1.Machine
	LC       *infrav1.LibvirtCluster
	Cluster  *clusterv1.Cluster
	Secret   *corev1.Secret
	// Policy is the operator's policy the plan runs under (Plan).
	Policy tenancy.Policy
}

// DomainUUID is the fixture machine's domain UUID (spec.providerID).
const DomainUUID = "5f0c2a7e-3b1d-4e8a-9c6f-1a2b3c4d5e6f"

// NewFixture returns the objects; Scope stores them in a fake client.
func NewFixture(t *testing.T) *Fixture {
	t.Helper()
	f := &Fixture{T: t, Host: fakehost.New(), Recorder: record.NewFakeRecorder(100)}
	f.Cluster = &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	f.Cluster.Status.Initialization.InfrastructureProvisioned = ptr.To(true)
	f.LC = &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
	f.LC.Spec.StoragePool = infrav1.StoragePool{Name: "pool", Path: "/pools/pool"}
	f.LC.Status.Network = &infrav1.NetworkStatus{Name: "net"}
	f.Machine = &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m0"}}
	f.Machine.Spec.ClusterName = "c"
	f.Machine.Spec.Bootstrap.DataSecretName = ptr.To("m0-bootstrap")
	f.Machine.Spec.FailureDomain = "fd1"
	f.LM = &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m0", UID: types.UID("0b9d6c86-1111-4e2e-9c55-3b6f1b0d7a11")}}
	f.LM.Spec.Image.Volume = &infrav1.VolumeReference{Name: "base"}
	f.LM.Spec.CPUs, f.LM.Spec.MemoryMiB = 1, 512
	// The identity step ran: the domain's UUID is chosen.
	f.LM.Spec.ProviderID = infrav1.ProviderIDPrefix + DomainUUID
	f.Secret = &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "m0-bootstrap"},
		Data: map[string][]byte{"value": []byte("#cloud-config\n# " + SecretMarker + "\n"), "format": []byte("cloud-config")}}
	f.Host.Volumes["pool/base"] = virt.VolumeInfo{Pool: "pool", Name: "base", Path: "/pools/pool/base", CapacityBytes: 2 << 30, Format: "qcow2"}
	return f
}

// Scope returns a fresh scope of the machine, storing the objects on the
// first call.
func (f *Fixture) Scope() *scope.MachineScope {
	f.T.Helper()
	scheme, err := manager.NewScheme()
	if err != nil {
		f.T.Fatal(err)
	}
	if f.Client == nil {
		f.Client = fake.NewClientBuilder().WithScheme(scheme).
			WithObjects(f.LM, f.Machine, f.Cluster, f.LC, f.Secret).
			WithStatusSubresource(&infrav1.LibvirtMachine{}).Build()
		// The fake client filled in resourceVersion; reread for patching.
		if err := f.Client.Get(context.Background(), client.ObjectKeyFromObject(f.LM), f.LM); err != nil {
			f.T.Fatal(err)
		}
	}
	s, err := scope.NewMachineScope(scope.MachineScopeParams{
		Client: f.Client, Cluster: f.Cluster, Machine: f.Machine, LibvirtCluster: f.LC,
		LibvirtMachine: f.LM, Host: f.Host, HostName: "host1", Recorder: f.Recorder,
	})
	if err != nil {
		f.T.Fatal(err)
	}
	return s
}

// Stored is the LibvirtMachine as the fake client stores it.
func (f *Fixture) Stored() *infrav1.LibvirtMachine {
	f.T.Helper()
	got := &infrav1.LibvirtMachine{}
	if err := f.Client.Get(context.Background(), client.ObjectKeyFromObject(f.LM), got); err != nil {
		f.T.Fatal(err)
	}
	return got
}

// Reconcile runs svc as its plan step does: its outcome sets condType on s.
func Reconcile(s *scope.MachineScope, condType string, svc services.Service) error {
	return services.Plan{{Service: svc, Condition: condType}}.Run(context.Background(), s, false)
}

// WantCondition fails unless lm's condType has status and reason.
func WantCondition(t *testing.T, lm *infrav1.LibvirtMachine, condType string, status metav1.ConditionStatus, reason string) *metav1.Condition {
	t.Helper()
	c := conditions.Get(lm, condType)
	if c == nil || c.Status != status || c.Reason != reason {
		t.Fatalf("%s = %+v, want %s/%s", condType, c, status, reason)
	}
	return c
}

// NoLeaks fails when the secret marker appears in a condition or event.
func (f *Fixture) NoLeaks() {
	f.T.Helper()
	for _, c := range f.LM.Status.Conditions {
		if strings.Contains(c.Message, SecretMarker) {
			f.T.Errorf("condition %s leaks bootstrap data: %q", c.Type, c.Message)
		}
	}
	for {
		select {
		case ev := <-f.Recorder.Events:
			if strings.Contains(ev, SecretMarker) {
				f.T.Errorf("event leaks bootstrap data: %q", ev)
			}
		default:
			return
		}
	}
}

// SyncImporter imports in the caller, at once: the disk service's handling
// of an import's outcome without the importer's goroutines.
type SyncImporter struct {
	Host     virt.Host
	Released []imageimport.Waiter
}

// Ensure imports the image now.
func (i *SyncImporter) Ensure(k imageimport.Key, _ imageimport.Waiter) imageimport.Status {
	info, err := i.Host.ImportImage(context.Background(), virt.ImageImport{Pool: k.Pool, Volume: k.Volume, Source: k.Source, SHA256: k.SHA256})
	if err != nil {
		return imageimport.Status{Phase: imageimport.Failed, Attempt: 1, Err: err, RetryAt: time.Now().Add(time.Minute)}
	}
	return imageimport.Status{Phase: imageimport.Done, Attempt: 1, Volume: info}
}

// Release records the waiter released.
func (i *SyncImporter) Release(w imageimport.Waiter) { i.Released = append(i.Released, w) }

// Want records nothing: no collector runs beside it.
func (*SyncImporter) Want(virt.StorageHost, string, string) {}

// Plan is the fixture machine's VM plan, wired as the machine reconciler
// wires it (vmplan), under the fixture's Policy.
func (f *Fixture) Plan(s *scope.MachineScope) *vmplan.Plan {
	return vmplan.New(vmplan.Spec{
		VM: s.VM, Host: f.Host, Owner: s, Policy: f.Policy,
		Claims: ipaddress.New(s, f.Host, f.Policy), Seed: seed.New(s, f.Host),
		Images: &SyncImporter{Host: f.Host},
	})
}

// Provision runs the address, disk and seed steps of the machine's VM
// plan, so that its domain step (the plan's Domain) can define the
// domain.
func Provision(t *testing.T, f *Fixture) (*scope.MachineScope, *vmplan.Plan) {
	t.Helper()
	s := f.Scope()
	p := f.Plan(s)
	for _, st := range []services.Step{
		{Service: p.Address, Condition: infrav1.AddressReservedCondition},
		{Service: p.Disk, Condition: infrav1.DiskReadyCondition},
		{Service: p.Seed, Condition: infrav1.BootstrapDataReadyCondition},
	} {
		if err := Reconcile(s, st.Condition, st.Service); err != nil {
			t.Fatal(err)
		}
	}
	return s, p
}
