package imagefetch

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"net/netip"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"
)

// TestOpenFilePolicy: file:// reaches regular files below the operator's
// directories and nothing else, whatever the path or a symlink says.
func TestOpenFilePolicy(t *testing.T) {
	allowed, outside := t.TempDir(), t.TempDir()
	write := func(dir, name string) string {
		p := filepath.Join(dir, name)
		if err := os.WriteFile(p, []byte("image bytes"), 0o600); err != nil {
			t.Fatal(err)
		}
		return p
	}
	good := write(allowed, "good.qcow2")
	secret := write(outside, "secret")
	if err := os.Symlink(secret, filepath.Join(allowed, "escape.qcow2")); err != nil {
		t.Fatal(err)
	}
	if err := os.Symlink("good.qcow2", filepath.Join(allowed, "alias.qcow2")); err != nil {
		t.Fatal(err)
	}
	if err := syscall.Mkfifo(filepath.Join(allowed, "fifo.qcow2"), 0o600); err != nil {
		t.Fatal(err)
	}
	tests := []struct {
		name    string
		path    string
		dirs    []string
		wantErr error
	}{
		{"file below an allowed directory", good, []string{allowed}, nil},
		{"symlink staying inside", filepath.Join(allowed, "alias.qcow2"), []string{allowed}, nil},
		{"no directory allowed", good, nil, ErrSourceRefused},
		{"file outside", secret, []string{allowed}, ErrSourceRefused},
		{"dot-dot out of the directory", allowed + "/../" + filepath.Base(outside) + "/secret", []string{allowed}, ErrSourceRefused},
		{"symlink leading out", filepath.Join(allowed, "escape.qcow2"), []string{allowed}, ErrSourceRefused},
		{"the directory itself", allowed, []string{allowed}, ErrSourceRefused},
		{"a FIFO does not block", filepath.Join(allowed, "fifo.qcow2"), []string{allowed}, ErrSourceRefused},
		{"missing file", filepath.Join(allowed, "absent.qcow2"), []string{allowed}, ErrNotFound},
		{"relative path", "good.qcow2", []string{allowed}, ErrSourceRefused},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			done := make(chan struct{})
			var (
				src io.ReadCloser
				err error
			)
			go func() {
				defer close(done)
				src, _, err = Open(context.Background(), "file://"+tt.path, Limits{}, Policy{FileDirs: tt.dirs}, nil)
			}()
			select {
			case <-done:
			case <-time.After(5 * time.Second):
				t.Fatal("opening the source blocked")
			}
			if tt.wantErr == nil {
				if err != nil {
					t.Fatal(err)
				}
				b, _ := io.ReadAll(src)
				src.Close()
				if string(b) != "image bytes" {
					t.Errorf("read %q", b)
				}
				return
			}
			if src != nil {
				src.Close()
			}
			if !errors.Is(err, tt.wantErr) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
		})
	}
}

