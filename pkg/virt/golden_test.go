package virt

import (
	"flag"
	"os"
	"path/filepath"
	"testing"
)

var update = flag.Bool("update", false, "rewrite the golden files under testdata/")

// assertGolden compares got with testdata/<name>, or rewrites the file
// when the test runs with -update.
func assertGolden(t *testing.T, name, got string) {
	t.Helper()
	path := filepath.Join("testdata", name)
	if *update {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte(got), 0o644); err != nil {
			t.Fatal(err)
		}
		return
	}
	want, err := os.ReadFile(path)
	if err != nil {
		t.Fatalf("reading golden file (run with -update to create it): %v", err)
	}
	if string(want) != got {
		t.Errorf("%s differs from golden file:\n--- got ---\n%s\n--- want ---\n%s", name, got, want)
	}
}

// marshaler is any libvirtxml document.
type marshaler interface{ Marshal() (string, error) }

// assertGoldenXML marshals doc and compares it with testdata/<name>.
func assertGoldenXML(t *testing.T, name string, doc marshaler) {
	t.Helper()
	got, err := doc.Marshal()
	if err != nil {
		t.Fatal(err)
	}
	assertGolden(t, name, got+"\n")
}
