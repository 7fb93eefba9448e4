package version

import (
	"runtime/debug"
	"testing"
)

// TestGet: what the linker set wins; what it did not comes from Go's build
// information; nothing known is "unknown", never empty.
func TestGet(t *testing.T) {
	stamped := func() (*debug.BuildInfo, bool) {
		return &debug.BuildInfo{
			Main: debug.Module{Version: "v0.0.0-20261129010000-abcdef123456+dirty"},
			Settings: []debug.BuildSetting{
				{Key: "vcs.revision", Value: "abcdef1234567890"},
				{Key: "vcs.time", Value: "2026-11-29T01:00:00Z"},
				{Key: "vcs.modified", Value: "true"},
			},
		}, true
	}
	none := func() (*debug.BuildInfo, bool) { return nil, false }
	for _, tc := range []struct {
		name                string
		version, commit, at string
		info                func() (*debug.BuildInfo, bool)
		want                Info
	}{
		{"linker flags", "v0.1.0", "0123abcd", "2026-11-28T10:00:00Z", stamped,
			Info{Version: "v0.1.0", GitCommit: "0123abcd", BuildDate: "2026-11-28T10:00:00Z"}},
		{"go build's stamp", "", "", "", stamped,
			Info{Version: "v0.0.0-20261129010000-abcdef123456+dirty", GitCommit: "abcdef1234567890-dirty", BuildDate: "2026-11-29T01:00:00Z"}},
		{"nothing known", "", "", "", none,
			Info{Version: "unknown", GitCommit: "unknown", BuildDate: "unknown"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := get(tc.version, tc.commit, tc.at, tc.info)
			if got.GoVersion == "" || got.Platform == "" {
				t.Errorf("no Go version or platform: %+v", got)
			}
			got.GoVersion, got.Platform = "", ""
			if got != tc.want {
				t.Errorf("got  %+v\nwant %+v", got, tc.want)
			}
		})
	}
}
