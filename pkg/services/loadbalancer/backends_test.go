package loadbalancer

import (
	"context"
	"errors"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/client-go/tools/record"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/scope"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/services"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// noHost is a virt.Host that must not be called.
type noHost struct{ virt.Host }

func fakeClient(t *testing.T, objs ...client.Object) client.Client {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := errors.Join(clusterv1.AddToScheme(scheme), infrav1.AddToScheme(scheme)); err != nil {
		t.Fatal(err)
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
}

// cpMachine returns a Machine of cluster c and its LibvirtMachine with
// address (none when empty); controlPlane labels the Machine.
func cpMachine(name, address string, controlPlane, deleting bool) (*clusterv1.Machine, *infrav1.LibvirtMachine) {
	labels := map[string]string{clusterv1.ClusterNameLabel: "c"}
	if controlPlane {
		labels[clusterv1.MachineControlPlaneLabel] = ""
	}
	m := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name, Labels: labels}}
	m.Spec.ClusterName = "c"
	m.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachine", Name: name + "-infra"}
	if deleting {
		m.DeletionTimestamp = &metav1.Time{Time: time.Now()}
		m.Finalizers = []string{"test"}
	}
	lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name + "-infra", Labels: labels}}
	if address != "" {
		lm.Status.Addresses = []clusterv1.MachineAddress{
			{Type: clusterv1.MachineHostName, Address: name},
			{Type: clusterv1.MachineInternalIP, Address: address},
		}
	}
	return m, lm
}

func TestDesiredBackends(t *testing.T) {
	var objs []client.Object
	for _, m := range []struct {
		name, address    string
		cp, deleting     bool
		withoutInfraMach bool
	}{
		{name: "cp-b", address: "10.0.0.2", cp: true},
		{name: "cp-a", address: "10.0.0.1", cp: true, deleting: true},
		{name: "cp-noaddr", cp: true},
		{name: "worker", address: "10.0.0.9"},
		{name: "cp-gone", address: "10.0.0.3", cp: true, withoutInfraMach: true},
	} {
		machine, lm := cpMachine(m.name, m.address, m.cp, m.deleting)
		objs = append(objs, machine)
		if !m.withoutInfraMach {
			objs = append(objs, lm)
		}
	}
	lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-infra", Labels: map[string]string{clusterv1.ClusterNameLabel: "c"}}}
	s, err := scope.NewClusterScope(scope.ClusterScopeParams{Client: fakeClient(t, append(objs, lc)...), LibvirtCluster: lc, Host: noHost{}})
	if err != nil {
		t.Fatal(err)
	}
	got, err := DesiredBackends(context.Background(), s)
	if err != nil {
		t.Fatal(err)
	}
	want := []infrav1.LoadBalancerBackend{
		backend("cp-a", "10.0.0.1", infrav1.BackendDraining),
		backend("cp-b", "10.0.0.2", infrav1.BackendActive),
	}
	if len(got) != len(want) {
		t.Fatalf("got %v, want %v", got, want)
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("backend %d = %v, want %v", i, got[i], want[i])
		}
	}
}

func TestDeregisterMachine(t *testing.T) {
	tests := []struct {
		name        string
		backends    []infrav1.LoadBalancerBackend
		lbNotReady  bool
		neverLoaded bool
		typeNone    bool
		clusterGone bool
		deletedAgo  time.Duration
		wantRequeue bool
	}{{
		name:        "active with another active backend: wait for the drain",
		backends:    []infrav1.LoadBalancerBackend{backend("cp-0", "10.0.0.1", infrav1.BackendActive), backend("cp-1", "10.0.0.2", infrav1.BackendActive)},
		wantRequeue: true,
	}, {
		name:     "drained",
		backends: []infrav1.LoadBalancerBackend{backend("cp-0", "10.0.0.1", infrav1.BackendDraining), backend("cp-1", "10.0.0.2", infrav1.BackendActive)},
	}, {
		name:     "no backend (never had an address, or removed)",
		backends: []infrav1.LoadBalancerBackend{backend("cp-1", "10.0.0.2", infrav1.BackendActive)},
	}, {
		name:     "the last API server: nothing to drain to",
		backends: []infrav1.LoadBalancerBackend{backend("cp-0", "10.0.0.1", infrav1.BackendActive), backend("cp-1", "10.0.0.2", infrav1.BackendDraining)},
	}, {
		name:       "the load balancer does not serve: not waited for",
		backends:   []infrav1.LoadBalancerBackend{backend("cp-0", "10.0.0.1", infrav1.BackendActive), backend("cp-1", "10.0.0.2", infrav1.BackendActive)},
		lbNotReady: true,
	}, {
		name:        "no configuration of ours loaded yet: not waited for",
		backends:    []infrav1.LoadBalancerBackend{backend("cp-0", "10.0.0.1", infrav1.BackendActive), backend("cp-1", "10.0.0.2", infrav1.BackendActive)},
		neverLoaded: true,
	}, {
		name:     "type None",
		backends: []infrav1.LoadBalancerBackend{backend("cp-0", "10.0.0.1", infrav1.BackendActive), backend("cp-1", "10.0.0.2", infrav1.BackendActive)},
		typeNone: true,
	}, {
		name:        "the whole cluster is being deleted: nobody to spare",
		backends:    []infrav1.LoadBalancerBackend{backend("cp-0", "10.0.0.1", infrav1.BackendActive), backend("cp-1", "10.0.0.2", infrav1.BackendActive)},
		clusterGone: true,
	}, {
		name:       "waited too long",
		backends:   []infrav1.LoadBalancerBackend{backend("cp-0", "10.0.0.1", infrav1.BackendActive), backend("cp-1", "10.0.0.2", infrav1.BackendActive)},
		deletedAgo: DefaultDrainTimeout + time.Second,
	}}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m, lm := cpMachine("cp-0", "10.0.0.1", true, true)
			lm.DeletionTimestamp = &metav1.Time{Time: time.Now().Add(-tt.deletedAgo)}
			lm.Finalizers = []string{infrav1.MachineFinalizer}
			lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c-infra"}}
			lc.Status.LoadBalancer = &infrav1.LoadBalancerStatus{Backends: tt.backends, ConfigHash: "cfg-1"}
			if tt.lbNotReady {
				lc.Status.LoadBalancer.NotServingSince = &metav1.Time{Time: time.Now().Add(-time.Minute)}
			}
			if tt.neverLoaded {
				lc.Status.LoadBalancer.ConfigHash = ""
			}
			if tt.typeNone {
				lc.Spec.LoadBalancer.Type = infrav1.LoadBalancerNone
			}
			cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: "c"}}
			if tt.clusterGone {
				cluster.DeletionTimestamp = &metav1.Time{Time: time.Now()}
				cluster.Finalizers = []string{clusterv1.ClusterFinalizer}
			}
			rec := record.NewFakeRecorder(10)
			s, err := scope.NewMachineScope(scope.MachineScopeParams{
				Client: fakeClient(t, m, lm, lc), Machine: m, LibvirtMachine: lm, LibvirtCluster: lc, Cluster: cluster, Host: noHost{}, Recorder: rec,
			})
			if err != nil {
				t.Fatal(err)
			}
			err = (&Deregisterer{}).DeregisterMachine(context.Background(), s)
			if _, ok := services.AsRequeue(err); ok != tt.wantRequeue || (!ok && err != nil) {
				t.Errorf("err = %v, want requeue %v", err, tt.wantRequeue)
			}
			if tt.deletedAgo > 0 && len(rec.Events) == 0 {
				t.Error("no event on giving up the wait")
			}
		})
	}
}
