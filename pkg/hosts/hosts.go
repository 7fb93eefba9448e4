// Package hosts holds the manager's connections to its libvirt hosts: the
// one of its --libvirt-uri and one per other host a LibvirtCluster's
// failure domains name, opened on first use, kept with keepalive and
// reconnect, and closed once no cluster names the host any more.
//
// A connection is keyed by its URI and, when it needs credentials, by the
// namespace and Secret they come from: an object of another namespace
// that names the same URI gets a connection of its own, made with its own
// Secret, never one opened with someone else's credentials.
package hosts

import (
	"context"
	"errors"
	"fmt"
	"net/netip"
	"net/url"
	"os"
	"sync"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/tenancy"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// Reachable returns nil when h holds a live connection to its libvirtd,
// else why not. A Host that cannot tell (a test's wrapper) is reachable.
func Reachable(h virt.Host) error {
	if r, ok := h.(interface{ Reachable() error }); ok {
		return r.Reachable()
	}
	return nil
}

// DefaultReconnectBudget bounds how long one call to another host waits
// for a reconnect: a host that is down is reported unreachable, and its
// machines requeued, rather than holding up a reconcile worker.
const DefaultReconnectBudget = 10 * time.Second

// Set is the manager's libvirt hosts. It is safe for concurrent use.
type Set struct {
	managerURI string
	def        virt.Host
	defName    string
	secrets    client.Reader
	dial       func(ctx context.Context, uri string, opts ...virt.Option) (*virt.Client, error)
	// policy, when set, has every connect to a host that only
	// tenancy.Any admits resolve its name first (Guard).
	policy *tenancy.Policy
	lookup func(ctx context.Context, host string) ([]netip.Addr, error)

	mu     sync.Mutex
	closed bool
	hosts  map[Ref]*member
	subs   map[*subscriber]struct{}
	// kept are hosts Prune never closes (Keep).
	kept map[Ref]bool
	// onPrune, when set, sees each host Prune is about to close.
	onPrune func(uri string, h virt.Host)
}

// member is one connection to another host.
type member struct {
	client *virt.Client
	creds  *credentials // nil without credentials
}

// NewSet returns a Set around the manager's own host def (at managerURI,
// named defName, or after managerURI when empty), which it never closes.
// secrets reads credentials Secrets; it should not be a cache of every
// Secret (the manager's API reader).
func NewSet(def virt.Host, managerURI, defName string, secrets client.Reader) *Set {
	if defName == "" {
		defName = HostName(managerURI)
	}
	return &Set{
		managerURI: managerURI, def: def, defName: defName, secrets: secrets,
		dial: func(ctx context.Context, uri string, opts ...virt.Option) (*virt.Client, error) {
			opts = append([]virt.Option{virt.WithLazyConnect(), virt.WithReconnectBudget(DefaultReconnectBudget)}, opts...)
			return virt.Dial(ctx, uri, opts...)
		},
		lookup: lookupHost,
		hosts:  map[Ref]*member{},
		subs:   map[*subscriber]struct{}{},
		kept:   map[Ref]bool{},
	}
}

// Keep opens the hosts refs name (in the background, as Get) and keeps
// them open whatever the clusters name: the hosts the operator lists are
// always listed, so that what is left on them counts in the namespaces'
// totals from the manager's start, whether a cluster names them or not.
func (s *Set) Keep(ctx context.Context, refs ...Ref) error {
	var errs []error
	for _, ref := range refs {
		if ref.IsDefault(s.managerURI) {
			continue
		}
		s.mu.Lock()
		s.kept[ref] = true
		s.mu.Unlock()
		if _, err := s.Get(ctx, ref); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// OnPrune has f see each host Prune is about to close, while it is still
// open (the quota ledger takes its last listing). Call it before the
// Pruner starts.
func (s *Set) OnPrune(f func(uri string, h virt.Host)) { s.onPrune = f }

// Guard has every connect (and reconnect) to a host whose URI policy
// admits only through tenancy.Any refused when the host's name resolves
// into policy.HostDenyNets. Call it before the first Get.
func (s *Set) Guard(policy tenancy.Policy) { s.policy = &policy }

// Default is the manager's own host.
func (s *Set) Default() virt.Host { return s.def }

// Get returns the host ref names, opening its connection in the
// background on first use: Get never waits for the network. Check
// Reachable before calling the host; a host that is down answers every
// call only after the reconnect budget.
func (s *Set) Get(ctx context.Context, ref Ref) (virt.Host, error) {
	if ref.IsDefault(s.managerURI) {
		return s.def, nil
	}
	s.mu.Lock()
	m, ok := s.hosts[ref]
	s.mu.Unlock()
	if ok {
		if m.creds != nil && Reachable(m.client) != nil {
			// The Secret may have been fixed or rotated since: the next
			// reconnect uses what it holds now.
			if err := m.creds.refresh(ctx, s.secrets); err != nil {
				return nil, err
			}
		}
		return m.client, nil
	}
	return s.open(ctx, ref)
}

func (s *Set) open(ctx context.Context, ref Ref) (virt.Host, error) {
	uri := ref.URI
	var creds *credentials
	if ref.Secret != "" {
		var err error
		if creds, err = newCredentials(ref); err != nil {
			return nil, err
		}
		if err := creds.refresh(ctx, s.secrets); err != nil {
			creds.remove()
			return nil, err
		}
		uri = creds.uri
	}
	var opts []virt.Option
	if g := guardFor(s.policy, ref.URI, s.lookup); g != nil {
		opts = append(opts, virt.WithConnectCheck(g.check))
	}
	c, err := s.dial(ctx, uri, opts...)
	if err != nil {
		creds.remove()
		return nil, fmt.Errorf("connecting to %s: %w", ref.URI, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.closed {
		_ = c.Close()
		creds.remove()
		return nil, virt.ErrClosed
	}
	if m, ok := s.hosts[ref]; ok { // another reconcile opened it meanwhile
		_ = c.Close()
		creds.remove()
		return m.client, nil
	}
	s.hosts[ref] = &member{client: c, creds: creds}
	for sub := range s.subs {
		sub.follow(c)
	}
	ctrl.Log.WithName("hosts").Info("Opened a libvirt host", "host", ref.String())
	return c, nil
}

// Open returns the hosts the manager has a connection to now, by URI:
// its own, those it keeps, and every other host a cluster named since it
// was last pruned. Some may not answer (Reachable tells); of several
// connections to one URI (made with different namespaces' credentials,
// or the manager's own), one that answers.
func (s *Set) Open() map[string]virt.Host {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := map[string]virt.Host{s.managerURI: s.def}
	for ref, m := range s.hosts {
		if prev, ok := out[ref.URI]; ok && Reachable(prev) == nil {
			continue
		}
		out[ref.URI] = m.client
	}
	return out
}

// Connection is one of the manager's connections to a libvirt host.
type Connection struct {
	Ref Ref
	// Name names the host as status.domain.host does (Name).
	Name string
	// Err is nil while the connection is up, else why it is not
	// (Reachable).
	Err error
}

// Connections are the manager's connections now: its own host's and one
// per other host a cluster named since it was last pruned, by URI and
// credentials.
func (s *Set) Connections() []Connection {
	s.mu.Lock()
	out := []Connection{{Ref: Ref{URI: s.managerURI}, Name: s.defName, Err: Reachable(s.def)}}
	for ref, m := range s.hosts {
		out = append(out, Connection{Ref: ref, Name: HostName(ref.URI), Err: Reachable(m.client)})
	}
	s.mu.Unlock()
	return out
}

// Prune closes the connections to the hosts inUse no longer names, but
// those it keeps.
func (s *Set) Prune(inUse map[Ref]bool) {
	s.mu.Lock()
	var gone []Ref
	var members []*member
	for ref, m := range s.hosts {
		if !inUse[ref] && (s.closed || !s.kept[ref]) {
			gone, members = append(gone, ref), append(members, m)
			delete(s.hosts, ref)
			ctrl.Log.WithName("hosts").Info("Closing a libvirt host no cluster names", "host", ref.String())
		}
	}
	onPrune := s.onPrune
	if s.closed {
		onPrune = nil
	}
	s.mu.Unlock()
	for i, m := range members {
		if onPrune != nil {
			onPrune(gone[i].URI, m.client)
		}
		_ = m.client.Close()
		m.creds.remove()
	}
}

// Close closes every connection but the manager's own host's.
func (s *Set) Close() error {
	s.mu.Lock()
	s.closed = true
	s.mu.Unlock()
	s.Prune(nil)
	return nil
}

// Subscribe streams the events of every host, those opened later
// included, until ctx ends.
func (s *Set) Subscribe(ctx context.Context) <-chan virt.Event {
	sub := &subscriber{ctx: ctx, out: make(chan virt.Event, 256)}
	s.mu.Lock()
	sub.follow(s.def)
	for _, m := range s.hosts {
		sub.follow(m.client)
	}
	s.subs[sub] = struct{}{}
	s.mu.Unlock()
	go func() {
		<-ctx.Done()
		s.mu.Lock()
		delete(s.subs, sub)
		s.mu.Unlock()
		sub.wg.Wait()
		close(sub.out)
	}()
	return sub.out
}

// subscriber merges the events of several hosts into out.
type subscriber struct {
	ctx context.Context
	out chan virt.Event
	wg  sync.WaitGroup
}

// follow forwards h's events to out until the subscriber's context ends
// or h is closed. Called with Set.mu held, so never after the goroutine
// of Subscribe stopped waiting.
func (sub *subscriber) follow(h virt.Host) {
	if sub.ctx.Err() != nil {
		return
	}
	sub.wg.Add(1)
	go func() {
		defer sub.wg.Done()
		for ev := range h.Subscribe(sub.ctx) {
			select {
			case sub.out <- ev:
			case <-sub.ctx.Done():
				return
			}
		}
	}()
}

// HostName names the libvirt host of uri: the host part of a remote URI,
// this machine's hostname for a local one.
func HostName(uri string) string {
	if u, err := url.Parse(uri); err == nil && u.Hostname() != "" {
		return u.Hostname()
	}
	if h, err := os.Hostname(); err == nil {
		return h
	}
	return "localhost"
}

// Name names ref's host in status.domain.host: the hostname of its URI,
// the manager's host's for the manager's own.
func (s *Set) Name(ref Ref) string {
	if ref.IsDefault(s.managerURI) {
		return s.defName
	}
	return HostName(ref.URI)
}

// LoadBalancerFailureDomain is the failure domain of lc's HAProxy VM (and
// of its network): spec.loadBalancer.failureDomain, else the first
// failure domain whose controlPlane is true, else the first listed; ""
// when lc lists none.
func LoadBalancerFailureDomain(lc *infrav1.LibvirtCluster) string {
	if lc.Spec.LoadBalancer.FailureDomain != "" {
		return lc.Spec.LoadBalancer.FailureDomain
	}
	for _, fd := range lc.Spec.FailureDomains {
		if fd.ControlPlane != nil && *fd.ControlPlane {
			return fd.Name
		}
	}
	if len(lc.Spec.FailureDomains) > 0 {
		return lc.Spec.FailureDomains[0].Name
	}
	return ""
}
