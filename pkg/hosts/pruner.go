package hosts

import (
	"context"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
)

// Pruner is a manager Runnable that closes, every Interval, the
// connections to hosts no LibvirtCluster names any more, and all of them
// when the manager stops.
type Pruner struct {
	Set      *Set
	Clusters client.Reader
	Interval time.Duration
}

// Start prunes until ctx ends, then closes the Set.
func (p *Pruner) Start(ctx context.Context) error {
	defer func() { _ = p.Set.Close() }()
	if p.Interval <= 0 {
		<-ctx.Done()
		return nil
	}
	t := time.NewTicker(p.Interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			p.prune(ctx)
		}
	}
}

// NeedLeaderElection is false: every replica holds its own connections.
func (p *Pruner) NeedLeaderElection() bool { return false }

func (p *Pruner) prune(ctx context.Context) {
	list := &infrav1.LibvirtClusterList{}
	if err := p.Clusters.List(ctx, list); err != nil {
		ctrl.Log.WithName("hosts").Error(err, "Listing LibvirtClusters to close unused host connections")
		return
	}
	inUse := map[Ref]bool{}
	for i := range list.Items {
		for _, r := range ClusterRefs(&list.Items[i]) {
			inUse[r] = true
		}
	}
	p.Set.Prune(inUse)
}
