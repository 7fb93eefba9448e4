// Package testprereq is how a test says that this machine lacks something
// it needs (libvirtd, an image, root, a program): under CI (CI=true, which
// .ci/run sets) the test fails and names what is missing, since a test
// skipped there proves nothing while the run looks green; elsewhere, on a
// developer's machine without the prerequisite, it skips.
package testprereq

import (
	"fmt"
	"os"
	"testing"
)

// InCI tells whether the tests run under CI, where nothing may be missing.
func InCI() bool { return os.Getenv("CI") == "true" }

// Missing stops t because a prerequisite is missing: a failure under CI,
// else a skip, with the message (which says what is missing and how to
// get it).
func Missing(t testing.TB, format string, args ...any) {
	t.Helper()
	msg := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("missing prerequisite (CI=true, so this fails rather than skips): %s", msg)
		return
	}
	t.Skip(msg)
}
