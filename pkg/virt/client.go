package virt

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/fanout"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt/leases"
)

// DefaultURI is the libvirt URI used when Dial is given an empty one.
const DefaultURI = "qemu:///system"

// eventLoopOnce guards the process-wide libvirt event loop: libvirt allows
// one default implementation per process, and it must be registered before
// the first connection is opened or keepalive and events never fire.
var (
	eventLoopOnce sync.Once
	errEventLoop  error
)

func ensureEventLoop() error {
	eventLoopOnce.Do(func() {
		if err := libvirt.EventRegisterDefaultImpl(); err != nil {
			errEventLoop = fmt.Errorf("registering libvirt event loop: %w", err)
			return
		}
		go func() {
			for {
				// An error here is an internal libvirt problem; looping on
				// keeps keepalives and events flowing for the next iteration.
				if err := libvirt.EventRunDefaultImpl(); err != nil {
					time.Sleep(10 * time.Millisecond)
				}
			}
		}()
	})
	return errEventLoop
}

// options configures a Client; see the Option constructors.
type options struct {
	keepAliveInterval int
	keepAliveCount    uint
	reconnectBudget   time.Duration
	eventBuffer       int
	lazy              bool
	beforeConnect     func() error
}

// Option tunes a Client at Dial time.
type Option func(*options)

// WithKeepAlive overrides the keepalive probe interval (seconds) and the
// number of unanswered probes after which libvirt declares the connection
// dead. The default 5s×3 notices a vanished libvirtd within ~20s even when
// the TCP/SSH transport itself stays up.
func WithKeepAlive(interval int, count uint) Option {
	return func(o *options) { o.keepAliveInterval, o.keepAliveCount = interval, count }
}

// WithReconnectBudget bounds how long one call may spend reconnecting
// before it gives up and returns the connection error.
func WithReconnectBudget(d time.Duration) Option {
	return func(o *options) { o.reconnectBudget = d }
}

// WithEventBuffer sets the per-subscriber event buffer; events beyond it are
// dropped and counted rather than stalling libvirt's event loop.
func WithEventBuffer(n int) Option {
	return func(o *options) { o.eventBuffer = n }
}

// WithLazyConnect makes Dial return at once and connect in the background,
// retrying until the host answers: a host that is down when the manager
// first needs it (one of several failure domains) must not hold up the
// reconcile that asked for it. Reachable tells whether it is connected.
func WithLazyConnect() Option {
	return func(o *options) { o.lazy = true }
}

// WithConnectCheck runs check before every connect, the first and each
// reconnect; an error fails that attempt as a connection error would. The
// manager checks there where a host's name leads (pkg/hosts), which can
// change between connects.
func WithConnectCheck(check func() error) Option {
	return func(o *options) { o.beforeConnect = check }
}

// connHook runs on every fresh connection (the first one and each
// reconnect), typically to register event callbacks, which libvirt ties to
// one connection. The returned cleanup runs before that connection is
// dropped.
type connHook func(conn *libvirt.Connect) (cleanup func(), err error)

// Client is the concrete Host: one long-lived libvirt connection to one URI
// with keepalive, a close callback and transparent reconnect. Keep one
// Client per URI for the life of the process. It is safe for concurrent use.
type Client struct {
	uri  string
	opts options

	mu     sync.Mutex // guards the fields below
	cur    *connState // nil when not connected
	gen    uint64     // incremented on every successful connect
	closed bool
	hooks  []connHook

	events *fanout.Broker[Event]

	poolMu    sync.Mutex
	poolLocks map[string]chan struct{} // one-slot semaphores, see lockPool

	images imageLocks // overlay creation against image collection

	ownersMu sync.Mutex
	owners   map[string]*Owner // domain UUID → owner, for events of undefined domains

	hostMemoryMu sync.Mutex
	hostMemory   uint64 // bytes; 0 until first read, see HostMemory

	leasesOnce sync.Once
	leases     *leases.Watcher // created on the first WatchLease; stops with ctx

	// lost is signalled when libvirtd drops the connection (see
	// reconnectWhenLost).
	lost chan struct{}

	// connected and lastErr answer Reachable without c.mu, which a
	// reconnect holds for up to the reconnect budget.
	connected atomic.Bool
	lastErr   atomic.Pointer[error]

	ctx    context.Context // canceled by Close; background work stops with it
	cancel context.CancelFunc
	wg     sync.WaitGroup
}

// connState is one libvirt connection. dead is atomic because libvirt
// invokes the close callback while holding its own lock, which
// UnregisterCloseCallback also takes: taking c.mu in the callback could
// deadlock against a reconnect that holds c.mu.
type connState struct {
	conn     *libvirt.Connect
	gen      uint64
	dead     atomic.Bool
	cleanups []func() // cleanups of hooks run on conn
}

