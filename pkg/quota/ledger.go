package quota

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/naming"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Lister lists what the provider owns on one libvirt host (virt.Host).
// A Lister that also has Reachable (a virt.Client) is not asked while
// it does not answer; one that also has ImageUses (a virt.Client) has
// its imported images counted for the namespaces whose disks they back.
type Lister interface {
	ListOwned(ctx context.Context) ([]virt.OwnedObject, error)
}

// imageLister lists a host's imported base images and their users.
type imageLister interface {
	ImageUses(ctx context.Context, isImage func(string) bool) ([]virt.ImageUse, error)
}

// listing is what one host holds.
type listing struct {
	objs []virt.OwnedObject
	uses []virt.ImageUse
}

// Hosts returns the libvirt hosts whose objects count, by URI: those the
// manager reaches.
type Hosts func() map[string]Lister

// Ledger admits machines and clusters within a namespace's totals. It
// counts what the namespace holds on every host the manager reaches, plus
// what its objects in the API server ask for and do not hold yet: those
// created before the one being admitted, and those admitted already.
// Admissions of one namespace are serialised, so two objects created
// together never both pass a total that has room for one.
type Ledger struct {
	limits tenancy.Limits
	api    client.Reader
	hosts  Hosts

	mu    sync.Mutex
	locks map[string]*sync.Mutex
	// admitted are the keys (domain or network names) of the objects
	// admitted since the manager started, by namespace: they count until
	// they hold their own objects or are forgotten. After a restart the
	// objects created earlier count anyway (creation order).
	admitted map[string]map[string]bool
	// seen is the last listing of each host, for hosts that do not
	// answer now: what a namespace had there still counts.
	seen map[string]listing
}

// NewLedger returns a ledger for limits; api should read the API server
// directly (the manager's API reader), not a cache that may lag.
func NewLedger(limits tenancy.Limits, api client.Reader, hosts Hosts) *Ledger {
	return &Ledger{limits: limits, api: api, hosts: hosts,
		locks: map[string]*sync.Mutex{}, admitted: map[string]map[string]bool{}, seen: map[string]listing{}}
}

// Request is an object asking to be admitted.
type Request struct {
	// Object is the LibvirtMachine or LibvirtCluster.
	Object client.Object
	// Own tells which libvirt objects are its own, left out of what the
	// namespace holds besides it.
	Own func(virt.OwnedObject) bool
	// Ask is what it asks for on top of what the namespace holds (see
	// MachineAsk, ClusterAsk); nothing once it holds all it needs, which
	// admits it whatever the totals say now.
	Ask func(Holdings) tenancy.Usage
}

// ExceededError is a request the namespace's totals have no room for.
type ExceededError struct {
	Namespace string
	// Exceeded maps each field passed to why (tenancy.Limits.Exceeded).
	Exceeded map[string]string
}

func (e *ExceededError) Error() string {
	parts := make([]string, 0, len(e.Exceeded))
	for _, f := range slices.Sorted(maps.Keys(e.Exceeded)) {
		parts = append(parts, f+" "+e.Exceeded[f])
	}
	return fmt.Sprintf("namespace %s with this object: %s", e.Namespace, strings.Join(parts, "; "))
}

// Enabled tells whether any namespace total is set.
func (l *Ledger) Enabled() bool { return l != nil && l.limits != (tenancy.Limits{}) }

// Admit admits r when the namespace's holdings, what its other objects
// ask for and r's ask stay within the totals; an *ExceededError when they
// do not. Once admitted, r counts for the others until Forget.
func (l *Ledger) Admit(ctx context.Context, r Request) error {
	if !l.Enabled() {
		return nil
	}
	ns := r.Object.GetNamespace()
	unlock := l.lock(ns)
	defer unlock()
	all, err := l.listHosts(ctx)
	if err != nil {
		return err
	}
	held := Hold(ns, all.objs, all.uses, r.Own)
	if ask := r.Ask(held); ask != (tenancy.Usage{}) {
		pending, err := l.pending(ctx, r, held)
		if err != nil {
			return err
		}
		total := held.Usage.Add(pending).Add(ask)
		if exceeded := l.limits.Exceeded(total, "--namespace-max-"); len(exceeded) > 0 {
			return &ExceededError{Namespace: ns, Exceeded: exceeded}
		}
	}
	l.mu.Lock()
	if l.admitted[ns] == nil {
		l.admitted[ns] = map[string]bool{}
	}
	l.admitted[ns][keyOf(r.Object)] = true
	l.mu.Unlock()
	return nil
}

