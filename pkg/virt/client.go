package virt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"libvirt.org/go/libvirt"
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

	events *broker

	poolMu    sync.Mutex
	poolLocks map[string]chan struct{} // one-slot semaphores, see lockPool

	ownersMu sync.Mutex
	owners   map[string]*Owner // domain UUID → owner, for events of undefined domains

	hostMemoryMu sync.Mutex
	hostMemory   uint64 // bytes; 0 until first read, see HostMemory

	leasesOnce sync.Once
	leases     *leaseWatcher // created on the first WatchLease; stops with ctx

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
		events:    newBroker(o.eventBuffer),
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
	c.events.close()
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

// reconnectRetry is how long reconnectWhenLost waits after a reconnect
// budget ran out before it tries again.
const reconnectRetry = 5 * time.Second

// reconnectWhenLost reconnects as soon as libvirtd drops the connection
// rather than at the next call: a manager at rest makes no call, and the
// EventReconnected a reconnect publishes is what makes it look at every
// object again, such as the domains a restarted libvirtd found dead (a
// power cut, a host reboot). It keeps trying until libvirtd is back or the
// Client is closed.
func (c *Client) reconnectWhenLost(ctx context.Context) {
	for {
		select {
		case <-ctx.Done():
			return
		case <-c.lost:
		}
		if c.connected.Load() || c.lastErr.Load() != nil {
			// Not the first connect of a lazy Client: objects on this host
			// should learn at once that it is gone.
			c.setReachable(false, errors.New("connection to libvirtd lost"))
			c.publish(Event{Kind: EventDisconnected})
		}
		for {
			if _, err := c.liveConn(ctx); err == nil {
				break
			}
			select {
			case <-ctx.Done():
				return
			case <-time.After(reconnectRetry):
			}
		}
	}
}

// liveConn returns the current connection, (re)connecting with bounded
// exponential backoff when there is none or it was declared dead.
func (c *Client) liveConn(ctx context.Context) (*connState, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.liveConnLocked(ctx)
}

// liveConnLocked is liveConn with c.mu held.
func (c *Client) liveConnLocked(ctx context.Context) (*connState, error) {
	if c.closed {
		return nil, ErrClosed
	}
	if c.cur != nil && !c.cur.dead.Load() {
		return c.cur, nil
	}
	if c.cur != nil {
		c.setReachable(false, errors.New("connection to libvirtd lost"))
	}
	c.dropConnLocked()
	deadline := time.Now().Add(c.opts.reconnectBudget)
	delay := 100 * time.Millisecond
	for {
		err := c.connectLocked()
		if err == nil {
			return c.cur, nil
		}
		if time.Now().Add(delay).After(deadline) {
			err = fmt.Errorf("connecting to %s: %w", displayURI(c.uri), err)
			c.setReachable(false, err)
			return nil, err
		}
		// Sleeping under c.mu is deliberate: concurrent callers would only
		// pile onto the same dead socket; they wait for this attempt instead.
		select {
		case <-ctx.Done():
			return nil, fmt.Errorf("connecting to %s: %w (last error: %v)", displayURI(c.uri), ctx.Err(), err)
		case <-c.ctx.Done():
			return nil, ErrClosed
		case <-time.After(delay):
		}
		delay = min(2*delay, 2*time.Second)
	}
}