// Dial opens a long-lived connection to uri (DefaultURI when empty),
// enables keepalive and registers the event callbacks. The connection is
// re-established transparently when libvirtd restarts.
func Dial(ctx context.Context, uri string, opts ...Option) (*Client, error) {
	if uri == "" {
		uri = DefaultURI
	}
	o := options{keepAliveInterval: 5, keepAliveCount: 3, reconnectBudget: 30 * time.Second, eventBuffer: 256}
	for _, opt := range opts {
		opt(&o)
	}
	if err := ensureEventLoop(); err != nil {
		return nil, err
	}
	bg, cancel := context.WithCancel(context.Background())
	c := &Client{
		uri:       uri,
		opts:      o,
		events:    fanout.New[Event](o.eventBuffer),
		poolLocks: map[string]chan struct{}{},
		owners:    map[string]*Owner{},
		lost:      make(chan struct{}, 1),
		ctx:       bg,
		cancel:    cancel,
	}
	c.startDomainEvents()
	c.background(c.reconnectWhenLost)
	if o.lazy {
		c.lost <- struct{}{}
		return c, nil
	}
	if _, err := c.liveConn(ctx); err != nil {
		cancel()
		c.wg.Wait()
		return nil, err
	}
	return c, nil
}

// URI returns the libvirt URI this client talks to.
func (c *Client) URI() string { return c.uri }

// Close drops the connection and closes every event subscription. Calls
// after Close fail with ErrClosed.
func (c *Client) Close() error {
	// Cancel first: a reconnect loop sleeping under c.mu watches c.ctx.
	c.cancel()
	c.mu.Lock()
	if c.closed {
		c.mu.Unlock()
		return nil
	}
	c.closed = true
	c.setReachable(false, ErrClosed)
	c.dropConnLocked()
	c.mu.Unlock()
	c.wg.Wait()
	c.events.Close()
	return nil
}

// ErrClosed is returned by calls on a closed Client.
var ErrClosed = errors.New("virt: client is closed")

// ErrNotConnected is what Reachable returns before the first connection
// attempt of a lazily dialled Client has ended.
var ErrNotConnected = errors.New("virt: not connected yet")

// Reachable returns nil while the Client holds a live connection, else
// why it does not: the last connection error, or ErrNotConnected. It never
// blocks, so callers can skip a host that is down instead of waiting out
// the reconnect budget in every call.
func (c *Client) Reachable() error {
	if c.connected.Load() {
		return nil
	}
	if err := c.lastErr.Load(); err != nil {
		return *err
	}
	return ErrNotConnected
}

// setReachable records the outcome of a connection attempt, or (err nil,
// up false) a connection that died.
func (c *Client) setReachable(up bool, err error) {
	c.connected.Store(up)
	if err != nil {
		c.lastErr.Store(&err)
	} else if up {
		c.lastErr.Store(nil)
	}
}

// addConnHook registers h for every future connection and runs it now on
// the live one, if any, so callbacks exist without waiting for a reconnect.
func (c *Client) addConnHook(h connHook) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.closed {
		return ErrClosed
	}
	c.hooks = append(c.hooks, h)
	if c.cur == nil || c.cur.dead.Load() {
		return nil
	}
	cleanup, err := h(c.cur.conn)
	if err != nil {
		return err
	}
	if cleanup != nil {
		c.cur.cleanups = append(c.cur.cleanups, cleanup)
	}
	return nil
}

// background runs fn in a goroutine that Close waits for; fn must return
// once ctx is done.
func (c *Client) background(fn func(ctx context.Context)) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		fn(c.ctx)
	}()
}

// withConn runs fn with a live connection. When fn fails because the
// connection died (libvirtd restarted, socket closed, keepalive timeout), it
// reconnects within the reconnect budget and retries fn once; every
// operation passed here is therefore written to be idempotent. op names the
// operation in the call metrics: the Host method on whose behalf fn runs.
func (c *Client) withConn(ctx context.Context, op string, fn func(*libvirt.Connect) error) error {
	defer observeCall(op, time.Now())
	// libvirt's calls take no context: one whose context ended (a manager
	// shutting down, whose workers finish what they picked up) must not
	// start a call that creates, starts or deletes something.
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s: %w", op, err)
	}
	st, err := c.acquire(ctx)
	if err != nil {
		return err
	}
	err = fn(st.conn)
	// A full pool can break a stream the way a lost connection does; it is
	// not one, and another attempt would fail the same way.
	lost := err != nil && !errors.Is(err, ErrPoolFull) && isConnFailure(st, err)
	st.unref()
	if !lost {
		return err
	}
	st.dead.Store(true)
	st, rerr := c.acquire(ctx)
	if rerr != nil {
		return fmt.Errorf("%w (reconnect: %v)", err, rerr)
	}
	defer st.unref()
	return fn(st.conn)
}

// acquire returns a live connection with a reference held for the caller,
// who drops it with unref once its call returned. libvirt frees a
// connection at its last reference, and its calls take none: without it,
// a connection released meanwhile (declared dead by another call, the
// Client closed) would be freed under a call still using it.
func (c *Client) acquire(ctx context.Context) (*connState, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	st, err := c.liveConnLocked(ctx)
	if err != nil {
		return nil, err
	}
	if err := st.conn.Ref(); err != nil {
		return nil, err
	}
	return st, nil
}

// unref drops a reference acquire took.
func (st *connState) unref() { _, _ = st.conn.Close() }
