// Command oci writes container images, from binaries and root file systems
// built offline, into an OCI image layout: a tarball, a directory or both. The
// node image's container images (images/node/containers.sh) and the manager's
// image (images/manager/build.sh) are written with it. Each image carries its
// reference in the io.containerd.image.name annotation, so `ctr images import`
// names it exactly so and keeps its manifest digest.
//
//	oci -spec images.json [-out images.tar] [-layout DIR] [-refs refs.txt] [-gzip-level N]
//
// The spec lists the images: for each, its reference, an optional root file
// system tarball used as the first layer (shared between images that name the
// same file), the files of a second layer, and the image configuration.
// Everything is written with a fixed timestamp (SOURCE_DATE_EPOCH), so the same
// inputs give the same image digests. refs.txt gets one "reference digest" line
// per image.
package main

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"log"
	"os"
	"path"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	ocispec "github.com/opencontainers/image-spec/specs-go/v1"
)

// Spec is the input file: the images to write.
type Spec struct {
	// Images are written in this order; their references must be distinct.
	Images []ImageSpec `json:"images"`
}

// ImageSpec describes one image.
type ImageSpec struct {
	// Ref is the image reference as the container runtime will be asked for
	// it, e.g. registry.k8s.io/kube-apiserver:v1.36.3.
	Ref string `json:"ref"`
	// BaseTar is a root file system tarball that becomes the first layer;
	// empty for images holding only Files (a static binary).
	BaseTar string `json:"baseTar,omitempty"`
	// Files become the image's last layer.
	Files []File `json:"files"`
	// Entrypoint, Cmd, Env, User and WorkingDir are the image configuration.
	Entrypoint []string `json:"entrypoint,omitempty"`
	Cmd        []string `json:"cmd,omitempty"`
	Env        []string `json:"env,omitempty"`
	User       string   `json:"user,omitempty"`
	WorkingDir string   `json:"workingDir,omitempty"`
	// Labels are the configuration's labels, e.g. org.opencontainers.image.*.
	Labels map[string]string `json:"labels,omitempty"`
}

// File is one file of a layer.
type File struct {
	// Src is the file on the build host; Dst its absolute path in the image.
	Src string `json:"src"`
	Dst string `json:"dst"`
	// Mode is the permission bits, 0755 when zero.
	Mode int64 `json:"mode,omitempty"`
}

// containerdImageName is the annotation containerd's importer names an image
// by; org.opencontainers.image.ref.name alone would only give it a tag.
const containerdImageName = "io.containerd.image.name"

// epoch is the timestamp of every file and image: SOURCE_DATE_EPOCH, as the
// root file systems of the node image are built.
var epoch = time.Unix(0, 0).UTC()

// output says where run writes the images and how it compresses layers.
type output struct {
	// Tar is the OCI image layout tarball to write, Dir the OCI image layout
	// directory (replaced); at least one is set.
	Tar, Dir string
	// Refs, if set, gets one "reference digest" line per image.
	Refs string
	// GzipLevel compresses every layer: the node image favours build time
	// (gzip.BestSpeed), a pushed image its size.
	GzipLevel int
}

func main() {
	specPath := flag.String("spec", "", "JSON file listing the images")
	var out output
	flag.StringVar(&out.Tar, "out", "", "OCI image layout tarball to write")
	flag.StringVar(&out.Dir, "layout", "", "OCI image layout directory to write (replaced)")
	flag.StringVar(&out.Refs, "refs", "", "file to write \"reference digest\" lines to")
	flag.IntVar(&out.GzipLevel, "gzip-level", gzip.BestSpeed, "gzip level of the layers")
	flag.Parse()
	if *specPath == "" || (out.Tar == "" && out.Dir == "") {
		flag.Usage()
		os.Exit(2)
	}
	if v := os.Getenv("SOURCE_DATE_EPOCH"); v != "" {
		var secs int64
		if _, err := fmt.Sscan(v, &secs); err != nil {
			log.Fatalf("SOURCE_DATE_EPOCH %q: %v", v, err)
		}
		epoch = time.Unix(secs, 0).UTC()
	}
	if err := run(*specPath, out); err != nil {
		log.Fatal(err)
	}
}