// connectLocked opens a connection and arms keepalive, the close callback
// and the hooks. Called with c.mu held.
func (c *Client) connectLocked() error {
	if check := c.opts.beforeConnect; check != nil {
		if err := check(); err != nil {
			return err
		}
	}
	conn, err := libvirt.NewConnect(transportURI(c.uri))
	if err != nil {
		return err
	}
	if err := conn.SetKeepAlive(c.opts.keepAliveInterval, c.opts.keepAliveCount); err != nil {
		// Local drivers (test://) do not support keepalive; a remote one
		// that refuses it still works, it only notices death later.
		var lerr libvirt.Error
		if !errors.As(err, &lerr) || lerr.Code != libvirt.ERR_NO_SUPPORT && lerr.Code != libvirt.ERR_OPERATION_INVALID {
			conn.Close()
			return fmt.Errorf("setting keepalive: %w", err)
		}
	}
	st := &connState{conn: conn, gen: c.gen + 1}
	if err := conn.RegisterCloseCallback(func(_ *libvirt.Connect, _ libvirt.ConnectCloseReason) {
		// Runs on the event loop under libvirt's lock: only flip the flag
		// and wake reconnectWhenLost.
		st.dead.Store(true)
		select {
		case c.lost <- struct{}{}:
		default:
		}
	}); err != nil {
		conn.Close()
		return fmt.Errorf("registering close callback: %w", err)
	}
	for _, h := range c.hooks {
		cleanup, err := h(conn)
		if err != nil {
			st.release()
			return err
		}
		if cleanup != nil {
			st.cleanups = append(st.cleanups, cleanup)
		}
	}
	// A lazy Client's first connection also counts: whoever found the
	// host unreachable until now should look again.
	reconnect := c.gen > 0 || c.opts.lazy
	c.cur, c.gen = st, st.gen
	c.setReachable(true, nil)
	if reconnect {
		// Events may have been missed while disconnected: tell subscribers
		// to resync instead of trusting their view.
		c.publish(Event{Kind: EventReconnected})
	}
	return nil
}

// displayURI is uri as errors name it, which end up in conditions that
// tenants read: without its query, whose transport parameters (pkipath,
// command, keyfile) name files on the manager's side.
func displayURI(uri string) string {
	base, _, _ := strings.Cut(uri, "?")
	return base
}

// transportURI is the URI dialled for uri: a qemu+libssh URI, whatever
// the case of its scheme (libvirt ignores it), goes through libvirt's
// libssh2 transport instead, which takes the same parameters.
// The libssh client of libvirt 9 (Debian 12, libssh 0.10) crashes the
// process when a volume upload streams while other calls run on the
// connection (a segmentation fault within seconds, in every run of a
// program doing both; libssh2 and TCP in none), and with the manager
// every cluster's reconcile.
func transportURI(uri string) string {
	scheme, rest, ok := strings.Cut(uri, "://")
	if ok && strings.EqualFold(scheme, "qemu+libssh") {
		return "qemu+libssh2://" + rest
	}
	return uri
}

// dropConnLocked releases the current connection, if any. Called with c.mu
// held. A dead connection is released in the background: deregistering
// callbacks and closing a connection whose server went away can wait on
// libvirt's own locks, and the reconnect, which every caller waits for
// under c.mu, must not wait with it.
func (c *Client) dropConnLocked() {
	st := c.cur
	if st == nil {
		return
	}
	c.cur = nil
	if st.dead.Load() {
		go st.release()
		return
	}
	st.release()
}

// release runs the hook cleanups and closes the connection; callbacks
// registered on it die with it.
func (st *connState) release() {
	for _, f := range st.cleanups {
		f()
	}
	st.cleanups = nil
	_ = st.conn.UnregisterCloseCallback()
	_, _ = st.conn.Close()
}

// isConnFailure tells connection loss apart from an operation's own error.
// VIR_ERR_SYSTEM_ERROR and VIR_ERR_INTERNAL_ERROR are also raised for
// ordinary failures (a pool directory that cannot be created), so for them
// the connection itself is asked whether it is still alive.
func isConnFailure(st *connState, err error) bool {
	if st.dead.Load() {
		return true
	}
	var lerr libvirt.Error
	if !errors.As(err, &lerr) {
		return false
	}
	switch lerr.Code {
	case libvirt.ERR_NO_CONNECT, libvirt.ERR_RPC:
		return true
	case libvirt.ERR_SYSTEM_ERROR, libvirt.ERR_INTERNAL_ERROR:
		if connLossMessage(lerr.Message) {
			return true
		}
		alive, aerr := st.conn.IsAlive()
		return aerr != nil || !alive
	}
	return false
}
