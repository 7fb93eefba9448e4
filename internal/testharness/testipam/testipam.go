// Package testipam plays a Cluster API IPAM provider in tests: the
// in-cluster IPAM provider's module is not served on this machine, so the
// integration and end-to-end tests fulfil IPAddressClaims with this
// minimal pool controller, from ranges the test gives. Its pools are of
// kind TestIPPool in group Group; no pool object needs to exist.
package testipam

import (
	"context"
	"net/netip"
	"sync"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/utils/ptr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	ipamv1 "sigs.k8s.io/cluster-api/api/ipam/v1beta2"
)

// Group and Kind are those of the pools a Controller serves.
const (
	Group = "ipam.test.capl.dev"
	Kind  = "TestIPPool"
)

// Range is one pool's range: the next address it hands out, the prefix
// length and the gateway of its network.
type Range struct {
	Next    netip.Addr
	Bits    int
	Gateway netip.Addr
}

// Controller gives every open claim of namespace Namespace on one of its
// pools the next address of the pool's range, as an IPAddress named after
// the claim, and deletes the IPAddress of a claim that is gone (envtest
// runs no garbage collector).
type Controller struct {
	Client    client.Client
	Namespace string
	// Pools maps a pool's name to its range.
	Pools map[string]*Range

	mu sync.Mutex
}

// Run syncs every 300 ms until ctx ends; logf reports failed syncs.
func (p *Controller) Run(ctx context.Context, logf func(format string, args ...any)) {
	tick := time.NewTicker(300 * time.Millisecond)
	defer tick.Stop()
	for {
		if err := p.Sync(ctx); err != nil && ctx.Err() == nil {
			logf("test IPAM pool: %v", err)
		}
		select {
		case <-ctx.Done():
			return
		case <-tick.C:
		}
	}
}

// Sync fulfils the open claims and removes the addresses of claims gone.
func (p *Controller) Sync(ctx context.Context) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	claims := &ipamv1.IPAddressClaimList{}
	if err := p.Client.List(ctx, claims, client.InNamespace(p.Namespace)); err != nil {
		return err
	}
	open := map[string]bool{}
	for i := range claims.Items {
		claim := &claims.Items[i]
		open[claim.Name] = true
		r := p.Pools[claim.Spec.PoolRef.Name]
		if claim.Spec.PoolRef.APIGroup != Group || r == nil || claim.Status.AddressRef.Name != "" || !claim.DeletionTimestamp.IsZero() {
			continue
		}
		ip := &ipamv1.IPAddress{ObjectMeta: metav1.ObjectMeta{Namespace: p.Namespace, Name: claim.Name},
			Spec: ipamv1.IPAddressSpec{ClaimRef: ipamv1.IPAddressClaimReference{Name: claim.Name}, PoolRef: claim.Spec.PoolRef,
				Address: r.Next.String(), Prefix: ptr.To(int32(r.Bits)), Gateway: r.Gateway.String()}}
		if err := p.Client.Create(ctx, ip); err != nil && !apierrors.IsAlreadyExists(err) {
			return err
		}
		r.Next = r.Next.Next()
		claim.Status.AddressRef.Name = ip.Name
		if err := p.Client.Status().Update(ctx, claim); err != nil {
			return err
		}
	}
	addresses := &ipamv1.IPAddressList{}
	if err := p.Client.List(ctx, addresses, client.InNamespace(p.Namespace)); err != nil {
		return err
	}
	for i := range addresses.Items {
		if a := &addresses.Items[i]; !open[a.Spec.ClaimRef.Name] {
			if err := p.Client.Delete(ctx, a); client.IgnoreNotFound(err) != nil {
				return err
			}
		}
	}
	return nil
}