// TestOpenURLPolicy: downloads connect to no denied address, by literal,
// by name or through a redirect, follow a bounded number of redirects,
// and refuse an announced length over the bound; errors never show the
// URL's credentials or query.
func TestOpenURLPolicy(t *testing.T) {
	var hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits.Add(1)
		switch {
		case r.URL.Path == "/image":
			_, _ = w.Write([]byte("image bytes"))
		case r.URL.Path == "/huge":
			w.Header().Set("Content-Length", strconv.FormatInt(1<<40, 10))
		case strings.HasPrefix(r.URL.Path, "/to/"):
			http.Redirect(w, r, strings.TrimPrefix(r.URL.Path, "/to/")+"?"+r.URL.RawQuery, http.StatusFound)
		case strings.HasPrefix(r.URL.Path, "/hops/"):
			n, _ := strconv.Atoi(strings.TrimPrefix(r.URL.Path, "/hops/"))
			next := "/image"
			if n > 0 {
				next = fmt.Sprintf("/hops/%d", n-1)
			}
			http.Redirect(w, r, next, http.StatusFound)
		default:
			http.NotFound(w, r)
		}
	}))
	t.Cleanup(srv.Close)
	port := srv.Listener.Addr().(*net.TCPAddr).Port
	otherLoopback := fmt.Sprintf("http://127.0.0.2:%d/image", port)
	deny := func(cidrs ...string) []netip.Prefix {
		var ps []netip.Prefix
		for _, c := range cidrs {
			ps = append(ps, netip.MustParsePrefix(c))
		}
		return ps
	}
	tests := []struct {
		name     string
		url      string
		policy   Policy
		wantErr  error
		wantHits int32
	}{
		{"allowed", srv.URL + "/image", Policy{}, nil, 1},
		{"denied address literal, nothing sent", srv.URL + "/image", Policy{DenyNets: deny("127.0.0.0/8")}, ErrSourceRefused, 0},
		{"denied address behind a name", fmt.Sprintf("http://localhost:%d/image", port), Policy{DenyNets: deny("127.0.0.0/8", "::1/128")}, ErrSourceRefused, 0},
		{"redirect to a denied address", srv.URL + "/to/" + otherLoopback, Policy{DenyNets: deny("127.0.0.2/32")}, ErrSourceRefused, 1},
		{"redirect to file://", srv.URL + "/to/file:///etc/shadow", Policy{}, ErrSourceRefused, 1},
		{"five redirects", srv.URL + "/hops/4", Policy{}, nil, 6},
		{"six redirects", srv.URL + "/hops/5", Policy{}, ErrSourceRefused, 6},
		{"announced length over the bound", srv.URL + "/huge", Policy{MaxBytes: 1 << 20}, ErrTooLarge, 1},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			hits.Store(0)
			u, _ := url.Parse(tt.url)
			u.User = url.UserPassword("user", "hunter2")
			q := u.Query()
			q.Set("token", "s3cr3t")
			u.RawQuery = q.Encode()
			src, _, err := Open(context.Background(), u.String(), Limits{ConnectTimeout: 2 * time.Second, HeaderTimeout: 2 * time.Second}, tt.policy, nil)
			if src != nil {
				src.Close()
			}
			if !errors.Is(err, tt.wantErr) || (err != nil) != (tt.wantErr != nil) {
				t.Fatalf("error %v, want %v", err, tt.wantErr)
			}
			if err != nil && (strings.Contains(err.Error(), "hunter2") || strings.Contains(err.Error(), "s3cr3t")) {
				t.Errorf("error shows the URL's secrets: %v", err)
			}
			if got := hits.Load(); got != tt.wantHits {
				t.Errorf("server saw %d requests, want %d", got, tt.wantHits)
			}
		})
	}
}

// TestCheckRedirect covers what a loopback test server cannot show: the
// https → http downgrade.
func TestCheckRedirect(t *testing.T) {
	req := func(raw string) *http.Request {
		u, _ := url.Parse(raw)
		return &http.Request{URL: u}
	}
	tests := []struct {
		name    string
		to      string
		via     []string
		wantErr bool
	}{
		{"https to https", "https://b.example/img", []string{"https://a.example/img"}, false},
		{"http to https", "https://b.example/img", []string{"http://a.example/img"}, false},
		{"https to http", "http://b.example/img", []string{"https://a.example/img"}, true},
		{"https, https, then http", "http://c.example/img", []string{"https://a.example/img", "https://b.example/img"}, true},
		{"to ftp", "ftp://b.example/img", []string{"http://a.example/img"}, true},
		{"to a link-local literal", "http://169.254.169.254/latest", []string{"http://a.example/img"}, true},
	}
	deny := []netip.Prefix{netip.MustParsePrefix("169.254.0.0/16")}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var via []*http.Request
			for _, v := range tt.via {
				via = append(via, req(v))
			}
			err := checkRedirect(req(tt.to), via, deny)
			if (err != nil) != tt.wantErr || (err != nil && !errors.Is(err, ErrSourceRefused)) {
				t.Fatalf("error %v, want error %v", err, tt.wantErr)
			}
		})
	}
}

func TestRedactURL(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:pw@images.example/a.qcow2?X-Amz-Signature=abc#frag": "https://images.example/a.qcow2",
		"http://10.0.0.5:8080/img.qcow2":                                  "http://10.0.0.5:8080/img.qcow2",
		"file:///var/cache/img.qcow2":                                     "file:///var/cache/img.qcow2",
		"/var/cache/img.qcow2":                                            "/var/cache/img.qcow2",
	} {
		if got := RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q, want %q", in, got, want)
		}
	}
}

// TestCheckedSource: the bound holds for a stream that never says its
// length, and the inspected bytes are still uploaded.
