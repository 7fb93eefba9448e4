package registry

import (
	"context"
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
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/remote"
	"github.com/google/go-containerregistry/pkg/v1/validate"
)

func TestMirrorPath(t *testing.T) {
	for _, tc := range []struct {
		ref, repo, tag, err string
	}{
		{ref: "ghcr.io/capi-libvirt/cluster-api-provider-libvirt:v0.1.0", repo: "capi-libvirt/cluster-api-provider-libvirt", tag: "v0.1.0"},
		{ref: "registry.k8s.io/cluster-api/cluster-api-controller:v1.14.2", repo: "cluster-api/cluster-api-controller", tag: "v1.14.2"},
		{ref: "localhost:5050/team/app:dev", repo: "team/app", tag: "dev"},
		{ref: "localhost/capl-manager:dev", repo: "capl-manager", tag: "dev"},
		{ref: "nginx:1.27", repo: "library/nginx", tag: "1.27"},
		{ref: "docker.io/nginx", repo: "library/nginx"},
		{ref: "quay.io/jetstack/cert-manager-controller@sha256:" + strings.Repeat("a", 64), repo: "jetstack/cert-manager-controller"},
		{ref: "quay.io/", err: "no repository"},
	} {
		t.Run(tc.ref, func(t *testing.T) {
			repo, tag, err := MirrorPath(tc.ref)
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("MirrorPath(%q) = %q, %q, %v; want an error with %q", tc.ref, repo, tag, err, tc.err)
				}
				return
			}
			if err != nil || repo != tc.repo || tag != tc.tag {
				t.Fatalf("MirrorPath(%q) = %q, %q, %v; want %q, %q", tc.ref, repo, tag, err, tc.repo, tc.tag)
			}
		})
	}
}

func TestAllow(t *testing.T) {
	interfaces := map[string]string{"10.77.0.1": "capl0123456789a", "192.168.1.5": "eth0", "10.88.0.1": "virbr0"}
	r := &Registry{interfaceOf: func(ip net.IP) (string, error) {
		if name, ok := interfaces[ip.String()]; ok {
			return name, nil
		}
		return "", fmt.Errorf("no interface holds %s", ip)
	}}
	for _, tc := range []struct {
		name, method, remote, local string
		allowed                     bool
	}{
		{name: "the host pushes", method: http.MethodPut, remote: "127.0.0.1:40000", local: "127.0.0.1:5050", allowed: true},
		{name: "the host pulls over IPv6 loopback", method: http.MethodGet, remote: "[::1]:40000", local: "[::1]:5050", allowed: true},
		{name: "a guest pulls through its network's bridge", method: http.MethodGet, remote: "10.77.0.12:40000", local: "10.77.0.1:5050", allowed: true},
		{name: "a guest asks for a blob's size", method: http.MethodHead, remote: "10.77.0.12:40000", local: "10.77.0.1:5050", allowed: true},
		{name: "a guest may not push", method: http.MethodPut, remote: "10.77.0.12:40000", local: "10.77.0.1:5050"},
		{name: "a guest may not start an upload", method: http.MethodPost, remote: "10.77.0.12:40000", local: "10.77.0.1:5050"},
		{name: "a guest may not delete", method: http.MethodDelete, remote: "10.77.0.12:40000", local: "10.77.0.1:5050"},
		{name: "the LAN may not pull", method: http.MethodGet, remote: "192.168.1.9:40000", local: "192.168.1.5:5050"},
		{name: "another libvirt network may not pull", method: http.MethodGet, remote: "10.88.0.7:40000", local: "10.88.0.1:5050"},
		{name: "an address no interface holds", method: http.MethodGet, remote: "10.99.0.7:40000", local: "10.99.0.1:5050"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			req := httptest.NewRequest(tc.method, "/v2/", nil)
			req.RemoteAddr = tc.remote
			local, err := net.ResolveTCPAddr("tcp", tc.local)
			if err != nil {
				t.Fatal(err)
			}
			req = req.WithContext(context.WithValue(req.Context(), http.LocalAddrContextKey, local))
			if err := r.allow(req); (err == nil) != tc.allowed {
				t.Fatalf("allow(%s from %s to %s) = %v; allowed: %v", tc.method, tc.remote, tc.local, err, tc.allowed)
			}
		})
	}
}

