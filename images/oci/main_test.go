package main

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
	"sort"
	"strings"
	"testing"
)

func TestParents(t *testing.T) {
	for _, tc := range []struct {
		path string
		want []string
	}{
		{"pause", nil},
		{"usr/local/bin/etcd", []string{"usr", "usr/local", "usr/local/bin"}},
		{"opt/bin/flanneld", []string{"opt", "opt/bin"}},
	} {
		if got := parents(tc.path); !reflect.DeepEqual(got, tc.want) {
			t.Errorf("parents(%q) = %v, want %v", tc.path, got, tc.want)
		}
	}
}

// TestRunWritesNamedImagesSharingTheBase writes two images on one base tar
// and checks the OCI layout: each manifest named by containerd's annotation
// with the digest reported in refs, the base layer stored once, the files at
// their paths with their modes.
func TestRunWritesNamedImagesSharingTheBase(t *testing.T) {
	dir := t.TempDir()
	base := filepath.Join(dir, "base.tar")
	writeTar(t, base, map[string]string{"bin/sh": "shell"})
	bin := filepath.Join(dir, "tool")
	if err := os.WriteFile(bin, []byte("binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	spec := Spec{Images: []ImageSpec{
		{Ref: "registry.k8s.io/kube-proxy:v1.36.3", BaseTar: base, Files: []File{{Src: bin, Dst: "/usr/local/bin/kube-proxy"}}, Entrypoint: []string{"/usr/local/bin/kube-proxy"}},
		{Ref: "ghcr.io/flannel-io/flannel:v0.28.10", BaseTar: base, Files: []File{{Src: bin, Dst: "/opt/bin/flanneld", Mode: 0o700}}},
	}}
	specPath := filepath.Join(dir, "spec.json")
	data, _ := json.Marshal(spec)
	if err := os.WriteFile(specPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	out, refs := filepath.Join(dir, "images.tar"), filepath.Join(dir, "refs.txt")
	if err := run(specPath, output{Tar: out, Refs: refs, GzipLevel: gzip.BestSpeed}); err != nil {
		t.Fatal(err)
	}

	files := readTar(t, out)
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal([]byte(files["index.json"]), &index); err != nil {
		t.Fatal(err)
	}
	named := map[string]string{}
	for _, m := range index.Manifests {
		named[m.Annotations[containerdImageName]] = m.Digest
	}
	refLines, err := os.ReadFile(refs)
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(strings.TrimSpace(string(refLines)), "\n") {
		ref, digest, _ := strings.Cut(line, " ")
		if named[ref] != digest {
			t.Errorf("refs says %s is %s, the layout names %q", ref, digest, named[ref])
		}
	}
	if len(named) != 2 {
		t.Fatalf("layout names %v, want the 2 images", named)
	}

	// Blobs: 2 manifests, 2 configs, 1 shared base layer, 2 file layers.
	blobs := 0
	for name := range files {
		if strings.HasPrefix(name, "blobs/sha256/") {
			blobs++
		}
	}
	if blobs != 7 {
		t.Errorf("%d blobs, want 7 (the base layer once)", blobs)
	}
}

// TestRunIsReproducible writes one image twice, from inputs with the same
// content at different paths, into fresh directories: the layouts must be the
// same bytes, whichever outputs were asked for.
func TestRunIsReproducible(t *testing.T) {
	build := func(t *testing.T, out func(dir string) output) (map[string]string, string) {
		dir := t.TempDir()
		base := filepath.Join(dir, "base.tar")
		writeTar(t, base, map[string]string{"bin/sh": "shell", "etc/passwd": "root:x:0:0::/root:/bin/sh\n"})
		bin := filepath.Join(dir, "manager")
		if err := os.WriteFile(bin, []byte("binary"), 0o644); err != nil {
			t.Fatal(err)
		}
		spec := Spec{Images: []ImageSpec{{
			Ref: "example.org/capl/manager:v0.1.0", BaseTar: base,
			Files:      []File{{Src: bin, Dst: "/manager"}},
			Entrypoint: []string{"/manager"}, User: "65532:65532",
			Labels: map[string]string{"org.opencontainers.image.version": "v0.1.0"},
		}}}
		specPath := filepath.Join(dir, "spec.json")
		data, _ := json.Marshal(spec)
		if err := os.WriteFile(specPath, data, 0o644); err != nil {
			t.Fatal(err)
		}
		o := out(dir)
		o.Refs = filepath.Join(dir, "refs.txt")
		if err := run(specPath, o); err != nil {
			t.Fatal(err)
		}
		refs, err := os.ReadFile(o.Refs)
		if err != nil {
			t.Fatal(err)
		}
		if o.Tar != "" {
			return readTar(t, o.Tar), string(refs)
		}
		return readDir(t, o.Dir), string(refs)
	}
	for _, tc := range []struct {
		name string
		out  func(dir string) output
	}{
		{"tarball", func(dir string) output {
			return output{Tar: filepath.Join(dir, "image.tar"), GzipLevel: gzip.BestSpeed}
		}},
		{"directory", func(dir string) output {
			return output{Dir: filepath.Join(dir, "oci"), GzipLevel: gzip.BestCompression}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			first, firstRefs := build(t, tc.out)
			second, secondRefs := build(t, tc.out)
			if firstRefs != secondRefs {
				t.Errorf("digests differ:\n%s\n%s", firstRefs, secondRefs)
			}
			if !reflect.DeepEqual(first, second) {
				t.Errorf("layouts differ: %v and %v", keys(first), keys(second))
			}
			if _, ok := first["oci-layout"]; !ok {
				t.Errorf("no oci-layout file in %v", keys(first))
			}
		})
	}
}

// TestRunWritesTheConfiguration checks the image configuration of a layout
// directory written over an older one: the spec's fields, the fixed
// timestamps, and nothing of the old layout left.
func TestRunWritesTheConfiguration(t *testing.T) {
	dir := t.TempDir()
	bin := filepath.Join(dir, "manager")
	if err := os.WriteFile(bin, []byte("binary"), 0o644); err != nil {
		t.Fatal(err)
	}
	want := ImageSpec{
		Ref: "example.org/capl/manager:v0.1.0", Files: []File{{Src: bin, Dst: "/manager"}},
		Entrypoint: []string{"/manager"}, User: "65532:65532", Env: []string{"HOME=/home/manager"},
		Labels: map[string]string{"org.opencontainers.image.revision": "0123abc"},
	}
	specPath := filepath.Join(dir, "spec.json")
	data, _ := json.Marshal(Spec{Images: []ImageSpec{want}})
	if err := os.WriteFile(specPath, data, 0o644); err != nil {
		t.Fatal(err)
	}
	layoutDir := filepath.Join(dir, "oci")
	if err := os.MkdirAll(filepath.Join(layoutDir, "blobs"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(layoutDir, "stale"), nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := run(specPath, output{Dir: layoutDir, GzipLevel: gzip.BestSpeed}); err != nil {
		t.Fatal(err)
	}
	files := readDir(t, layoutDir)
	if _, ok := files["stale"]; ok {
		t.Error("the old layout's files are still there")
	}
	err := filepath.WalkDir(layoutDir, func(p string, d os.DirEntry, err error) error {
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		if want := map[bool]os.FileMode{true: 0o755, false: 0o644}[d.IsDir()]; info.Mode().Perm() != want {
			t.Errorf("%s: mode %v, want %v", p, info.Mode().Perm(), want)
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var index, manifest struct {
		Manifests []struct{ Digest string } `json:"manifests"`
		Config    struct{ Digest string }   `json:"config"`
	}
	blob := func(digest string) string { return files["blobs/"+strings.Replace(digest, ":", "/", 1)] }
	if err := json.Unmarshal([]byte(files["index.json"]), &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, %s", err, files["index.json"])
	}
	if err := json.Unmarshal([]byte(blob(index.Manifests[0].Digest)), &manifest); err != nil {
		t.Fatal(err)
	}
	var config struct {
		Created string `json:"created"`
		Config  struct {
			Entrypoint []string
			Env        []string
			User       string
			Labels     map[string]string
		} `json:"config"`
		History []struct {
			Created   string `json:"created"`
			CreatedBy string `json:"created_by"`
		} `json:"history"`
	}
	if err := json.Unmarshal([]byte(blob(manifest.Config.Digest)), &config); err != nil {
		t.Fatal(err)
	}
	const created = "1970-01-01T00:00:00Z"
	for _, tc := range []struct {
		field     string
		got, want any
	}{
		{"created", config.Created, created},
		{"entrypoint", config.Config.Entrypoint, want.Entrypoint},
		{"env", config.Config.Env, want.Env},
		{"user", config.Config.User, want.User},
		{"labels", config.Config.Labels, want.Labels},
		{"history", len(config.History), 1},
	} {
		if !reflect.DeepEqual(tc.got, tc.want) {
			t.Errorf("%s = %v, want %v", tc.field, tc.got, tc.want)
		}
	}
	if h := config.History[0]; h.Created != created || h.CreatedBy != "images/oci: /manager" {
		t.Errorf("history %+v, want created %s by \"images/oci: /manager\"", h, created)
	}
}

func keys(m map[string]string) []string {
	var out []string
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// readDir reads the regular files below dir, by slash-separated relative path.
func readDir(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d os.DirEntry, err error) error {
		if err != nil || !d.Type().IsRegular() {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		data, err := os.ReadFile(p)
		files[filepath.ToSlash(rel)] = string(data)
		return err
	})
	if err != nil {
		t.Fatal(err)
	}
	return files
}

func writeTar(t *testing.T, path string, content map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for _, name := range keys(content) { // sorted: the same content, the same bytes
		body := content[name]
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o755, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
			t.Fatal(err)
		}
		if _, err := io.WriteString(tw, body); err != nil {
			t.Fatal(err)
		}
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}

func readTar(t *testing.T, path string) map[string]string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	files := map[string]string{}
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag != tar.TypeReg {
			continue
		}
		body, err := io.ReadAll(tr)
		if err != nil {
			t.Fatal(err)
		}
		files[h.Name] = string(body)
	}
}
