package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"strings"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/yaml"

	controlplanev1 "sigs.k8s.io/cluster-api/api/controlplane/kubeadm/v1beta2"
	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// fixedStates answers every VM's state from a table, as libvirt would.
type fixedStates map[string]string

func (f fixedStates) state(d *infrav1.DomainStatus) string { return f[d.Name] }

var created = metav1.NewTime(time.Date(2026, 11, 29, 1, 0, 0, 0, time.UTC))

// testCluster is a cluster as the plane holds it: a LibvirtCluster with its
// HAProxy VM, a KubeadmControlPlane with one machine whose VM runs on host
// h1 and became node web-cp-1, a MachineDeployment with one machine whose
// LibvirtMachine does not exist yet.
func testCluster(t *testing.T) client.Client {
	t.Helper()
	scheme, err := manager.NewScheme()
	if err != nil {
		t.Fatal(err)
	}
	if err := controlplanev1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	inCluster := map[string]string{clusterv1.ClusterNameLabel: "web"}
	cpLabels := map[string]string{clusterv1.ClusterNameLabel: "web", clusterv1.MachineControlPlaneLabel: ""}
	mdLabels := map[string]string{clusterv1.ClusterNameLabel: "web", clusterv1.MachineDeploymentNameLabel: "web-md-0"}
	objs := []client.Object{
		&clusterv1.Cluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", CreationTimestamp: created},
			Spec: clusterv1.ClusterSpec{
				ControlPlaneEndpoint: clusterv1.APIEndpoint{Host: "192.168.150.2", Port: 6443},
				InfrastructureRef:    clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtCluster", Name: "web"},
				ControlPlaneRef:      clusterv1.ContractVersionedObjectReference{APIGroup: controlplanev1.GroupVersion.Group, Kind: "KubeadmControlPlane", Name: "web-cp"},
			},
			Status: clusterv1.ClusterStatus{
				Phase:        "Provisioned",
				Conditions:   []metav1.Condition{{Type: clusterv1.AvailableCondition, Status: metav1.ConditionTrue, Reason: "Available"}},
				ControlPlane: &clusterv1.ClusterControlPlaneStatus{ReadyReplicas: ptr.To[int32](1), DesiredReplicas: ptr.To[int32](1)},
				Workers:      &clusterv1.WorkersStatus{ReadyReplicas: ptr.To[int32](0), DesiredReplicas: ptr.To[int32](1)},
			},
		},
		&infrav1.LibvirtCluster{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web", Labels: inCluster},
			Status: infrav1.LibvirtClusterStatus{
				Initialization: infrav1.Initialization{Provisioned: ptr.To(true)},
				Network:        &infrav1.NetworkStatus{Name: "capl-default.web", Bridge: "virbr7", CIDR: "192.168.150.0/24"},
				LoadBalancer: &infrav1.LoadBalancerStatus{Address: "192.168.150.2",
					Domain: &infrav1.DomainStatus{Name: "capl-default.web-lb", UUID: "lb-uuid", Host: "h1"}},
			},
		},
		&controlplanev1.KubeadmControlPlane{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-cp", Labels: inCluster},
			Spec:       controlplanev1.KubeadmControlPlaneSpec{Replicas: ptr.To[int32](1), Version: "v1.36.3"},
			Status:     controlplanev1.KubeadmControlPlaneStatus{ReadyReplicas: ptr.To[int32](1)},
		},
		&clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-cp-abc", Labels: cpLabels},
			Spec: clusterv1.MachineSpec{ClusterName: "web", Version: "v1.36.3",
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachine", Name: "web-cp-abc"}},
			Status: clusterv1.MachineStatus{Phase: "Running", NodeRef: clusterv1.MachineNodeReference{Name: "web-cp-1"}},
		},
		&infrav1.LibvirtMachine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-cp-abc", Labels: cpLabels},
			Status: infrav1.LibvirtMachineStatus{
				Domain:    &infrav1.DomainStatus{Name: "capl-default.web-cp-abc", UUID: "cp-uuid", Host: "h1", State: "running"},
				Addresses: []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: "192.168.150.10"}},
			},
		},
		&clusterv1.MachineDeployment{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-md-0", Labels: inCluster},
			Spec:       clusterv1.MachineDeploymentSpec{ClusterName: "web", Replicas: ptr.To[int32](1)},
		},
		&clusterv1.Machine{
			ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "web-md-0-xyz", Labels: mdLabels},
			Spec: clusterv1.MachineSpec{ClusterName: "web",
				InfrastructureRef: clusterv1.ContractVersionedObjectReference{APIGroup: infrav1.GroupVersion.Group, Kind: "LibvirtMachine", Name: "web-md-0-xyz"}},
			Status: clusterv1.MachineStatus{Phase: "Pending"},
		},
	}
	return fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithStatusSubresource(objs...).Build()
}