func run(specPath string, out output) error {
	data, err := os.ReadFile(specPath)
	if err != nil {
		return err
	}
	var spec Spec
	if err := json.Unmarshal(data, &spec); err != nil {
		return fmt.Errorf("%s: %w", specPath, err)
	}
	// The layout is written next to its destination, then renamed into place.
	next := out.Dir
	if next == "" {
		next = out.Tar
	}
	dir, err := os.MkdirTemp(path.Dir(next), ".oci-layout-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)
	lp, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	seen := map[string]bool{}
	bases := map[string]v1.Layer{}
	var refs []string
	for _, s := range spec.Images {
		ref, err := name.NewTag(s.Ref, name.StrictValidation)
		if err != nil {
			return fmt.Errorf("image %q: %w", s.Ref, err)
		}
		if seen[ref.String()] {
			return fmt.Errorf("image %q listed twice", s.Ref)
		}
		seen[ref.String()] = true
		img, err := build(s, bases, out.GzipLevel)
		if err != nil {
			return fmt.Errorf("image %s: %w", s.Ref, err)
		}
		digest, err := img.Digest()
		if err != nil {
			return err
		}
		if err := lp.AppendImage(img, layout.WithAnnotations(map[string]string{
			containerdImageName:       ref.String(),
			ocispec.AnnotationRefName: ref.TagStr(),
		})); err != nil {
			return err
		}
		refs = append(refs, fmt.Sprintf("%s %s", s.Ref, digest))
	}
	if err := shareable(dir); err != nil {
		return err
	}
	if out.Tar != "" {
		if err := writeAtomic(out.Tar, func(f *os.File) error { return tarDir(dir, f) }); err != nil {
			return err
		}
	}
	if out.Dir != "" {
		if err := os.RemoveAll(out.Dir); err != nil {
			return err
		}
		if err := os.Rename(dir, out.Dir); err != nil {
			return err
		}
	}
	if out.Refs == "" {
		return nil
	}
	sort.Strings(refs)
	return writeAtomic(out.Refs, func(f *os.File) error {
		_, err := io.WriteString(f, strings.Join(refs, "\n")+"\n")
		return err
	})
}

// build assembles one image: base layer, file layer, configuration.
func build(s ImageSpec, bases map[string]v1.Layer, level int) (v1.Image, error) {
	// Each layer's history entry says what it holds, never where it was
	// built: the digest must not depend on the build's directories.
	var layers []mutate.Addendum
	if s.BaseTar != "" {
		base, ok := bases[s.BaseTar]
		if !ok {
			var err error
			if base, err = tarball.LayerFromFile(s.BaseTar, tarball.WithCompressionLevel(level)); err != nil {
				return nil, err
			}
			bases[s.BaseTar] = base
		}
		layers = append(layers, mutate.Addendum{Layer: base, History: v1.History{
			Created: v1.Time{Time: epoch}, CreatedBy: "images/oci: root file system",
		}})
	}
	if len(s.Files) > 0 {
		layer, err := fileLayer(s.Files, level)
		if err != nil {
			return nil, err
		}
		var dsts []string
		for _, f := range s.Files {
			dsts = append(dsts, path.Clean(f.Dst))
		}
		layers = append(layers, mutate.Addendum{Layer: layer, History: v1.History{
			Created: v1.Time{Time: epoch}, CreatedBy: "images/oci: " + strings.Join(dsts, " "),
		}})
	}
	if len(layers) == 0 {
		return nil, errors.New("no baseTar and no files")
	}
	img, err := mutate.Append(empty.Image, layers...)
	if err != nil {
		return nil, err
	}
	cfg, err := img.ConfigFile()
	if err != nil {
		return nil, err
	}
	cfg = cfg.DeepCopy()
	cfg.Architecture, cfg.OS = "amd64", "linux"
	cfg.Created = v1.Time{Time: epoch}
	cfg.Config.Entrypoint = s.Entrypoint
	cfg.Config.Cmd = s.Cmd
	cfg.Config.Env = s.Env
	cfg.Config.User = s.User
	cfg.Config.WorkingDir = s.WorkingDir
	cfg.Config.Labels = s.Labels
	if img, err = mutate.ConfigFile(img, cfg); err != nil {
		return nil, err
	}
	return mutate.CreatedAt(img, v1.Time{Time: epoch})
}

// fileLayer is an uncompressed tar of files with their parent directories,
// root-owned, timestamped epoch; the tarball package compresses it.
func fileLayer(files []File, level int) (v1.Layer, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	dirs := map[string]bool{}
	for _, f := range files {
		if !path.IsAbs(f.Dst) {
			return nil, fmt.Errorf("destination %q is not absolute", f.Dst)
		}
		dst := strings.TrimPrefix(path.Clean(f.Dst), "/")
		for _, d := range parents(dst) {
			if dirs[d] {
				continue
			}
			dirs[d] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d + "/", Mode: 0o755, ModTime: epoch}); err != nil {
				return nil, err
			}
		}
		data, err := os.ReadFile(f.Src)
		if err != nil {
			return nil, err
		}
		mode := f.Mode
		if mode == 0 {
			mode = 0o755
		}
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: dst, Mode: mode, Size: int64(len(data)), ModTime: epoch}); err != nil {
			return nil, err
		}
		if _, err := tw.Write(data); err != nil {
			return nil, err
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	content := buf.Bytes()
	return tarball.LayerFromOpener(func() (io.ReadCloser, error) {
		return io.NopCloser(bytes.NewReader(content)), nil
	}, tarball.WithCompressionLevel(level))
}

