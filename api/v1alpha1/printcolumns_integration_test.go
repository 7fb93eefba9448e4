package v1alpha1_test

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/rest"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// TestPrinterColumns reads objects with a status as `kubectl get` does,
// through the API server's Table, and checks the columns a user reads
// first: a machine's Ready, Provisioned, Host, Address and Age, a
// cluster's Ready, Endpoint and Network, a machine template's capacity.
func TestPrinterColumns(t *testing.T) {
	requireEnv(t)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	ready := []metav1.Condition{{Type: clusterv1.ReadyCondition, Status: metav1.ConditionTrue, Reason: infrav1.ReadyReason,
		LastTransitionTime: metav1.Now()}}

	lm := validMachine("printcolumns")
	lm.Labels = map[string]string{clusterv1.ClusterNameLabel: "demo"}
	lm.Status = infrav1.LibvirtMachineStatus{
		Conditions:     ready,
		Initialization: infrav1.Initialization{Provisioned: ptr.To(true)},
		Ready:          true,
		Addresses:      []clusterv1.MachineAddress{{Type: clusterv1.MachineInternalIP, Address: "192.168.150.10"}},
		Domain:         &infrav1.DomainStatus{Name: "capl-default-printcolumns", State: "running", Host: "kvm1.example"},
	}
	roundTrip(ctx, t, lm, &infrav1.LibvirtMachine{}, true)

	lc := validCluster("printcolumns")
	lc.Spec.ControlPlaneEndpoint = clusterv1.APIEndpoint{Host: "192.168.150.2", Port: 6443}
	lc.Status = infrav1.LibvirtClusterStatus{
		Conditions:     ready,
		Initialization: infrav1.Initialization{Provisioned: ptr.To(true)},
		Network:        &infrav1.NetworkStatus{Name: "capl-default-printcolumns", CIDR: "192.168.150.0/24"},
	}
	roundTrip(ctx, t, lc, &infrav1.LibvirtCluster{}, true)

	lmt := &infrav1.LibvirtMachineTemplate{
		ObjectMeta: metav1.ObjectMeta{Name: "printcolumns", Namespace: namespace},
		Spec:       infrav1.LibvirtMachineTemplateSpec{Template: infrav1.LibvirtMachineTemplateResource{Spec: validMachine("").Spec}},
		Status: infrav1.LibvirtMachineTemplateStatus{Capacity: corev1.ResourceList{
			corev1.ResourceCPU: resource.MustParse("2"), corev1.ResourceMemory: resource.MustParse("1Gi"),
		}},
	}
	roundTrip(ctx, t, lmt, &infrav1.LibvirtMachineTemplate{}, true)

	for _, tc := range []struct {
		resource string
		want     map[string]any // a column shown by default → its value
	}{
		{"libvirtmachines", map[string]any{"Cluster": "demo", "Ready": "True", "Provisioned": true, "Host": "kvm1.example",
			"State": "running", "Address": "192.168.150.10"}},
		{"libvirtclusters", map[string]any{"Ready": "True", "Provisioned": true, "Endpoint": "192.168.150.2",
			"Network": "capl-default-printcolumns"}},
		{"libvirtmachinetemplates", map[string]any{"CPU": "2", "Memory": "1Gi"}},
	} {
		t.Run(tc.resource, func(t *testing.T) {
			table := getTable(ctx, t, tc.resource, "printcolumns")
			if len(table.Rows) != 1 {
				t.Fatalf("%d rows", len(table.Rows))
			}
			shown := map[string]any{}
			for i, c := range table.ColumnDefinitions {
				if c.Priority == 0 {
					shown[c.Name] = table.Rows[0].Cells[i]
				}
			}
			for name, want := range tc.want {
				if got, ok := shown[name]; !ok || got != want {
					t.Errorf("column %s = %v (shown: %t), want %v", name, got, ok, want)
				}
			}
			if _, ok := shown["Age"]; !ok {
				t.Error("no Age column")
			}
			t.Logf("kubectl get %s:\n%s", tc.resource, formatTable(table))
		})
	}
}

// getTable reads one object as the API server's Table, which kubectl
// prints.
func getTable(ctx context.Context, t *testing.T, res, name string) *metav1.Table {
	t.Helper()
	hc, err := rest.HTTPClientFor(env.Config)
	if err != nil {
		t.Fatal(err)
	}
	url := fmt.Sprintf("%s/apis/%s/namespaces/%s/%s/%s", env.Config.Host, infrav1.GroupVersion, namespace, res, name)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	req.Header.Set("Accept", "application/json;as=Table;v=v1;g=meta.k8s.io")
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != http.StatusOK {
		t.Fatalf("GET %s: %d %v %s", url, resp.StatusCode, err, body)
	}
	table := &metav1.Table{}
	if err := json.Unmarshal(body, table); err != nil {
		t.Fatal(err)
	}
	return table
}

// formatTable prints the columns shown by default as kubectl does.
func formatTable(table *metav1.Table) string {
	var b strings.Builder
	w := tabwriter.NewWriter(&b, 0, 8, 3, ' ', 0)
	var header []string
	for _, c := range table.ColumnDefinitions {
		if c.Priority == 0 {
			header = append(header, strings.ToUpper(c.Name))
		}
	}
	fmt.Fprintln(w, strings.Join(header, "\t"))
	for _, row := range table.Rows {
		var cells []string
		for i, c := range table.ColumnDefinitions {
			if c.Priority == 0 {
				v := fmt.Sprint(row.Cells[i])
				if row.Cells[i] == nil {
					v = "<none>"
				}
				cells = append(cells, v)
			}
		}
		fmt.Fprintln(w, strings.Join(cells, "\t"))
	}
	_ = w.Flush()
	return b.String()
}
