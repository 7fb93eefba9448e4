package plane

import (
	"context"
	"log"
	"slices"
	"time"

	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	clusterctlv1 "sigs.k8s.io/cluster-api/cmd/clusterctl/api/v1alpha3"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// MovedObject is a LibvirtCluster or LibvirtMachine that `clusterctl move`
// took to another management cluster: its libvirt objects now belong to
// that cluster's provider. clusterctl moves a whole namespace, and the
// other provider goes on to make machines there whose names the plane
// never saw, so Down leaves the namespace alone (Scope.handedOver).
type MovedObject struct {
	// Kind is LibvirtCluster or LibvirtMachine.
	Kind string `json:"kind"`
	// Namespace and Name are the object's, the same on both sides.
	Namespace string `json:"namespace"`
	Name      string `json:"name"`
	// Since is when the plane saw it leave; a list of live objects taken
	// before that may still show it and does not bring it back.
	Since time.Time `json:"since"`
}

// same tells whether m and o name the same object.
func (m MovedObject) same(o MovedObject) bool {
	return m.Kind == o.Kind && m.Namespace == o.Namespace && m.Name == o.Name
}

const (
	kindLibvirtCluster = "LibvirtCluster"
	kindLibvirtMachine = "LibvirtMachine"
	// watchRetryDelay is how long watchMoves waits before watching again
	// after its watch ended or failed.
	watchRetryDelay = 2 * time.Second
)

// watchMoves records in dir's scope.json every LibvirtCluster and
// LibvirtMachine that leaves the plane through `clusterctl move` until ctx
// ends. clusterctl marks each source object with the delete-for-move
// annotation, deletes it and strips its finalizers in one go, so only a
// watch sees it (a poll would miss it); the watch's final state of a
// deleted object carries the annotation.
func watchMoves(ctx context.Context, c client.WithWatch, dir string) {
	go watchMovesOf(ctx, c, &infrav1.LibvirtClusterList{}, kindLibvirtCluster, dir)
	watchMovesOf(ctx, c, &infrav1.LibvirtMachineList{}, kindLibvirtMachine, dir)
}

// watchMovesOf is watchMoves for one kind; it watches again whenever the
// API server ends the watch.
func watchMovesOf(ctx context.Context, c client.WithWatch, list client.ObjectList, kind, dir string) {
	for ctx.Err() == nil {
		w, err := c.Watch(ctx, list)
		if err != nil {
			if ctx.Err() == nil {
				log.Printf("watching %ss for clusterctl move: %v", kind, err)
			}
		} else {
			for ev := range w.ResultChan() {
				obj, ok := ev.Object.(client.Object)
				if !ok || ev.Type != watch.Deleted {
					continue
				}
				if _, moved := obj.GetAnnotations()[clusterctlv1.DeleteForMoveAnnotation]; !moved {
					continue
				}
				m := MovedObject{Kind: kind, Namespace: obj.GetNamespace(), Name: obj.GetName(), Since: time.Now()}
				if err := recordMovedAway(dir, m); err != nil {
					log.Printf("recording %s %s/%s as moved away: %v", kind, m.Namespace, m.Name, err)
					continue
				}
				log.Printf("%s %s/%s left by clusterctl move: down will leave its libvirt objects to the new management cluster", kind, m.Namespace, m.Name)
			}
			w.Stop()
		}
		select {
		case <-ctx.Done():
		case <-time.After(watchRetryDelay):
		}
	}
}

// recordMovedAway adds m to dir's scope.json.
func recordMovedAway(dir string, m MovedObject) error {
	return updateScope(dir, func(s *Scope) bool {
		if slices.ContainsFunc(s.MovedAway, m.same) {
			return false
		}
		s.MovedAway = append(s.MovedAway, m)
		return true
	})
}