// TestPushPullRestart pushes an image layout with PushLayout, pulls it
// with go-containerregistry's client (which checks every digest), then
// opens the registry again on the same directory, as a restarted plane
// does, after a crash cut the journal's last line: the image is still
// served, and a tag deleted after that restart stays deleted.
func TestPushPullRestart(t *testing.T) {
	ctx := t.Context()
	img, err := random.Image(4096, 3)
	if err != nil {
		t.Fatal(err)
	}
	src := writeLayout(t, img, "ghcr.io/capi-libvirt/cluster-api-provider-libvirt:v0.1.0")
	dir := t.TempDir()

	url, stop := serve(t, dir)
	pushed, err := PushLayout(ctx, url, src)
	if err != nil {
		t.Fatal(err)
	}
	if len(pushed) != 1 || pushed[0] != "ghcr.io/capi-libvirt/cluster-api-provider-libvirt:v0.1.0" {
		t.Fatalf("pushed %v", pushed)
	}
	resp, err := http.Get(url + "/v2/")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.Header.Get(IdentityHeader) == "" {
		t.Fatalf("/v2/ answered without %s: %v", IdentityHeader, resp.Header)
	}
	// Pushing again finds every blob there and only puts the manifest.
	if _, err := PushLayout(ctx, url, src); err != nil {
		t.Fatalf("pushing again: %v", err)
	}
	mirrored := strings.TrimPrefix(url, "http://") + "/capi-libvirt/cluster-api-provider-libvirt:v0.1.0"
	pull(t, mirrored, img)
	stop()
	// A plane killed while it wrote the journal leaves a line cut short.
	j, err := os.OpenFile(filepath.Join(dir, journalName), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := j.WriteString(`{"op":"put","repo":"cut`); err != nil {
		t.Fatal(err)
	}
	j.Close()

	url, stop = serve(t, dir)
	mirrored = strings.TrimPrefix(url, "http://") + "/capi-libvirt/cluster-api-provider-libvirt:v0.1.0"
	pull(t, mirrored, img)
	ref, err := name.ParseReference(mirrored, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if err := remote.Delete(ref, remote.WithContext(ctx)); err != nil {
		t.Fatalf("deleting the tag: %v", err)
	}
	stop()

	url, stop = serve(t, dir)
	defer stop()
	ref, err = name.ParseReference(strings.TrimPrefix(url, "http://")+"/capi-libvirt/cluster-api-provider-libvirt:v0.1.0", name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := remote.Image(ref, remote.WithContext(ctx)); err == nil {
		t.Fatal("the deleted tag is served again after a restart")
	}
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	pull(t, strings.TrimPrefix(url, "http://")+"/capi-libvirt/cluster-api-provider-libvirt@"+digest.String(), img)
}

// TestPushLayoutRefusesBadLayouts: a layout whose blob does not match its
// digest, or that names no image, is refused with the reason.
func TestPushLayoutRefusesBadLayouts(t *testing.T) {
	url, stop := serve(t, t.TempDir())
	defer stop()
	img, err := random.Image(1024, 1)
	if err != nil {
		t.Fatal(err)
	}

	unnamed := t.TempDir()
	p, err := layout.Write(unnamed, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img); err != nil {
		t.Fatal(err)
	}
	if _, err := PushLayout(t.Context(), url, unnamed); err == nil || !strings.Contains(err.Error(), "names no image") {
		t.Fatalf("a layout naming no image: %v", err)
	}

	tampered := writeLayout(t, img, "example.com/app:v1")
	digest, err := img.Digest()
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(tampered, "blobs", "sha256", digest.Hex), []byte(`{"schemaVersion":2}`), 0o644); err != nil {
		t.Fatal(err)
	}
	if _, err := PushLayout(t.Context(), url, tampered); err == nil || !strings.Contains(err.Error(), "not "+digest.String()) {
		t.Fatalf("a manifest that is not its digest: %v", err)
	}

	if _, err := PushLayout(t.Context(), url, t.TempDir()); err == nil || !strings.Contains(err.Error(), "not an OCI image layout") {
		t.Fatalf("an empty directory: %v", err)
	}
}

// TestNodeImageLooksForDefaultPort: the node image's mirror unit probes
// the port the plane serves by default.
func TestNodeImageLooksForDefaultPort(t *testing.T) {
	script, err := os.ReadFile("../../images/node/customize-node.sh")
	if err != nil {
		t.Fatal(err)
	}
	if want := fmt.Sprintf("\nport=%d\n", DefaultPort); !strings.Contains(string(script), want) {
		t.Fatalf("images/node/customize-node.sh has no %q: the node image would look for the registry elsewhere", strings.TrimSpace(want))
	}
	if !strings.Contains(strings.ToLower(string(script)), strings.ToLower(IdentityHeader)) {
		t.Fatalf("images/node/customize-node.sh does not check the %s header", IdentityHeader)
	}
}

// writeLayout writes img into a new OCI image layout, named ref as
// images/oci names its images.
func writeLayout(t *testing.T, img v1.Image, ref string) string {
	t.Helper()
	dir := t.TempDir()
	p, err := layout.Write(dir, empty.Index)
	if err != nil {
		t.Fatal(err)
	}
	if err := p.AppendImage(img, layout.WithAnnotations(map[string]string{containerdImageName: ref})); err != nil {
		t.Fatal(err)
	}
	return dir
}

// serve opens the registry in dir and serves it on a loopback port until
// stop.
func serve(t *testing.T, dir string) (url string, stop func()) {
	t.Helper()
	r, err := Open(dir, log.New(io.Discard, "", 0))
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, l) }()
	return "http://" + l.Addr().String(), func() {
		cancel()
		if err := <-done; err != nil && !errors.Is(err, net.ErrClosed) {
			t.Errorf("serving: %v", err)
		}
		if err := r.Close(); err != nil {
			t.Errorf("closing: %v", err)
		}
	}
}

// pull pulls ref with go-containerregistry's client and checks it is img,
// every layer read and its digest checked.
func pull(t *testing.T, ref string, img v1.Image) {
	t.Helper()
	r, err := name.ParseReference(ref, name.Insecure)
	if err != nil {
		t.Fatal(err)
	}
	got, err := remote.Image(r, remote.WithContext(t.Context()))
	if err != nil {
		t.Fatalf("pulling %s: %v", ref, err)
	}
	if err := validate.Image(got); err != nil {
		t.Fatalf("pulled %s: %v", ref, err)
	}
	want, _ := img.Digest()
	if d, _ := got.Digest(); d != want {
		t.Fatalf("pulled %s as %s, pushed %s", ref, d, want)
	}
}