var states = fixedStates{"capl-default.web-cp-abc": "running (booted)", "capl-default.web-lb": "running"}

// TestOutputFormatFlag: -o takes json and yaml and refuses anything else.
func TestOutputFormatFlag(t *testing.T) {
	var o outputFormat
	for _, ok := range []string{"json", "yaml", ""} {
		if err := o.Set(ok); err != nil || string(o) != ok {
			t.Errorf("-o %q: %v (%q)", ok, err, o)
		}
	}
	for _, bad := range []string{"table", "wide", "JSON", "xml"} {
		if err := o.Set(bad); err == nil {
			t.Errorf("-o %q accepted", bad)
		}
	}
}

// TestGetClustersOutput: the table, and the same rows as JSON and YAML.
func TestGetClustersOutput(t *testing.T) {
	c := testCluster(t)
	var list clusterv1.ClusterList
	if err := c.List(context.Background(), &list); err != nil {
		t.Fatal(err)
	}
	rows := clusterRows(list.Items)
	now := created.Add(90 * time.Minute)

	var table bytes.Buffer
	if err := printClusters(&table, outputText, rows, now); err != nil {
		t.Fatal(err)
	}
	want := `NAMESPACE   NAME   PHASE         CONTROL PLANE   WORKERS   ENDPOINT             AVAILABLE   AGE
default     web    Provisioned   1/1             0/1       192.168.150.2:6443   True        90m
`
	if table.String() != want {
		t.Errorf("table:\n%s\nwant\n%s", table.String(), want)
	}
	var none bytes.Buffer
	if err := printClusters(&none, outputText, clusterRows(nil), now); err != nil || none.String() != "No clusters found.\n" {
		t.Errorf("no clusters: %q %v", none.String(), err)
	}

	wantRow := map[string]any{
		"namespace": "default", "name": "web", "phase": "Provisioned",
		"controlPlane": map[string]any{"ready": float64(1), "desired": float64(1)},
		"workers":      map[string]any{"ready": float64(0), "desired": float64(1)},
		"endpoint":     "192.168.150.2:6443", "available": "True", "created": "2026-11-29T01:00:00Z",
	}
	for _, format := range []outputFormat{outputJSON, outputYAML} {
		var out bytes.Buffer
		if err := printClusters(&out, format, rows, now); err != nil {
			t.Fatal(err)
		}
		var got struct{ Clusters []map[string]any }
		if err := yaml.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("-o %s: %v\n%s", format, err, out.String())
		}
		if len(got.Clusters) != 1 || !equalJSON(got.Clusters[0], wantRow) {
			t.Errorf("-o %s:\n%s", format, out.String())
		}
		if format == outputJSON && !json.Valid(out.Bytes()) {
			t.Errorf("-o json is no JSON:\n%s", out.String())
		}
	}
	var empty bytes.Buffer
	if err := printClusters(&empty, outputJSON, clusterRows(nil), now); err != nil || strings.TrimSpace(empty.String()) != "{\n  \"clusters\": []\n}" {
		t.Errorf("-o json of none: %q %v", empty.String(), err)
	}
}

