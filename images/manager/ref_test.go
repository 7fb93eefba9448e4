package manager_test

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
)

// ref is the reference the tests build the image as; it names no registry
// that exists.
const ref = "localhost/capl-manager:test"

// TestRef checks which reference `build.sh --ref` gives release-manifests:
// by digest only for this commit's build of the image asked for, from a
// checkout without changes (the tree being tested may have some).
func TestRef(t *testing.T) {
	const digest = "sha256:0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef"
	out, err := exec.Command("git", "rev-parse", "HEAD").Output()
	if err != nil {
		t.Fatalf("build.sh --ref reads the commit from git, and git rev-parse HEAD failed here: %v", err)
	}
	head := strings.TrimSpace(string(out))
	status, err := exec.Command("git", "status", "--porcelain").Output()
	if err != nil {
		t.Fatal(err)
	}
	clean := len(status) == 0
	for _, tc := range []struct {
		name, builtRef, builtRevision string
		byDigest                      bool
	}{
		{name: "nothing built"},
		{name: "this commit's build", builtRef: ref + "@" + digest, builtRevision: head, byDigest: clean},
		{name: "another image", builtRef: "localhost/other:test@" + digest, builtRevision: head},
		{name: "another commit", builtRef: ref + "@" + digest, builtRevision: "0000000000000000000000000000000000000000"},
		{name: "a tree with changes", builtRef: ref + "@" + digest, builtRevision: head + "-dirty"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			if tc.builtRef != "" {
				for name, content := range map[string]string{"ref": tc.builtRef, "revision": tc.builtRevision} {
					if err := os.WriteFile(filepath.Join(dir, name), []byte(content+"\n"), 0o644); err != nil {
						t.Fatal(err)
					}
				}
			}
			var stderr bytes.Buffer
			cmd := exec.Command("./build.sh", "--ref", dir)
			cmd.Env = append(os.Environ(), "IMG="+ref)
			cmd.Stderr = &stderr
			out, err := cmd.Output()
			if err != nil {
				t.Fatalf("%v: %s", err, stderr.String())
			}
			want := ref
			if tc.byDigest {
				want = ref + "@" + digest
			}
			if got := strings.TrimSpace(string(out)); got != want {
				t.Errorf("--ref printed %q, want %q (stderr: %s)", got, want, stderr.String())
			}
			if warned := stderr.Len() > 0; warned != (tc.builtRef != "" && !tc.byDigest) {
				t.Errorf("warning %q, want one only when another build is there", stderr.String())
			}
		})
	}
}
