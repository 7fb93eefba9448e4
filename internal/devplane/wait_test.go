package devplane

import (
	"testing"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"
)

// TestDesiredWorkers: a topology's replicas count as the Cluster has them,
// before the topology controller carried them to the MachineDeployment.
func TestDesiredWorkers(t *testing.T) {
	md := func(name, topologyName string, replicas *int32) clusterv1.MachineDeployment {
		m := clusterv1.MachineDeployment{ObjectMeta: metav1.ObjectMeta{Name: name}}
		if topologyName != "" {
			m.Labels = map[string]string{clusterv1.ClusterTopologyMachineDeploymentNameLabel: topologyName}
		}
		m.Spec.Replicas = replicas
		return m
	}
	topology := func(replicas *int32) *clusterv1.Cluster {
		cl := &clusterv1.Cluster{}
		cl.Spec.Topology.ClassRef.Name = "libvirt"
		cl.Spec.Topology.Workers.MachineDeployments = []clusterv1.MachineDeploymentTopology{{Class: "default-worker", Name: TopologyWorkers, Replicas: replicas}}
		return cl
	}
	tests := []struct {
		name string
		cl   *clusterv1.Cluster
		mds  []clusterv1.MachineDeployment
		want int
	}{
		{"plain cluster: the MachineDeployments' replicas", &clusterv1.Cluster{},
			[]clusterv1.MachineDeployment{md("demo-md-0", "", ptr.To[int32](2)), md("demo-md-1", "", ptr.To[int32](1))}, 3},
		{"plain cluster: a MachineDeployment without replicas counts none", &clusterv1.Cluster{},
			[]clusterv1.MachineDeployment{md("demo-md-0", "", nil)}, 0},
		{"topology scaled up, its MachineDeployment not yet", topology(ptr.To[int32](1)),
			[]clusterv1.MachineDeployment{md("cc-md-0-x7k2p", TopologyWorkers, ptr.To[int32](0))}, 1},
		{"topology scaled down, its MachineDeployment not yet", topology(ptr.To[int32](0)),
			[]clusterv1.MachineDeployment{md("cc-md-0-x7k2p", TopologyWorkers, ptr.To[int32](2))}, 0},
		{"topology whose MachineDeployment does not exist yet", topology(ptr.To[int32](2)), nil, 2},
		{"topology leaving replicas to the MachineDeployment (an autoscaler's)", topology(nil),
			[]clusterv1.MachineDeployment{md("cc-md-0-x7k2p", TopologyWorkers, ptr.To[int32](3))}, 3},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			if got := desiredWorkers(tc.cl, tc.mds); got != tc.want {
				t.Errorf("desiredWorkers = %d, want %d", got, tc.want)
			}
		})
	}
}
