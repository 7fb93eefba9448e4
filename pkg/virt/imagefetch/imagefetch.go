// Package imagefetch opens the source of a base image as the operator's
// policy allows: a regular file below an allowed directory (resolved
// inside it, so no symlink or ".." leads out), or an http(s) URL whose
// every connection, redirect and DNS answer is checked against the
// denied networks, with bounds on each phase of the download and on its
// length. Tenants write the URLs and strangers run the servers, so what it
// is handed is hostile until checked; what it returns is checked again by
// pkg/virt/diskimage before it reaches a pool.
package imagefetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Policy is what the operator lets image sources reach. Tenants
// write the URLs and other people run the servers they name, so every
// field closes a way into the manager's host: its zero value allows no
// file and sets no bound.
type Policy struct {
	// FileDirs are the directories on the manager's host whose regular
	// files file:// URLs may name; with none, file:// is refused.
	FileDirs []string
	// DenyNets are the addresses downloads never connect to, checked on
	// every connection (redirects and DNS answers included).
	DenyNets []netip.Prefix
	// MaxBytes bounds an image's length, announced or streamed; 0 sets no
	// bound.
	MaxBytes int64
}

// Why a source is not opened; pkg/virt's ErrImageSourceRefused,
// ErrImageNotFound and ErrImageTooLarge are these.
var (
	// ErrSourceRefused is a source the operator does not allow: a file
	// outside the allowed directories, a denied address, a redirect that
	// is not followed.
	ErrSourceRefused = errors.New("image source not allowed")
	// ErrNotFound is a file that does not exist or a URL answered 404.
	ErrNotFound = errors.New("image not found")
	// ErrTooLarge is a source longer than Policy.MaxBytes.
	ErrTooLarge = errors.New("image larger than allowed")
)

// Limits bound the phases of an image download, so that a server that
// stops answering fails the import rather than holding it forever.
type Limits struct {
	// ConnectTimeout bounds the TCP (and TLS) connection.
	ConnectTimeout time.Duration
	// HeaderTimeout bounds the wait for the response headers once the
	// request was sent.
	HeaderTimeout time.Duration
	// IdleTimeout bounds any wait for the next bytes of the body.
	IdleTimeout time.Duration
}

// MaxRedirects is how many redirects a download follows.
const MaxRedirects = 5

// RedactURL is raw without userinfo and query, as conditions and events
// may show it: signed URLs carry their credentials there.
func RedactURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil || u.Scheme == "" {
		return raw
	}
	u.User, u.RawQuery, u.ForceQuery, u.Fragment, u.RawFragment = nil, "", false, "", ""
	return u.String()
}

// Open opens source, a local file (a path or file:// URL) or an http(s)
// URL, as policy allows, and returns its length, -1 when the server did
// not say; reads report progress when it is set (bytes read so far, the
// length).
func Open(ctx context.Context, source string, limits Limits, policy Policy, progress func(done, total int64)) (io.ReadCloser, int64, error) {
	var (
		src  io.ReadCloser
		size int64
		err  error
	)
	if strings.HasPrefix(source, "http://") || strings.HasPrefix(source, "https://") {
		src, size, err = openURL(ctx, source, limits, policy)
	} else {
		src, size, err = openFile(strings.TrimPrefix(source, "file://"), policy.FileDirs)
	}
	if err != nil || progress == nil {
		return src, size, err
	}
	progress(0, max(size, 0))
	return &progressReader{ReadCloser: src, total: max(size, 0), report: progress}, size, nil
}

// openFile opens a regular file below one of dirs. The path is resolved
// inside that directory (os.Root), so no symlink or ".." leads out of it,
// and opened non-blocking, so a FIFO cannot hold the import.
func openFile(path string, dirs []string) (io.ReadCloser, int64, error) {
	if len(dirs) == 0 {
		return nil, 0, fmt.Errorf("%w: file:// images are not allowed: the operator allows no directory (--image-file-dirs)", ErrSourceRefused)
	}
	if !filepath.IsAbs(path) {
		return nil, 0, fmt.Errorf("%w: image file %s is not an absolute path", ErrSourceRefused, path)
	}
	path = filepath.Clean(path)
	for _, dir := range dirs {
		rel, err := filepath.Rel(filepath.Clean(dir), path)
		if err != nil || rel == "." || rel == ".." || strings.HasPrefix(rel, "../") {
			continue
		}
		return openInRoot(dir, rel, path)
	}
	return nil, 0, fmt.Errorf("%w: image file %s is outside the directories the operator allows (--image-file-dirs)", ErrSourceRefused, path)
}

