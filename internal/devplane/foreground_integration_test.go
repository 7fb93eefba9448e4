package devplane

import (
	"context"
	"testing"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterv1 "sigs.k8s.io/cluster-api/api/core/v1beta2"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testenv"
)

// TestForegroundDeletionCompletes deletes a Cluster with foreground
// propagation on a real API server, which then waits for a garbage
// collector: the Cluster must stay while a Machine names it as owner and go
// once the Machine is gone.
func TestForegroundDeletionCompletes(t *testing.T) {
	if testing.Short() {
		t.Skip("integration test")
	}
	env, err := testenv.Start()
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = env.Stop() }()
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	c := env.Client

	cluster := &clusterv1.Cluster{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fg"}}
	cluster.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "LibvirtCluster", Name: "fg"}
	must(t, c.Create(ctx, cluster))
	machine := &clusterv1.Machine{ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "fg-0",
		OwnerReferences: []metav1.OwnerReference{{APIVersion: clusterv1.GroupVersion.String(), Kind: "Cluster",
			Name: cluster.Name, UID: cluster.UID, BlockOwnerDeletion: ptr.To(true)}}}}
	machine.Spec.ClusterName = cluster.Name
	machine.Spec.Bootstrap.DataSecretName = ptr.To("fg-bootstrap")
	machine.Spec.InfrastructureRef = clusterv1.ContractVersionedObjectReference{APIGroup: "infrastructure.cluster.x-k8s.io", Kind: "LibvirtMachine", Name: "fg-0"}
	must(t, c.Create(ctx, machine))
	must(t, c.Delete(ctx, cluster, client.PropagationPolicy(metav1.DeletePropagationForeground)))

	// With its dependent Machine present, the Cluster stays.
	must(t, completeForegroundDeletions(ctx, c))
	got := &clusterv1.Cluster{}
	must(t, c.Get(ctx, client.ObjectKeyFromObject(cluster), got))
	if got.DeletionTimestamp == nil || len(got.Finalizers) != 1 || got.Finalizers[0] != foregroundFinalizer {
		t.Fatalf("Cluster after foreground delete: deletionTimestamp %v, finalizers %v", got.DeletionTimestamp, got.Finalizers)
	}
	// The Machine itself has no dependents and no finalizers: a plain
	// delete removes it; then the Cluster must go.
	must(t, c.Delete(ctx, machine))
	must(t, completeForegroundDeletions(ctx, c))
	if err := c.Get(ctx, client.ObjectKeyFromObject(cluster), got); !apierrors.IsNotFound(err) {
		t.Fatalf("Cluster still there after its dependent went: %v (finalizers %v)", err, got.Finalizers)
	}
}

func must(t *testing.T, err error) {
	t.Helper()
	if err != nil {
		t.Fatal(err)
	}
}