// tarDir writes the files below dir into w, with paths relative to dir.
func tarDir(dir string, w io.Writer) error {
	tw := tar.NewWriter(w)
	err := filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || p == dir {
			return err
		}
		rel, err := filepath.Rel(dir, p)
		if err != nil {
			return err
		}
		info, err := d.Info()
		if err != nil {
			return err
		}
		h, err := tar.FileInfoHeader(info, "")
		if err != nil {
			return err
		}
		// Only names and contents from the build: the same layout gives the
		// same tarball whatever the umask, owner or clock.
		h.Name, h.ModTime, h.AccessTime, h.ChangeTime = filepath.ToSlash(rel), epoch, time.Time{}, time.Time{}
		h.Uid, h.Gid, h.Uname, h.Gname = 0, 0, "", ""
		h.Mode = 0o644
		if d.IsDir() {
			h.Name += "/"
			h.Mode = 0o755
		}
		if err := tw.WriteHeader(h); err != nil || !d.Type().IsRegular() {
			return err
		}
		f, err := os.Open(p)
		if err != nil {
			return err
		}
		defer f.Close()
		_, err = io.Copy(tw, f)
		return err
	})
	if err != nil {
		return err
	}
	return tw.Close()
}

// shareable makes the files below dir readable by everyone: go-containerregistry
// writes them private, and a registry or another user serves them.
func shareable(dir string) error {
	return filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if d.IsDir() {
			return os.Chmod(p, 0o755)
		}
		return os.Chmod(p, 0o644)
	})
}

// parents lists the directories above a relative path, outermost first.
func parents(p string) []string {
	var out []string
	for d := path.Dir(p); d != "." && d != "/"; d = path.Dir(d) {
		out = append([]string{d}, out...)
	}
	return out
}

// writeAtomic writes a file through a temporary name in the same directory.
func writeAtomic(dst string, write func(*os.File) error) error {
	f, err := os.CreateTemp(path.Dir(dst), ".tmp-"+path.Base(dst)+"-")
	if err != nil {
		return err
	}
	defer os.Remove(f.Name())
	if err := write(f); err != nil {
		f.Close()
		return err
	}
	if err := f.Chmod(0o644); err != nil {
		f.Close()
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(f.Name(), dst)
}