func openInRoot(dir, rel, path string) (io.ReadCloser, int64, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, 0, fmt.Errorf("%w: image directory %s: %v", ErrNotFound, dir, err)
	}
	defer root.Close()
	f, err := root.OpenFile(rel, os.O_RDONLY|syscall.O_NONBLOCK, 0)
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return nil, 0, fmt.Errorf("%w: image file %s does not exist", ErrNotFound, path)
	case err != nil:
		// os.Root's refusal of a path that leaves dir lands here too.
		return nil, 0, fmt.Errorf("%w: image file %s: %v", ErrSourceRefused, path, err)
	}
	st, err := f.Stat()
	if err != nil || !st.Mode().IsRegular() {
		f.Close()
		return nil, 0, errors.Join(err, fmt.Errorf("%w: image %s is not a regular file", ErrSourceRefused, path))
	}
	return f, st.Size(), nil
}

// openURL sends the request and reads the response headers within
// limits; the body it returns fails a read that waits longer than
// limits.IdleTimeout for data. Errors name the URL redacted.
func openURL(ctx context.Context, rawURL string, limits Limits, policy Policy) (io.ReadCloser, int64, error) {
	shown := RedactURL(rawURL)
	ctx, cancel := context.WithCancelCause(ctx)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, rawURL, nil)
	if err != nil {
		cancel(nil)
		return nil, 0, fmt.Errorf("image URL %s: %w", shown, err)
	}
	if err := checkDestination(req.URL, policy.DenyNets); err != nil {
		cancel(nil)
		return nil, 0, err
	}
	resp, err := fetchClient(limits, policy.DenyNets).Do(req)
	if err != nil {
		cancel(nil)
		return nil, 0, fmt.Errorf("fetching image %s: %w", shown, unwrapURLError(err))
	}
	fail := func(err error) (io.ReadCloser, int64, error) {
		resp.Body.Close()
		cancel(nil)
		return nil, 0, err
	}
	switch {
	case resp.StatusCode == http.StatusNotFound || resp.StatusCode == http.StatusGone:
		return fail(fmt.Errorf("%w: %s: %s", ErrNotFound, shown, resp.Status))
	case resp.StatusCode != http.StatusOK:
		return fail(fmt.Errorf("fetching image %s: %s", shown, resp.Status))
	case policy.MaxBytes > 0 && resp.ContentLength > policy.MaxBytes:
		return fail(fmt.Errorf("%w: %s announces %d bytes, the bound is %d (--image-import-max-size)", ErrTooLarge, shown, resp.ContentLength, policy.MaxBytes))
	}
	body := &idleReader{body: resp.Body, ctx: ctx, cancel: cancel, idle: limits.IdleTimeout}
	if body.idle > 0 {
		body.timer = time.AfterFunc(body.idle, body.expire)
	}
	return body, resp.ContentLength, nil
}

// unwrapURLError drops net/url's wrapper, which repeats the URL unredacted.
func unwrapURLError(err error) error {
	var uerr *url.Error
	if errors.As(err, &uerr) {
		return uerr.Err
	}
	return err
}

// fetchClient is an HTTP client with limits' connect and header timeouts
// that connects to no address of deny, follows at most MaxRedirects
// redirects, each to http(s) and never from https to http, and takes
// proxies from the environment, as http.DefaultClient. A proxy the
// operator configured is reached even on a denied address; what it
// connects to is then the proxy's decision.
func fetchClient(limits Limits, deny []netip.Prefix) *http.Client {
	t := http.DefaultTransport.(*http.Transport).Clone()
	var proxies sync.Map // host:port of proxies the environment names
	t.Proxy = func(req *http.Request) (*url.URL, error) {
		u, err := http.ProxyFromEnvironment(req)
		if u != nil {
			proxies.Store(hostPort(u), true)
		}
		return u, err
	}
	plain := &net.Dialer{Timeout: limits.ConnectTimeout, KeepAlive: 30 * time.Second}
	guarded := &net.Dialer{Timeout: limits.ConnectTimeout, KeepAlive: 30 * time.Second,
		Control: func(_, address string, _ syscall.RawConn) error {
			ap, err := netip.ParseAddrPort(address)
			if err != nil {
				return err
			}
			return deniedAddr(ap.Addr(), deny)
		}}
	t.DialContext = func(ctx context.Context, network, addr string) (net.Conn, error) {
		if _, ok := proxies.Load(addr); ok {
			return plain.DialContext(ctx, network, addr)
		}
		return guarded.DialContext(ctx, network, addr)
	}
	t.TLSHandshakeTimeout = limits.ConnectTimeout
	t.ResponseHeaderTimeout = limits.HeaderTimeout
	return &http.Client{Transport: t, CheckRedirect: func(req *http.Request, via []*http.Request) error {
		return checkRedirect(req, via, deny)
	}}
}

