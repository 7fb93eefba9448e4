package virt

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"libvirt.org/go/libvirt"
)

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
