// Package registry is the one-host plane's local OCI registry, kind's
// local-registry recipe without a container: go-containerregistry's
// registry handler with its blobs on disk and its manifests kept in a
// journal, so that a restart of the plane serves what it served before.
//
// The node image's containerd uses it as a mirror of every registry
// (images/node: capl-registry-mirror finds it at the guest's gateway), so
// an image pushed here is pulled by the guests under its usual name
// (ghcr.io/org/image:tag is served as org/image:tag); an image it does not
// hold falls through to the real registry.
//
// Who may do what is decided by where a request comes from, not by
// credentials:
//   - the host itself (a loopback client) may push, pull and delete;
//   - the guests may pull, and only through the bridge of a network the
//     provider made (netalloc.IsBridgeName): every other address of the
//     host refuses even pulls, so the registry is not served to the LAN.
//
// A tenant's guest can read every image here: push only what every
// cluster of the host may see (the provider's and Cluster API's images).
package registry

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	ggcr "github.com/google/go-containerregistry/pkg/registry"
	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
)

// DefaultPort is the registry's port on every address of the host. The
// node image's mirror unit looks for it there, at the guest's gateway.
const DefaultPort = 5050

// IdentityHeader is set on the registry's /v2/ answer, so a guest tells
// the plane's registry from whatever else its gateway serves on the port.
const IdentityHeader = "Capl-Registry"

const (
	blobsDirName   = "blobs"
	journalName    = "manifests.journal"
	maxManifestLen = 4 << 20
)

// Registry is an OCI distribution registry kept in a directory:
// blobs/sha256/<hex> and manifests.journal, one JSON line per manifest put
// or deleted, replayed by Open.
type Registry struct {
	dir     string
	handler http.Handler
	blobs   ggcr.BlobPutHandler
	// mu orders journal lines as the handler applied them.
	mu      sync.Mutex
	journal *os.File
	// interfaceOf finds the interface holding a local address; a field
	// so that the access rule is tested without the host's interfaces.
	interfaceOf func(net.IP) (string, error)
}

// journalEntry is one line of manifests.journal. The manifest itself is
// the blob Digest (a manifest is content-addressed like any blob).
type journalEntry struct {
	Op        string `json:"op"` // "put" or "delete"
	Repo      string `json:"repo"`
	Ref       string `json:"ref"`
	Digest    string `json:"digest,omitempty"`
	MediaType string `json:"mediaType,omitempty"`
}

