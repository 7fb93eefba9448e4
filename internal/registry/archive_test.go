package registry

import (
	"archive/tar"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/random"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
)

// TestPushArchive pushes both tarball formats `capl-dev load image`
// takes and pulls each image back by its mirrored name.
func TestPushArchive(t *testing.T) {
	img, err := random.Image(2048, 2)
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name, ref, mirrored string
		write               func(t *testing.T, img v1.Image, ref string) string
		wantErr             string
	}{
		{name: "docker save", ref: "team/app:dev", mirrored: "team/app:dev", write: dockerArchive},
		{name: "docker save, a Docker Hub one-word name", ref: "app:dev", mirrored: "library/app:dev", write: dockerArchive},
		{name: "OCI image layout tarball", ref: "ghcr.io/team/app:v1", mirrored: "team/app:v1", write: ociArchive},
		{name: "OCI layout with an entry outside it", ref: "ghcr.io/team/app:v1", mirrored: "team/app:v1", write: func(t *testing.T, img v1.Image, ref string) string {
			archive := ociArchive(t, img, ref)
			appendEntry(t, archive, "../escape", "outside")
			return archive
		}},
		{name: "not an image", write: func(t *testing.T, _ v1.Image, _ string) string {
			archive := filepath.Join(t.TempDir(), "x.tar")
			if err := os.WriteFile(archive, nil, 0o600); err != nil {
				t.Fatal(err)
			}
			appendEntry(t, archive, "hello.txt", "hello")
			return archive
		}, wantErr: "neither an OCI image layout naming its images nor docker save's format"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url, stop := serve(t, t.TempDir())
			defer stop()
			archive := tc.write(t, img, tc.ref)
			pushed, err := PushArchive(t.Context(), url, archive)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("PushArchive = %v, %v; want an error with %q", pushed, err, tc.wantErr)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			t.Logf("pushed %v", pushed)
			pull(t, strings.TrimPrefix(url, "http://")+"/"+tc.mirrored, img)
			// PushArchive extracts into a directory of os.TempDir().
			if _, err := os.Stat(filepath.Join(os.TempDir(), "escape")); !os.IsNotExist(err) {
				t.Fatalf("an archive entry was written outside the layout: %v", err)
			}
		})
	}
}

func dockerArchive(t *testing.T, img v1.Image, ref string) string {
	t.Helper()
	tag, err := name.NewTag(ref)
	if err != nil {
		t.Fatal(err)
	}
	archive := filepath.Join(t.TempDir(), "image.tar")
	if err := tarball.WriteToFile(archive, tag, img); err != nil {
		t.Fatal(err)
	}
	return archive
}

// ociArchive is writeLayout's layout as one tarball.
func ociArchive(t *testing.T, img v1.Image, ref string) string {
	t.Helper()
	dir := writeLayout(t, img, ref)
	archive := filepath.Join(t.TempDir(), "image.tar")
	f, err := os.Create(archive)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	tw := tar.NewWriter(f)
	err = filepath.WalkDir(dir, func(p string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		rel, _ := filepath.Rel(dir, p)
		info, err := d.Info()
		if err != nil {
			return err
		}
		if err := tw.WriteHeader(&tar.Header{Name: filepath.ToSlash(rel), Mode: 0o644, Size: info.Size(), Typeflag: tar.TypeReg}); err != nil {
			return err
		}
		src, err := os.Open(p)
		if err != nil {
			return err
		}
		defer src.Close()
		_, err = io.Copy(tw, src)
		return err
	})
	if err == nil {
		err = tw.Close()
	}
	if err != nil {
		t.Fatal(err)
	}
	return archive
}

// appendEntry adds a regular file to the end of a tarball.
func appendEntry(t *testing.T, archive, name, content string) {
	t.Helper()
	f, err := os.OpenFile(archive, os.O_RDWR, 0)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	// A tarball ends with two zero blocks: write over them.
	if st, _ := f.Stat(); st.Size() >= 1024 {
		if _, err := f.Seek(-1024, io.SeekEnd); err != nil {
			t.Fatal(err)
		}
	}
	tw := tar.NewWriter(f)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: int64(len(content)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	if _, err := tw.Write([]byte(content)); err != nil {
		t.Fatal(err)
	}
	if err := tw.Close(); err != nil {
		t.Fatal(err)
	}
}
