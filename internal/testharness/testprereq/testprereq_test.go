package testprereq

import (
	"fmt"
	"strings"
	"testing"
)

// recorder is a testing.TB that records how a test stopped.
type recorder struct {
	testing.TB
	failed, skipped string
}

func (r *recorder) Helper() {}
func (r *recorder) Fatalf(f string, args ...any) {
	r.failed = strings.TrimSpace(fmt.Sprintf(f, args...))
}
func (r *recorder) Skip(args ...any) { r.skipped = strings.TrimSpace(fmt.Sprint(args...)) }

func TestMissing(t *testing.T) {
	for _, tc := range []struct {
		ci                 string
		wantFail, wantSkip bool
	}{
		{ci: "true", wantFail: true},
		{ci: "", wantSkip: true},
		{ci: "false", wantSkip: true},
	} {
		t.Run("CI="+tc.ci, func(t *testing.T) {
			t.Setenv("CI", tc.ci)
			r := &recorder{}
			Missing(r, "no %s here", "haproxy")
			if (r.failed != "") != tc.wantFail || (r.skipped != "") != tc.wantSkip {
				t.Fatalf("failed %q, skipped %q; want fail %v, skip %v", r.failed, r.skipped, tc.wantFail, tc.wantSkip)
			}
			if got := r.failed + r.skipped; !strings.Contains(got, "no haproxy here") {
				t.Errorf("message %q does not say what is missing", got)
			}
		})
	}
}
