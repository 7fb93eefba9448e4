package registry

import (
	"archive/tar"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"

	"github.com/google/go-containerregistry/pkg/name"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/layout"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// layoutEntry matches the files of an OCI image layout a tarball may hold;
// nothing else of an archive is written to disk.
var layoutEntry = regexp.MustCompile(`^(oci-layout|index\.json|blobs/sha256/[0-9a-f]{64})$`)

// PushArchive pushes the images of an image tarball to the registry at
// baseURL, as PushLayout does: an OCI image layout as one tarball whose
// index names its images with io.containerd.image.name (buildx's and
// `ctr export`'s; Docker 25 and later save so too), or else docker save's
// format, each of its RepoTags. It returns the references pushed.
func PushArchive(ctx context.Context, baseURL, archive string) ([]string, error) {
	dir, err := os.MkdirTemp("", "capl-push-")
	if err != nil {
		return nil, err
	}
	defer os.RemoveAll(dir)
	named, err := extractLayout(archive, dir)
	if err != nil {
		return nil, err
	}
	if !named {
		if err := os.RemoveAll(dir); err != nil {
			return nil, err
		}
		if err := dockerArchiveToLayout(archive, dir); err != nil {
			return nil, err
		}
	}
	return PushLayout(ctx, baseURL, dir)
}

// extractLayout writes the OCI image layout files of archive into dir and
// tells whether its index names an image.
func extractLayout(archive, dir string) (bool, error) {
	f, err := os.Open(archive)
	if err != nil {
		return false, err
	}
	defer f.Close()
	tr := tar.NewReader(f)
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return false, fmt.Errorf("%s: %w", archive, err)
		}
		entry := path.Clean(h.Name)
		if h.Typeflag != tar.TypeReg || !layoutEntry.MatchString(entry) {
			continue
		}
		dst := filepath.Join(dir, filepath.FromSlash(entry))
		if err := os.MkdirAll(filepath.Dir(dst), 0o700); err != nil {
			return false, err
		}
		out, err := os.OpenFile(dst, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
		if err != nil {
			return false, fmt.Errorf("%s: %s: %w", archive, entry, err)
		}
		_, err = io.Copy(out, tr)
		if cerr := out.Close(); err == nil {
			err = cerr
		}
		if err != nil {
			return false, err
		}
	}
	index, err := readIndex(dir)
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	for _, m := range index.Manifests {
		if m.Annotations[containerdImageName] != "" {
			return true, nil
		}
	}
	return false, nil
}

// dockerArchiveToLayout writes the images of a docker save tarball into a
// new OCI image layout at dir, each RepoTag as io.containerd.image.name.
func dockerArchiveToLayout(archive, dir string) error {
	opener := func() (io.ReadCloser, error) { return os.Open(archive) }
	manifest, err := tarball.LoadManifest(opener)
	if err != nil {
		return fmt.Errorf("%s is neither an OCI image layout naming its images nor docker save's format: %w", archive, err)
	}
	l, err := layout.Write(dir, empty.Index)
	if err != nil {
		return err
	}
	tags := 0
	for _, d := range manifest {
		for _, t := range d.RepoTags {
			tag, err := name.NewTag(t)
			if err != nil {
				return fmt.Errorf("%s: tag %q: %w", archive, t, err)
			}
			img, err := tarball.Image(opener, &tag)
			if err != nil {
				return fmt.Errorf("%s: %s: %w", archive, t, err)
			}
			if err := l.AppendImage(img, layout.WithAnnotations(map[string]string{containerdImageName: tag.Name()})); err != nil {
				return err
			}
			tags++
		}
	}
	if tags == 0 {
		b, _ := json.Marshal(manifest)
		return fmt.Errorf("%s names no image (docker save without a tag: %s)", archive, b)
	}
	return nil
}