// Open serves the registry kept in dir (created 0700 when absent),
// replaying its journal; logger receives one line per request.
func Open(dir string, logger *log.Logger) (*Registry, error) {
	if err := os.MkdirAll(filepath.Join(dir, blobsDirName), 0o700); err != nil {
		return nil, err
	}
	disk := ggcr.NewDiskBlobHandler(filepath.Join(dir, blobsDirName))
	blobs, ok := disk.(ggcr.BlobPutHandler)
	if !ok {
		return nil, errors.New("go-containerregistry's disk blob handler cannot store blobs")
	}
	r := &Registry{
		dir:         dir,
		handler:     ggcr.New(ggcr.WithBlobHandler(disk), ggcr.Logger(logger)),
		blobs:       blobs,
		interfaceOf: netalloc.InterfaceHolding,
	}
	if err := r.replay(); err != nil {
		return nil, fmt.Errorf("registry %s: %w", dir, err)
	}
	j, err := os.OpenFile(filepath.Join(dir, journalName), os.O_RDWR|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	// A line cut by a crash must not swallow the next one.
	if fi, err := j.Stat(); err == nil && fi.Size() > 0 {
		last := make([]byte, 1)
		if _, err := j.ReadAt(last, fi.Size()-1); err == nil && last[0] != '\n' {
			_, _ = j.Write([]byte{'\n'})
		}
	}
	r.journal = j
	return r, nil
}

// Close closes the journal.
func (r *Registry) Close() error { return r.journal.Close() }

// replay applies the journal to the in-memory manifests of the handler.
func (r *Registry) replay() error {
	f, err := os.Open(filepath.Join(r.dir, journalName))
	if errors.Is(err, os.ErrNotExist) {
		return nil
	}
	if err != nil {
		return err
	}
	defer f.Close()
	lines := bufio.NewScanner(f)
	for n := 1; lines.Scan(); n++ {
		var e journalEntry
		if err := json.Unmarshal(lines.Bytes(), &e); err != nil {
			// A line cut by a crash; the lines written after the restart
			// that followed still count.
			continue
		}
		req, err := e.request(r.dir)
		if err != nil {
			return fmt.Errorf("journal line %d: %w", n, err)
		}
		rec := httptest.NewRecorder()
		r.handler.ServeHTTP(rec, req)
		if rec.Code >= 300 && e.Op == "put" {
			return fmt.Errorf("journal line %d: putting %s:%s again: HTTP %d %s", n, e.Repo, e.Ref, rec.Code, rec.Body)
		}
	}
	return lines.Err()
}

// request is the HTTP request that applies e again.
func (e journalEntry) request(dir string) (*http.Request, error) {
	url := "/v2/" + e.Repo + "/manifests/" + e.Ref
	if e.Op == "delete" {
		return httptest.NewRequest(http.MethodDelete, url, nil), nil
	}
	h, err := v1.NewHash(e.Digest)
	if err != nil {
		return nil, err
	}
	body, err := os.ReadFile(filepath.Join(dir, blobsDirName, h.Algorithm, h.Hex))
	if err != nil {
		return nil, err
	}
	req := httptest.NewRequest(http.MethodPut, url, bytes.NewReader(body))
	req.Header.Set("Content-Type", e.MediaType)
	return req, nil
}

// ServeHTTP applies the access rule, then serves the request, writing a
// manifest put or delete to the journal once the handler took it.
func (r *Registry) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if err := r.allow(req); err != nil {
		http.Error(w, err.Error(), http.StatusForbidden)
		return
	}
	if req.URL.Path == "/v2/" || req.URL.Path == "/v2" {
		w.Header().Set(IdentityHeader, "1")
	}
	repo, ref, isManifest := manifestPath(req.URL.Path)
	if !isManifest || (req.Method != http.MethodPut && req.Method != http.MethodDelete) {
		r.handler.ServeHTTP(w, req)
		return
	}
	entry := journalEntry{Op: "delete", Repo: repo, Ref: ref}
	if req.Method == http.MethodPut {
		body, err := io.ReadAll(io.LimitReader(req.Body, maxManifestLen+1))
		if err != nil || len(body) > maxManifestLen {
			http.Error(w, "manifest unreadable or over 4 MiB", http.StatusBadRequest)
			return
		}
		h, _, _ := v1.SHA256(bytes.NewReader(body))
		if err := r.blobs.Put(req.Context(), repo, h, io.NopCloser(bytes.NewReader(body))); err != nil {
			http.Error(w, "storing the manifest: "+err.Error(), http.StatusInternalServerError)
			return
		}
		entry = journalEntry{Op: "put", Repo: repo, Ref: ref, Digest: h.String(), MediaType: req.Header.Get("Content-Type")}
		req.Body = io.NopCloser(bytes.NewReader(body))
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	sw := &statusWriter{ResponseWriter: w}
	r.handler.ServeHTTP(sw, req)
	if sw.status >= 300 {
		return
	}
	line, _ := json.Marshal(entry)
	if _, err := r.journal.Write(append(line, '\n')); err != nil {
		log.Printf("registry: the journal lost %s %s:%s (the registry forgets it at its next start): %v", entry.Op, repo, ref, err)
	}
}

// manifestPath splits /v2/<repo>/manifests/<ref>.
func manifestPath(p string) (repo, ref string, ok bool) {
	rest, ok := strings.CutPrefix(p, "/v2/")
	if !ok {
		return "", "", false
	}
	i := strings.LastIndex(rest, "/manifests/")
	if i <= 0 {
		return "", "", false
	}
	repo, ref = rest[:i], rest[i+len("/manifests/"):]
	return repo, ref, ref != "" && !strings.Contains(ref, "/")
}

// statusWriter remembers the status the handler wrote.
type statusWriter struct {
	http.ResponseWriter
	status int
}

func (s *statusWriter) WriteHeader(code int) {
	s.status = code
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// allow is the access rule of the package comment.
func (r *Registry) allow(req *http.Request) error {
	remote := hostIP(req.RemoteAddr)
	if remote != nil && remote.IsLoopback() {
		return nil
	}
	local, _ := req.Context().Value(http.LocalAddrContextKey).(net.Addr)
	var localIP net.IP
	if local != nil {
		localIP = hostIP(local.String())
	}
	if req.Method != http.MethodGet && req.Method != http.MethodHead {
		return fmt.Errorf("%s is for the host only: push from a loopback address", req.Method)
	}
	if err := netalloc.OnProviderBridge(localIP, r.interfaceOf); err != nil {
		return fmt.Errorf("the registry answers guests on the bridges of the provider's networks only: %w", err)
	}
	return nil
}

// hostIP is the IP of a host:port address, nil when it has none.
func hostIP(addr string) net.IP {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		host = addr
	}
	return net.ParseIP(host)
}

// Serve serves the registry on l until ctx ends.
func (r *Registry) Serve(ctx context.Context, l net.Listener) error {
	srv := &http.Server{Handler: r, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		<-ctx.Done()
		shutdown, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = srv.Shutdown(shutdown)
	}()
	if err := srv.Serve(l); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}
