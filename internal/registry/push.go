package registry

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"

	v1 "github.com/google/go-containerregistry/pkg/v1"
)

// containerdImageName is the annotation an OCI image layout's index gives
// the full reference of an image (images/oci writes it; `ctr images
// import` reads it); org.opencontainers.image.ref.name holds only a tag.
const containerdImageName = "io.containerd.image.name"

// PushLayout pushes every image the OCI image layout in dir names
// (index.json's manifests with an io.containerd.image.name annotation) to
// the registry at baseURL (http://127.0.0.1:<port>), each under its
// reference without the registry host, as containerd asks a mirror for
// it. It returns the references pushed.
func PushLayout(ctx context.Context, baseURL, dir string) ([]string, error) {
	index, err := readIndex(dir)
	if err != nil {
		return nil, err
	}
	p := pusher{ctx: ctx, base: strings.TrimSuffix(baseURL, "/"), dir: dir}
	var pushed []string
	for _, d := range index.Manifests {
		name := d.Annotations[containerdImageName]
		if name == "" {
			continue
		}
		repo, ref, err := MirrorPath(name)
		if err != nil {
			return pushed, err
		}
		if ref == "" {
			ref = d.Digest.String()
		}
		if err := p.manifest(repo, ref, d); err != nil {
			return pushed, fmt.Errorf("pushing %s: %w", name, err)
		}
		pushed = append(pushed, name)
	}
	if len(pushed) == 0 {
		return nil, fmt.Errorf("%s names no image (no %s annotation in index.json)", dir, containerdImageName)
	}
	return pushed, nil
}

// MirrorPath is where a mirror serves the image reference name: its
// repository without the registry host, and its tag (empty for a
// reference by digest alone). Docker Hub's one-word names get library/,
// as Docker and containerd normalize them.
func MirrorPath(name string) (repo, tag string, err error) {
	rest, _, _ := strings.Cut(name, "@")
	if i := strings.LastIndex(rest, ":"); i > strings.LastIndex(rest, "/") {
		rest, tag = rest[:i], rest[i+1:]
	}
	host, path := "docker.io", rest
	if first, after, ok := strings.Cut(rest, "/"); ok && (strings.ContainsAny(first, ".:") || first == "localhost") {
		host, path = first, after
	}
	if path == "" || strings.HasPrefix(path, "/") || strings.HasSuffix(path, "/") || strings.Contains(path, "//") {
		return "", "", fmt.Errorf("image reference %q has no repository", name)
	}
	if host == "docker.io" && !strings.Contains(path, "/") {
		path = "library/" + path
	}
	return path, tag, nil
}

type pusher struct {
	ctx  context.Context
	base string
	dir  string
}

// manifest pushes what the manifest d refers to, then d itself as
// repo:ref.
func (p pusher) manifest(repo, ref string, d v1.Descriptor) error {
	body, err := p.read(d.Digest)
	if err != nil {
		return err
	}
	switch {
	case d.MediaType.IsIndex():
		var index v1.IndexManifest
		if err := json.Unmarshal(body, &index); err != nil {
			return fmt.Errorf("index %s: %w", d.Digest, err)
		}
		for _, child := range index.Manifests {
			if err := p.manifest(repo, child.Digest.String(), child); err != nil {
				return err
			}
		}
	case d.MediaType.IsImage():
		var m v1.Manifest
		if err := json.Unmarshal(body, &m); err != nil {
			return fmt.Errorf("manifest %s: %w", d.Digest, err)
		}
		for _, blob := range append([]v1.Descriptor{m.Config}, m.Layers...) {
			if err := p.blob(repo, blob.Digest); err != nil {
				return err
			}
		}
	default:
		return fmt.Errorf("manifest %s has media type %q, neither an image nor an index", d.Digest, d.MediaType)
	}
	return p.do(http.MethodPut, "/v2/"+repo+"/manifests/"+ref, string(d.MediaType), body, http.StatusCreated)
}

// blob uploads a blob in one request, unless the registry has it.
func (p pusher) blob(repo string, h v1.Hash) error {
	if err := p.do(http.MethodHead, "/v2/"+repo+"/blobs/"+h.String(), "", nil, http.StatusOK); err == nil {
		return nil
	}
	f, err := os.Open(p.path(h))
	if err != nil {
		return err
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return err
	}
	req, err := http.NewRequestWithContext(p.ctx, http.MethodPost, p.base+"/v2/"+repo+"/blobs/uploads/?digest="+h.String(), f)
	if err != nil {
		return err
	}
	req.ContentLength = fi.Size()
	req.Header.Set("Content-Type", "application/octet-stream")
	return send(req, http.StatusCreated)
}

func (p pusher) do(method, path, contentType string, body []byte, want int) error {
	var r io.Reader
	if body != nil {
		r = bytes.NewReader(body)
	}
	req, err := http.NewRequestWithContext(p.ctx, method, p.base+path, r)
	if err != nil {
		return err
	}
	if contentType != "" {
		req.Header.Set("Content-Type", contentType)
	}
	return send(req, want)
}

func send(req *http.Request, want int) error {
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != want {
		msg, _ := io.ReadAll(io.LimitReader(resp.Body, 1024))
		return fmt.Errorf("%s %s: HTTP %d %s", req.Method, req.URL.Path, resp.StatusCode, strings.TrimSpace(string(msg)))
	}
	return nil
}

// path is the layout's file of blob h.
func (p pusher) path(h v1.Hash) string {
	return filepath.Join(p.dir, "blobs", h.Algorithm, h.Hex)
}

// read reads a manifest of the layout, checking its digest.
func (p pusher) read(h v1.Hash) ([]byte, error) {
	body, err := os.ReadFile(p.path(h))
	if err != nil {
		return nil, err
	}
	if got, _, _ := v1.SHA256(bytes.NewReader(body)); got != h {
		return nil, fmt.Errorf("%s holds %s, not %s", p.path(h), got, h)
	}
	return body, nil
}

// readIndex reads the layout's index.json.
func readIndex(dir string) (*v1.IndexManifest, error) {
	name := filepath.Join(dir, "index.json")
	f, err := os.Open(name)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("%s is not an OCI image layout (no index.json): %w", dir, err)
		}
		return nil, err
	}
	defer f.Close()
	var index v1.IndexManifest
	if err := json.NewDecoder(f).Decode(&index); err != nil {
		return nil, fmt.Errorf("%s: %w", name, err)
	}
	return &index, nil
}
