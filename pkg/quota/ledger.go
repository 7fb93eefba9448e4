package quota

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	ctrl "sigs.k8s.io/controller-runtime"
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

// DefaultListTimeout bounds how long an admission waits for one host's
// listing before it takes the host's last listing instead.
const DefaultListTimeout = 5 * time.Second

// listBound bounds one listing as a whole, which goes on in the
// background after an admission stopped waiting for it.
const listBound = 2 * time.Minute

// Option configures a Ledger.
type Option func(*Ledger)

// WithSharedHosts has a host count only for the namespaces whose
// LibvirtClusters name it in a failure domain (now, or earlier: the
// orphans a namespace left there still count), unless shared says it
// counts for every namespace (the manager's own host and the hosts the
// operator lists). Without it, every host counts for every namespace.
// A host a tenant names is the tenant's to answer for: what it reports
// of other namespaces' objects is never counted against them.
func WithSharedHosts(shared func(uri string) bool) Option {
	return func(l *Ledger) { l.shared = shared }
}

// WithListTimeout sets how long an admission waits for one host's
// listing (DefaultListTimeout without it).
func WithListTimeout(d time.Duration) Option {
	return func(l *Ledger) { l.listTimeout = d }
}

// WithListingReuse lets an admission that passes count from a host's
// listing begun at most d ago instead of listing the host again: a
// listing reads every domain's XML and every volume's info, so listing
// per admission made creating N machines read N × N objects (at 1000
// machines, 2.1 s of listing per admission; docs/performance.md). Reuse
// is safe because what a namespace's objects made since the listing
// began they made once admitted, and counts as their ask until they
// hold it; a listing is taken afresh when that no longer holds (one of
// the namespace's objects is being deleted, or one it admitted left the
// API server without being forgotten, as clusterctl move's objects do)
// and before any refusal, so that room freed since is seen. Without it
// every admission lists.
func WithListingReuse(d time.Duration) Option {
	return func(l *Ledger) { l.reuse = d }
}

// DefaultListingReuse is the manager's WithListingReuse: VMs made or
// deleted on a host by hand are seen at most this late.
const DefaultListingReuse = 30 * time.Second

// hostListing is what the ledger knows of one host's listing.
type hostListing struct {
	mu sync.Mutex
	// last is the host's last complete listing; nil before the first.
	last *listing
	// began is when last's listing began.
	began time.Time
	// err is why the latest listing failed; nil when it succeeded.
	err error
	// running is closed when the listing under way ends; nil when none
	// runs. One listing per host runs at a time, however many
	// admissions wait for it.
	running chan struct{}
}

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
	// listings are what each host listed, by URI, kept for hosts that
	// do not answer now or that the manager closed since: what a
	// namespace had there still counts.
	listings map[string]*hostListing
	// namedBy are, by URI, the namespaces whose clusters named the host
	// in an admission (WithSharedHosts).
	namedBy map[string]map[string]bool

	shared      func(uri string) bool
	listTimeout time.Duration
	reuse       time.Duration
}

// NewLedger returns a ledger for limits; api should read the API server
// directly (the manager's API reader), not a cache that may lag.
func NewLedger(limits tenancy.Limits, api client.Reader, hosts Hosts, opts ...Option) *Ledger {
	l := &Ledger{limits: limits, api: api, hosts: hosts,
		locks: map[string]*sync.Mutex{}, admitted: map[string]map[string]bool{},
		listings: map[string]*hostListing{}, namedBy: map[string]map[string]bool{}, listTimeout: DefaultListTimeout}
	for _, o := range opts {
		o(l)
	}
	return l
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
	objs, err := l.listNamespace(ctx, ns)
	if err != nil {
		return err
	}
	reuse := l.reuse
	if l.holdingsUncounted(ns, objs) {
		reuse = 0
	}
	exceeded, err := l.exceeded(ctx, r, objs, reuse)
	if err == nil && exceeded != nil && reuse > 0 {
		// A refusal stands on a listing of now: room may have been freed
		// since the reused one.
		exceeded, err = l.exceeded(ctx, r, objs, 0)
	}
	if err != nil {
		return err
	}
	if exceeded != nil {
		return exceeded
	}
	l.mu.Lock()
	if l.admitted[ns] == nil {
		l.admitted[ns] = map[string]bool{}
	}
	l.admitted[ns][keyOf(r.Object)] = true
	l.mu.Unlock()
	return nil
}