// TestGetNodesOutput: every VM of the cluster (the machine with a domain
// and the HAProxy VM; the machine without a LibvirtMachine has no VM yet)
// with its role, state from libvirt, host, addresses and node.
func TestGetNodesOutput(t *testing.T) {
	c := testCluster(t)
	vms, err := planeVMs(context.Background(), c, "default", "web")
	if err != nil {
		t.Fatal(err)
	}
	rows := nodeRows(vms, states)
	var table bytes.Buffer
	if err := printNodes(&table, outputText, rows); err != nil {
		t.Fatal(err)
	}
	want := `NAMESPACE   CLUSTER   ROLE            DOMAIN                    STATE              HOST   ADDRESS          NODE
default     web       control-plane   capl-default.web-cp-abc   running (booted)   h1     192.168.150.10   web-cp-1
default     web       load-balancer   capl-default.web-lb       running            h1     192.168.150.2    -
`
	if table.String() != want {
		t.Errorf("table:\n%s\nwant\n%s", table.String(), want)
	}
	for _, format := range []outputFormat{outputJSON, outputYAML} {
		var out bytes.Buffer
		if err := printNodes(&out, format, rows); err != nil {
			t.Fatal(err)
		}
		var got struct{ Nodes []nodeRow }
		if err := yaml.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("-o %s: %v\n%s", format, err, out.String())
		}
		wantRows := []nodeRow{
			{Namespace: "default", Cluster: "web", Role: "control-plane", Domain: "capl-default.web-cp-abc", State: "running (booted)",
				Host: "h1", UUID: "cp-uuid", Machine: "web-cp-abc", Node: "web-cp-1", Addresses: []string{"192.168.150.10"}},
			{Namespace: "default", Cluster: "web", Role: "load-balancer", Domain: "capl-default.web-lb", State: "running",
				Host: "h1", UUID: "lb-uuid", Addresses: []string{"192.168.150.2"}},
		}
		if !equalJSON(got.Nodes, wantRows) {
			t.Errorf("-o %s:\n%s", format, out.String())
		}
	}
	var none bytes.Buffer
	if err := printNodes(&none, outputText, nodeRows(nil, states)); err != nil || none.String() != "No VMs found.\n" {
		t.Errorf("no VMs: %q %v", none.String(), err)
	}
}

// TestStatusOutput: the tree as before, and the same objects as JSON and
// YAML with their conditions whole.
func TestStatusOutput(t *testing.T) {
	c := testCluster(t)
	cl := &clusterv1.Cluster{}
	if err := c.Get(context.Background(), client.ObjectKey{Namespace: "default", Name: "web"}, cl); err != nil {
		t.Fatal(err)
	}
	cs, err := readClusterStatus(context.Background(), c, cl, states)
	if err != nil {
		t.Fatal(err)
	}
	report := statusReport{
		Plane:    &planeStatus{StateDir: "/s", APIServer: "https://127.0.0.1:6443", ServePID: 10, ManagerPID: 11, LibvirtURI: "qemu:///system"},
		Clusters: []clusterStatus{cs},
	}
	var tree bytes.Buffer
	if err := printStatus(&tree, outputText, report); err != nil {
		t.Fatal(err)
	}
	want := `Plane /s: running (pid 10), API https://127.0.0.1:6443, manager pid 11, libvirt qemu:///system

Cluster default/web  Provisioned  endpoint 192.168.150.2:6443
│   conditions: Available True
├─LibvirtCluster web  provisioned=true
│     conditions: none yet
│     network capl-default.web (bridge virbr7, 192.168.150.0/24)
│     VM capl-default.web-lb: running, address 192.168.150.2
├─KubeadmControlPlane web-cp  1/1 ready, version v1.36.3
│ │   conditions: none yet
│ └─Machine web-cp-abc  Running  node web-cp-1  v1.36.3
│       conditions: none yet
│       LibvirtMachine web-cp-abc conditions: none yet
│       VM capl-default.web-cp-abc: running (booted), UUID cp-uuid, address 192.168.150.10
└─MachineDeployment web-md-0  0/1 ready
  │   conditions: none yet
  └─Machine web-md-0-xyz  Pending
        conditions: none yet
        LibvirtMachine web-md-0-xyz: not found yet
`
	if tree.String() != want {
		t.Errorf("tree:\n%s\nwant\n%s", tree.String(), want)
	}
	for _, format := range []outputFormat{outputJSON, outputYAML} {
		var out bytes.Buffer
		if err := printStatus(&out, format, report); err != nil {
			t.Fatal(err)
		}
		var got statusReport
		if err := yaml.Unmarshal(out.Bytes(), &got); err != nil {
			t.Fatalf("-o %s: %v\n%s", format, err, out.String())
		}
		if !equalJSON(got, report) {
			t.Errorf("-o %s does not round-trip:\n%s", format, out.String())
		}
		for _, s := range []string{"controlPlane", "machineDeployments", "libvirtMachine", "192.168.150.10", "web-cp-1", "Available"} {
			if !strings.Contains(out.String(), s) {
				t.Errorf("-o %s lacks %s:\n%s", format, s, out.String())
			}
		}
	}
}

// equalJSON compares two values by their JSON.
func equalJSON(a, b any) bool {
	x, err1 := json.Marshal(a)
	y, err2 := json.Marshal(b)
	return err1 == nil && err2 == nil && bytes.Equal(x, y)
}
