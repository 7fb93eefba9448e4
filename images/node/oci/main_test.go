package main

import (
	"archive/tar"
	"encoding/json"
	"io"
	"os"
	"path/filepath"
	"reflect"
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
	if err := run(specPath, out, refs); err != nil {
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

func writeTar(t *testing.T, path string, content map[string]string) {
	t.Helper()
	f, err := os.Create(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	for name, body := range content {
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
