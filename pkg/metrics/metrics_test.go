package metrics

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

func TestMachineState(t *testing.T) {
	now := metav1.Now()
	for _, tc := range []struct {
		name string
		lm   infrav1.LibvirtMachine
		want string
	}{
		{"new", infrav1.LibvirtMachine{}, MachinePending},
		{"provisioned", infrav1.LibvirtMachine{Status: infrav1.LibvirtMachineStatus{Initialization: infrav1.Initialization{Provisioned: ptr.To(true)}}}, MachineProvisioned},
		{"failed after provisioning", infrav1.LibvirtMachine{Status: infrav1.LibvirtMachineStatus{
			Initialization: infrav1.Initialization{Provisioned: ptr.To(true)}, FailureReason: ptr.To("UpdateError")}}, MachineFailed},
		{"deleted while failed", infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{DeletionTimestamp: &now},
			Status: infrav1.LibvirtMachineStatus{FailureMessage: ptr.To("gone")}}, MachineDeleting},
	} {
		if got := MachineState(&tc.lm); got != tc.want {
			t.Errorf("%s: state %s, want %s", tc.name, got, tc.want)
		}
	}
}

// TestMachineStatesCollected checks capl_machines against what a reader
// holds: every state of a namespace with machines, zeros included.
func TestMachineStatesCollected(t *testing.T) {
	scheme := runtime.NewScheme()
	if err := infrav1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	machine := func(ns, name string, provisioned bool) *infrav1.LibvirtMachine {
		lm := &infrav1.LibvirtMachine{ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name}}
		if provisioned {
			lm.Status.Initialization.Provisioned = ptr.To(true)
		}
		return lm
	}
	reader := fake.NewClientBuilder().WithScheme(scheme).WithObjects(
		machine("a", "m0", true), machine("a", "m1", true), machine("a", "m2", false), machine("b", "m0", false),
	).Build()
	want := `# HELP capl_machines LibvirtMachines by namespace and state (pending, provisioned, deleting, failed), as the manager's cache holds them when scraped.
# TYPE capl_machines gauge
capl_machines{namespace="a",state="deleting"} 0
capl_machines{namespace="a",state="failed"} 0
capl_machines{namespace="a",state="pending"} 1
capl_machines{namespace="a",state="provisioned"} 2
capl_machines{namespace="b",state="deleting"} 0
capl_machines{namespace="b",state="failed"} 0
capl_machines{namespace="b",state="pending"} 1
capl_machines{namespace="b",state="provisioned"} 0
`
	if err := testutil.CollectAndCompare(NewMachineStates(reader), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

func TestHostConnectionsCollected(t *testing.T) {
	conns := []HostConnection{
		{Host: "here", URI: "qemu:///system", Connected: true},
		{Host: "kvm2", URI: "qemu+ssh://kvm2/system", Credentials: "team-a/ssh", Connected: false},
	}
	want := `# HELP capl_libvirt_host_connected ` + hostConnectedHelp + `
# TYPE capl_libvirt_host_connected gauge
capl_libvirt_host_connected{credentials="",host="here",uri="qemu:///system"} 1
capl_libvirt_host_connected{credentials="team-a/ssh",host="kvm2",uri="qemu+ssh://kvm2/system"} 0
`
	if err := testutil.CollectAndCompare(NewHostConnections(func() []HostConnection { return conns }), strings.NewReader(want)); err != nil {
		t.Error(err)
	}
}

// TestServeRegistersWhileRunning checks that a manager's collectors are
// served while it runs and withdrawn when it stops, so that the next
// manager of the process serves its own.
func TestServeRegistersWhileRunning(t *testing.T) {
	reg := prometheus.NewRegistry()
	up := true
	serve := func() (context.CancelFunc, chan error) {
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() {
			done <- Serve{Registry: reg, Collectors: []prometheus.Collector{
				NewHostConnections(func() []HostConnection { return []HostConnection{{Host: "h", URI: "u", Connected: up}} }),
			}}.Start(ctx)
		}()
		return cancel, done
	}
	gathered := func() int {
		n, err := testutil.GatherAndCount(reg, "capl_libvirt_host_connected")
		if err != nil {
			t.Fatal(err)
		}
		return n
	}
	waitFor := func(want int) {
		t.Helper()
		for deadline := time.Now().Add(5 * time.Second); gathered() != want; time.Sleep(5 * time.Millisecond) {
			if time.Now().After(deadline) {
				t.Fatalf("gathered %d series, want %d", gathered(), want)
			}
		}
	}
	for range 2 { // a manager, then the next one
		stop, done := serve()
		waitFor(1)
		stop()
		if err := <-done; err != nil {
			t.Fatal(err)
		}
		waitFor(0)
	}
}

func TestRegisterTwice(t *testing.T) {
	reg := prometheus.NewRegistry()
	for range 2 {
		if err := Register(reg); err != nil {
			t.Fatal(err)
		}
	}
	ImageImportBytes.Add(0)
	if n, err := testutil.GatherAndCount(reg, "capl_image_import_bytes_total"); err != nil || n != 1 {
		t.Errorf("gathered %d series of capl_image_import_bytes_total, err %v", n, err)
	}
}
