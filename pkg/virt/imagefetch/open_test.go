package imagefetch

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"
)

// TestOpenSourceBounds: each phase of a download that stalls fails within
// its own bound and says which one it was.
func TestOpenSourceBounds(t *testing.T) {
	silent, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer silent.Close()
	go func() {
		for {
			c, err := silent.Accept()
			if err != nil {
				return
			}
			defer c.Close() // held open, never answered
		}
	}()
	// stall sends half its announced body, then nothing until the client leaves.
	stall := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", "8")
		_, _ = w.Write([]byte("abcd"))
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer stall.Close()
	limits := Limits{ConnectTimeout: time.Second, HeaderTimeout: 300 * time.Millisecond, IdleTimeout: 300 * time.Millisecond}

	for _, tc := range []struct {
		name     string
		url      string
		openErr  string
		readErr  error
		maxDelay time.Duration
	}{
		{name: "never answers", url: "http://" + silent.Addr().String() + "/img", openErr: "timeout awaiting response headers", maxDelay: 3 * time.Second},
		{name: "stops sending", url: stall.URL + "/img", readErr: ErrIdle, maxDelay: 3 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			var progress []int64
			src, size, err := Open(context.Background(), tc.url, limits, Policy{},
				func(done, total int64) { progress = append(progress, done, total) })
			if tc.openErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.openErr) {
					t.Fatalf("open: %v, want %q", err, tc.openErr)
				}
			} else {
				if err != nil {
					t.Fatal(err)
				}
				defer src.Close()
				_, err = io.ReadAll(src)
				if !errors.Is(err, tc.readErr) {
					t.Fatalf("read: %v, want %v", err, tc.readErr)
				}
				if size != 8 || len(progress) < 4 || progress[len(progress)-2] != 4 || progress[len(progress)-1] != 8 {
					t.Errorf("size %d, progress %v: want 4 of 8 bytes reported", size, progress)
				}
			}
			if d := time.Since(start); d > tc.maxDelay {
				t.Errorf("took %s, want under %s", d, tc.maxDelay)
			}
		})
	}
}

// TestOpenSourceIdleResetsOnData: a slow but steady server is not idle.
func TestOpenSourceIdleResetsOnData(t *testing.T) {
	const n = 6
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Length", strconv.Itoa(n))
		for range n {
			_, _ = w.Write([]byte{1})
			w.(http.Flusher).Flush()
			time.Sleep(100 * time.Millisecond)
		}
	}))
	defer srv.Close()
	src, _, err := Open(context.Background(), srv.URL, Limits{IdleTimeout: 250 * time.Millisecond}, Policy{}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer src.Close()
	if b, err := io.ReadAll(src); err != nil || len(b) != n {
		t.Errorf("read %d bytes, %v; want %d", len(b), err, n)
	}
}