// Forget drops a deleted object from what the ledger admitted.
func (l *Ledger) Forget(obj client.Object) {
	if l == nil {
		return
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.admitted[obj.GetNamespace()], keyOf(obj))
}

// keyOf names obj among the objects of its namespace.
func keyOf(obj client.Object) string {
	switch obj.(type) {
	case *infrav1.LibvirtMachine:
		return "LibvirtMachine/" + obj.GetName()
	case *infrav1.LibvirtCluster:
		return "LibvirtCluster/" + obj.GetName()
	}
	return fmt.Sprintf("%T/%s", obj, obj.GetName())
}

func (l *Ledger) lock(ns string) func() {
	l.mu.Lock()
	m := l.locks[ns]
	if m == nil {
		m = &sync.Mutex{}
		l.locks[ns] = m
	}
	l.mu.Unlock()
	m.Lock()
	return m.Unlock
}

// listHosts lists the owned objects of every host; a host that does not
// answer contributes its last listing, so that taking a host off the
// network frees nothing.
func (l *Ledger) listHosts(ctx context.Context) (listing, error) {
	var all listing
	for uri, h := range l.hosts() {
		got, err := listHost(ctx, h)
		if err != nil {
			l.mu.Lock()
			seen, ok := l.seen[uri]
			l.mu.Unlock()
			if !ok {
				return all, fmt.Errorf("counting what the namespace holds on %s: %w", uri, err)
			}
			got = seen
		} else {
			l.mu.Lock()
			l.seen[uri] = got
			l.mu.Unlock()
		}
		all.objs = append(all.objs, got.objs...)
		all.uses = append(all.uses, got.uses...)
	}
	return all, nil
}

// listHost lists one host, unless it does not answer now.
func listHost(ctx context.Context, h Lister) (listing, error) {
	if r, ok := h.(interface{ Reachable() error }); ok {
		if err := r.Reachable(); err != nil {
			return listing{}, err
		}
	}
	var got listing
	var err error
	if got.objs, err = h.ListOwned(ctx); err != nil {
		return got, err
	}
	if il, ok := h.(imageLister); ok {
		got.uses, err = il.ImageUses(ctx, naming.IsImageVolumeName)
	}
	return got, err
}

// pending sums what the namespace's other objects in the API server ask
// for and do not hold yet: those created before r's object (the same
// second: by name) and those admitted already.
func (l *Ledger) pending(ctx context.Context, r Request, held Holdings) (tenancy.Usage, error) {
	ns := r.Object.GetNamespace()
	var machines infrav1.LibvirtMachineList
	if err := l.api.List(ctx, &machines, client.InNamespace(ns)); err != nil {
		return tenancy.Usage{}, fmt.Errorf("listing the namespace's LibvirtMachines: %w", err)
	}
	var clusters infrav1.LibvirtClusterList
	if err := l.api.List(ctx, &clusters, client.InNamespace(ns)); err != nil {
		return tenancy.Usage{}, fmt.Errorf("listing the namespace's LibvirtClusters: %w", err)
	}
	var u tenancy.Usage
	self := keyOf(r.Object)
	for i := range machines.Items {
		lm := &machines.Items[i]
		if keyOf(lm) != self && !held.Domains[naming.DomainName(ns, lm.Name)] && l.counts(r, lm) {
			u = u.Add(MachineAsk(lm, held))
		}
	}
	for i := range clusters.Items {
		lc := &clusters.Items[i]
		if keyOf(lc) != self && l.counts(r, lc) {
			u = u.Add(ClusterAsk(lc, held))
		}
	}
	return u, nil
}

// counts tells whether other, which holds nothing yet, counts against r:
// it was admitted, or created before r's object.
func (l *Ledger) counts(r Request, other client.Object) bool {
	if !other.GetDeletionTimestamp().IsZero() {
		return false // going: what it still holds is counted from libvirt
	}
	l.mu.Lock()
	admitted := l.admitted[other.GetNamespace()][keyOf(other)]
	l.mu.Unlock()
	return admitted || ahead(other, r.Object)
}

// ahead tells whether a was created before b (the same second: by name).
func ahead(a, b metav1.Object) bool {
	ta, tb := a.GetCreationTimestamp().Time, b.GetCreationTimestamp().Time
	if c := ta.Compare(tb); c != 0 {
		return c < 0
	}
	return a.GetName() < b.GetName()
}

// Recheck is how often an object over its namespace's totals looks
// again: what frees room (a VM deleted, maybe by hand) says nothing to it.
const Recheck = time.Minute