// exceeded counts what namespace ns holds on its hosts (from listings
// begun at most reuse ago), what its other objects ask and r's ask; an
// *ExceededError when that passes a total.
func (l *Ledger) exceeded(ctx context.Context, r Request, objs namespaceObjects, reuse time.Duration) (*ExceededError, error) {
	ns := r.Object.GetNamespace()
	all, err := l.listHosts(ctx, ns, objs.clusters.Items, reuse)
	if err != nil {
		return nil, err
	}
	held := Hold(ns, all.objs, all.uses, r.Own)
	ask := r.Ask(held)
	if ask == (tenancy.Usage{}) {
		return nil, nil
	}
	total := held.Usage.Add(l.pending(r, objs, held)).Add(ask)
	if exceeded := l.limits.Exceeded(total, "--namespace-max-"); len(exceeded) > 0 {
		return &ExceededError{Namespace: ns, Exceeded: exceeded}, nil
	}
	return nil, nil
}

// holdingsUncounted tells whether something namespace ns made on a host
// may count neither as its object's ask nor in an earlier listing: an
// object being deleted (pending leaves it out, so what it still holds
// counts from libvirt alone), or one the ledger admitted that left the API
// server without Forget (clusterctl move removes finalizers itself, and
// the VM stays). A gone object's key is dropped once seen, as Forget
// would: the fresh listing counts what it left.
func (l *Ledger) holdingsUncounted(ns string, objs namespaceObjects) bool {
	present := map[string]bool{}
	uncounted := false
	for i := range objs.machines.Items {
		present[keyOf(&objs.machines.Items[i])] = true
		uncounted = uncounted || !objs.machines.Items[i].DeletionTimestamp.IsZero()
	}
	for i := range objs.clusters.Items {
		present[keyOf(&objs.clusters.Items[i])] = true
		uncounted = uncounted || !objs.clusters.Items[i].DeletionTimestamp.IsZero()
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for key := range l.admitted[ns] {
		if !present[key] {
			delete(l.admitted[ns], key)
			uncounted = true
		}
	}
	return uncounted
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

// listHosts lists the owned objects of every host that counts for
// namespace ns (whose LibvirtClusters are clusters), each host at once
// and each for at most the list timeout; a host whose last listing began
// at most reuse ago is not listed again. A host that does not answer in
// time, or that the manager closed since (no cluster names it any more),
// contributes its last listing, so that taking a host off the network, or
// deleting the cluster that named it, frees nothing its orphans hold. A
// host that never answered fails the admission (nothing is known of what
// it holds), unless it is a tenant's host that no cluster of ns names
// now.
func (l *Ledger) listHosts(ctx context.Context, ns string, clusters []infrav1.LibvirtCluster, reuse time.Duration) (listing, error) {
	open := l.hosts()
	named := l.recordNames(ns, clusters)
	l.mu.Lock()
	uris := slices.Collect(maps.Keys(open))
	for uri := range l.listings {
		if _, ok := open[uri]; !ok {
			uris = append(uris, uri)
		}
	}
	l.mu.Unlock()
	type result struct {
		uri string
		got listing
		err error
	}
	results := make(chan result)
	n := 0
	for _, uri := range uris {
		if !l.countsFor(uri, ns) {
			continue
		}
		n++
		go func() {
			got, err := l.listOne(ctx, uri, open[uri], reuse)
			results <- result{uri, got, err}
		}()
	}
	var all listing
	var errs []error
	for range n {
		r := <-results
		if r.err != nil {
			if named[r.uri] || l.shared == nil || l.shared(r.uri) {
				errs = append(errs, fmt.Errorf("counting what the namespace holds on %s: %w", r.uri, r.err))
			} else {
				ctrl.LoggerFrom(ctx).Info("Leaving out a libvirt host never listed", "host", r.uri, "reason", r.err.Error())
			}
			continue
		}
		all.objs = append(all.objs, r.got.objs...)
		all.uses = append(all.uses, r.got.uses...)
	}
	return all, errors.Join(errs...)
}

// recordNames remembers which hosts the failure domains of namespace
// ns's clusters name, and returns them.
func (l *Ledger) recordNames(ns string, clusters []infrav1.LibvirtCluster) map[string]bool {
	named := map[string]bool{}
	for i := range clusters {
		for _, fd := range clusters[i].Spec.FailureDomains {
			if fd.URI != "" {
				named[fd.URI] = true
			}
		}
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	for uri := range named {
		if l.namedBy[uri] == nil {
			l.namedBy[uri] = map[string]bool{}
		}
		l.namedBy[uri][ns] = true
	}
	return named
}

// countsFor tells whether what the host at uri reports counts for
// namespace ns: always without WithSharedHosts; with it, when the host
// is shared or a cluster of ns named it.
func (l *Ledger) countsFor(uri, ns string) bool {
	if l.shared == nil || l.shared(uri) {
		return true
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.namedBy[uri][ns]
}

// listOne returns the listing of the host at uri (h; nil for a host the
// manager closed), waiting at most the list timeout for it; its last
// listing when it began at most reuse ago, or when the host does not
// answer in time or fails.
func (l *Ledger) listOne(ctx context.Context, uri string, h Lister, reuse time.Duration) (listing, error) {
	hl := l.hostListing(uri)
	hl.mu.Lock()
	if h == nil || (hl.last != nil && reuse > 0 && time.Since(hl.began) <= reuse) {
		defer hl.mu.Unlock()
		if hl.last == nil {
			return listing{}, errors.New("the host was closed before it was ever listed")
		}
		return *hl.last, nil
	}
	done := hl.running
	if done == nil {
		done = make(chan struct{})
		hl.running = done
		go hl.list(h, done)
	}
	hl.mu.Unlock()
	timer := time.NewTimer(l.listTimeout)
	defer timer.Stop()
	var why error
	select {
	case <-done:
	case <-timer.C:
		why = fmt.Errorf("the host has not answered within %s", l.listTimeout)
	case <-ctx.Done():
		why = ctx.Err()
	}
	hl.mu.Lock()
	defer hl.mu.Unlock()
	if why == nil && hl.err != nil {
		why = hl.err
	}
	switch {
	case why == nil:
		return *hl.last, nil
	case hl.last != nil:
		return *hl.last, nil
	}
	return listing{}, why
}

// list lists h in the background, bounded by listBound, keeps the
// result, and closes done.
func (hl *hostListing) list(h Lister, done chan struct{}) {
	began := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), listBound)
	got, err := listHost(ctx, h)
	cancel()
	hl.mu.Lock()
	if hl.err = err; err == nil {
		hl.last, hl.began = &got, began
	}
	hl.running = nil
	hl.mu.Unlock()
	close(done)
}

func (l *Ledger) hostListing(uri string) *hostListing {
	l.mu.Lock()
	defer l.mu.Unlock()
	hl := l.listings[uri]
	if hl == nil {
		hl = &hostListing{}
		l.listings[uri] = hl
	}
	return hl
}

// Retire lists h, the host at uri that the manager is about to close,
// one last time (as an admission would), so that the objects left there
// keep counting, for the namespaces they counted for, at what the host
// last held.
func (l *Ledger) Retire(ctx context.Context, uri string, h Lister) {
	if !l.Enabled() {
		return
	}
	if _, err := l.listOne(ctx, uri, h, 0); err != nil {
		ctrl.LoggerFrom(ctx).Info("A closed libvirt host's last listing is missing: what is left there is not counted", "host", uri, "reason", err.Error())
	}
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

// namespaceObjects are a namespace's machines and clusters in the API
// server.
type namespaceObjects struct {
	machines infrav1.LibvirtMachineList
	clusters infrav1.LibvirtClusterList
}

// listNamespace reads namespace ns's machines and clusters.
func (l *Ledger) listNamespace(ctx context.Context, ns string) (namespaceObjects, error) {
	var o namespaceObjects
	if err := l.api.List(ctx, &o.machines, client.InNamespace(ns)); err != nil {
		return o, fmt.Errorf("listing the namespace's LibvirtMachines: %w", err)
	}
	if err := l.api.List(ctx, &o.clusters, client.InNamespace(ns)); err != nil {
		return o, fmt.Errorf("listing the namespace's LibvirtClusters: %w", err)
	}
	return o, nil
}

// pending sums what the namespace's other objects in the API server ask
// for and do not hold yet: those created before r's object (the same
// second: by name) and those admitted already.
func (l *Ledger) pending(r Request, objs namespaceObjects, held Holdings) tenancy.Usage {
	ns := r.Object.GetNamespace()
	var u tenancy.Usage
	self := keyOf(r.Object)
	for i := range objs.machines.Items {
		lm := &objs.machines.Items[i]
		if keyOf(lm) != self && !held.Domains[naming.DomainName(ns, lm.Name)] && l.counts(r, lm) {
			u = u.Add(MachineAsk(lm, held))
		}
	}
	for i := range objs.clusters.Items {
		lc := &objs.clusters.Items[i]
		if keyOf(lc) != self && l.counts(r, lc) {
			u = u.Add(ClusterAsk(lc, held))
		}
	}
	return u
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
