//go:build image

package manager_test

import (
	"archive/tar"
	"compress/gzip"
	"encoding/json"
	"errors"
	"io"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"slices"
	"strings"
	"syscall"
	"testing"
)

// chroot runs a program of rootfs in it with the image's environment and
// returns its output; it fails t when the program fails.
func chroot(t *testing.T, rootfs string, opts []string, args ...string) string {
	t.Helper()
	cmd := exec.Command("chroot", append(append(opts, rootfs), args...)...)
	cmd.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "HOME=/home/manager"}
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("chroot %s: %v\n%s", strings.Join(args, " "), err, out)
	}
	return string(out)
}

// readTree reads the regular files below dir by slash-separated relative path.
func readTree(t *testing.T, dir string) map[string]string {
	t.Helper()
	files := map[string]string{}
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
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

func keys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func blobBytes(files map[string]string) int {
	n := 0
	for name, data := range files {
		if strings.HasPrefix(name, "oci/blobs/") {
			n += len(data)
		}
	}
	return n
}

// imageConfig is the part of the image configuration the test checks.
type imageConfig struct {
	Created string `json:"created"`
	Config  struct {
		Entrypoint []string          `json:"Entrypoint"`
		Env        []string          `json:"Env"`
		User       string            `json:"User"`
		Labels     map[string]string `json:"Labels"`
	} `json:"config"`
}

// readImage reads the one image of the OCI layout in files (oci/): its
// configuration and its layers, compressed, base first.
func readImage(t *testing.T, files map[string]string) (imageConfig, []string) {
	t.Helper()
	blob := func(digest string) string {
		data, ok := files["oci/blobs/"+strings.Replace(digest, ":", "/", 1)]
		if !ok {
			t.Fatalf("blob %s is not in the layout", digest)
		}
		return data
	}
	var index struct {
		Manifests []struct {
			Digest      string            `json:"digest"`
			Annotations map[string]string `json:"annotations"`
		} `json:"manifests"`
	}
	if err := json.Unmarshal([]byte(files["oci/index.json"]), &index); err != nil || len(index.Manifests) != 1 {
		t.Fatalf("index.json: %v, want one image:\n%s", err, files["oci/index.json"])
	}
	m := index.Manifests[0]
	if want := strings.TrimSpace(files["digest"]); m.Digest != want {
		t.Errorf("the layout's image is %s, the digest file says %s", m.Digest, want)
	}
	if got := m.Annotations["io.containerd.image.name"]; got != ref {
		t.Errorf("the layout names the image %q for containerd, want %s", got, ref)
	}
	var manifest struct {
		Config struct{ Digest string }   `json:"config"`
		Layers []struct{ Digest string } `json:"layers"`
	}
	if err := json.Unmarshal([]byte(blob(m.Digest)), &manifest); err != nil {
		t.Fatal(err)
	}
	var config imageConfig
	if err := json.Unmarshal([]byte(blob(manifest.Config.Digest)), &config); err != nil {
		t.Fatal(err)
	}
	var layers []string
	for _, l := range manifest.Layers {
		layers = append(layers, blob(l.Digest))
	}
	if len(layers) != 2 {
		t.Errorf("%d layers, want 2 (Debian packages, manager)", len(layers))
	}
	return config, layers
}

// layerModes reads the permission bits of a gzip-compressed layer's
// entries, by absolute path.
func layerModes(t *testing.T, layer string) map[string]int64 {
	t.Helper()
	zr, err := gzip.NewReader(strings.NewReader(layer))
	if err != nil {
		t.Fatal(err)
	}
	modes := map[string]int64{}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return modes
		}
		if err != nil {
			t.Fatal(err)
		}
		modes[path.Clean("/"+h.Name)] = h.Mode & 0o7777
	}
}

// extract unpacks a gzip-compressed layer into rootfs as a container runtime
// would, with owners and modes; the image has no whiteouts to apply.
func extract(t *testing.T, rootfs, layer string) {
	t.Helper()
	zr, err := gzip.NewReader(strings.NewReader(layer))
	if err != nil {
		t.Fatal(err)
	}
	tr := tar.NewReader(zr)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			return
		}
		if err != nil {
			t.Fatal(err)
		}
		name := filepath.Clean("/" + h.Name)
		if strings.HasPrefix(filepath.Base(name), ".wh.") {
			t.Fatalf("whiteout %s: a layer of this image deletes nothing", h.Name)
		}
		p := filepath.Join(rootfs, name)
		switch h.Typeflag {
		case tar.TypeDir:
			err = os.MkdirAll(p, 0o755)
		case tar.TypeReg:
			os.Remove(p) // a hard link's other names keep their content
			var f *os.File
			if f, err = os.OpenFile(p, os.O_CREATE|os.O_EXCL|os.O_WRONLY, 0o600); err == nil {
				_, err = io.Copy(f, tr)
				if cerr := f.Close(); err == nil {
					err = cerr
				}
			}
		case tar.TypeSymlink:
			os.Remove(p)
			err = os.Symlink(h.Linkname, p)
		case tar.TypeLink:
			os.Remove(p)
			err = os.Link(filepath.Join(rootfs, filepath.Clean("/"+h.Linkname)), p)
		default:
			t.Fatalf("%s: unexpected type %c", h.Name, h.Typeflag)
		}
		if err == nil {
			err = os.Lchown(p, h.Uid, h.Gid)
		}
		// After the owner, which clears setuid and setgid bits.
		if err == nil && h.Typeflag != tar.TypeSymlink && h.Typeflag != tar.TypeLink {
			err = syscall.Chmod(p, uint32(h.Mode&0o7777))
		}
		if err != nil {
			t.Fatalf("%s: %v", h.Name, err)
		}
	}
}
