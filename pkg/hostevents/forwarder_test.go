package hostevents

import (
	"context"
	"slices"
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

func TestForwarder(t *testing.T) {
	cluster := func(name, watch string) *infrav1.LibvirtCluster {
		lc := &infrav1.LibvirtCluster{ObjectMeta: metav1.ObjectMeta{Namespace: "ns", Name: name}}
		if watch != "" {
			lc.Labels = map[string]string{clusterv1.WatchLabel: watch}
		}
		return lc
	}
	owner := func(kind, name string) *virt.Owner { return &virt.Owner{Kind: kind, Namespace: "ns", Name: name} }
	objs := []client.Object{cluster("a", ""), cluster("b", ""), cluster("mine", "me")}
	tests := []struct {
		name   string
		filter string
		event  virt.Event
		want   []string
	}{
		{name: "reconnect: every object", event: virt.Event{Kind: virt.EventReconnected}, want: []string{"a", "b", "mine"}},
		{name: "reconnect with a watch filter", filter: "me", event: virt.Event{Kind: virt.EventReconnected}, want: []string{"mine"}},
		{name: "domain of an owner of the kind", event: virt.Event{Kind: virt.EventDomainStopped, Owner: owner("LibvirtCluster", "b")}, want: []string{"b"}},
		{name: "owner filtered out", filter: "me", event: virt.Event{Kind: virt.EventDomainStopped, Owner: owner("LibvirtCluster", "b")}},
		{name: "owner of another kind", event: virt.Event{Kind: virt.EventDomainStopped, Owner: owner("LibvirtMachine", "b")}},
		{name: "owner gone", event: virt.Event{Kind: virt.EventAgentConnected, Owner: owner("LibvirtCluster", "gone")}},
		{name: "domain without owner", event: virt.Event{Kind: virt.EventDomainStarted}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			scheme := runtime.NewScheme()
			if err := infrav1.AddToScheme(scheme); err != nil {
				t.Fatal(err)
			}
			c := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).Build()
			f := NewForwarder(nil, c, "LibvirtCluster", tt.filter,
				func() *infrav1.LibvirtCluster { return &infrav1.LibvirtCluster{} },
				func() client.ObjectList { return &infrav1.LibvirtClusterList{} })
			f.Forward(context.Background(), tt.event)
			var got []string
			for len(f.events) > 0 {
				got = append(got, (<-f.events).Object.GetName())
			}
			slices.Sort(got)
			if !slices.Equal(got, tt.want) {
				t.Errorf("enqueued %v, want %v", got, tt.want)
			}
		})
	}
}