// checkRedirect allows a redirect within MaxRedirects, to http(s), not
// from https down to http, and not to a denied address literal.
func checkRedirect(req *http.Request, via []*http.Request, deny []netip.Prefix) error {
	to := RedactURL(req.URL.String())
	switch {
	case len(via) > MaxRedirects:
		return fmt.Errorf("%w: more than %d redirects", ErrSourceRefused, MaxRedirects)
	case req.URL.Scheme != "http" && req.URL.Scheme != "https":
		return fmt.Errorf("%w: redirect to %s: only http and https are followed", ErrSourceRefused, to)
	case via[len(via)-1].URL.Scheme == "https" && req.URL.Scheme == "http":
		return fmt.Errorf("%w: redirect from https to %s: a downgrade to http is not followed", ErrSourceRefused, to)
	}
	return checkDestination(req.URL, deny)
}

// checkDestination refuses a URL whose host is an address literal of deny
// before anything is sent; names are checked when they are resolved.
func checkDestination(u *url.URL, deny []netip.Prefix) error {
	if u.Scheme != "http" && u.Scheme != "https" {
		return fmt.Errorf("%w: %s is neither http nor https", ErrSourceRefused, RedactURL(u.String()))
	}
	if a, err := netip.ParseAddr(strings.Trim(u.Hostname(), "[]")); err == nil {
		return deniedAddr(a, deny)
	}
	return nil
}

// deniedAddr refuses a of deny. The message names neither the port nor
// what answered there: tenants read it.
func deniedAddr(a netip.Addr, deny []netip.Prefix) error {
	a = a.Unmap()
	for _, p := range deny {
		if p.Contains(a) {
			return fmt.Errorf("%w: address %s is in %s, which the operator denies (--image-url-deny-cidrs)", ErrSourceRefused, a, p)
		}
	}
	return nil
}

// hostPort is u's host with its scheme's default port when it names none,
// as the transport dials it.
func hostPort(u *url.URL) string {
	if u.Port() != "" {
		return u.Host
	}
	port := "80"
	if u.Scheme == "https" {
		port = "443"
	}
	return net.JoinHostPort(u.Hostname(), port)
}

// ErrIdle is the cause of a download that got no data for its idle timeout.
var ErrIdle = errors.New("image server sent no data")

// idleReader cancels its request when no read returned data for idle.
type idleReader struct {
	body   io.ReadCloser
	ctx    context.Context
	cancel context.CancelCauseFunc
	idle   time.Duration
	timer  *time.Timer
}

func (r *idleReader) expire() {
	r.cancel(fmt.Errorf("%w for %s", ErrIdle, r.idle))
}

// Read reads from the source, restarting the idle timer on progress; a
// read the timer cut short names the idle timeout as its cause.
func (r *idleReader) Read(p []byte) (int, error) {
	n, err := r.body.Read(p)
	if n > 0 && r.timer != nil {
		r.timer.Reset(r.idle)
	}
	if err != nil && err != io.EOF {
		if cause := context.Cause(r.ctx); cause != nil && !errors.Is(err, cause) {
			err = fmt.Errorf("%w (%w)", cause, err)
		}
	}
	return n, err
}

// Close stops the idle timer, closes the source and releases the
// request's context.
func (r *idleReader) Close() error {
	if r.timer != nil {
		r.timer.Stop()
	}
	err := r.body.Close()
	r.cancel(nil)
	return err
}

// progressReader reports the bytes read so far.
type progressReader struct {
	io.ReadCloser
	done, total int64
	report      func(done, total int64)
}

// Read reads from the source and reports the bytes read so far.
func (r *progressReader) Read(p []byte) (int, error) {
	n, err := r.ReadCloser.Read(p)
	if n > 0 {
		r.done += int64(n)
		r.report(r.done, r.total)
	}
	return n, err
}
