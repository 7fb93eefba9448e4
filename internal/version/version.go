// Package version is what a binary of this repository says it is: its
// release, the commit it was built from and that commit's time. The
// Makefile's build targets and make image set them at link time (-ldflags
// -X); a binary built otherwise (go build, go test) reads them from the
// build information Go records (the module version and the VCS stamp). The
// build date is the commit's time, not the clock's, so that a rebuild of
// the same commit is the same binary (make image is reproducible).
package version

import (
	"fmt"
	"runtime"
	"runtime/debug"
)

// Set with -ldflags "-X <package>.gitVersion=...": see the Makefile's
// VERSION_LDFLAGS.
var (
	gitVersion string
	gitCommit  string
	buildDate  string
)

// Info is a binary's version.
type Info struct {
	// Version is the release (v0.1.0), a dev build's vX.Y.Z-dev, or the
	// pseudo-version go build stamps.
	Version string `json:"version"`
	// GitCommit is the commit, with -dirty when the checkout had changes.
	GitCommit string `json:"gitCommit"`
	// BuildDate is the commit's time, RFC 3339 in UTC.
	BuildDate string `json:"buildDate"`
	GoVersion string `json:"goVersion"`
	Platform  string `json:"platform"`
}

// Get is this binary's version.
func Get() Info {
	return get(gitVersion, gitCommit, buildDate, readBuildInfo)
}

func readBuildInfo() (*debug.BuildInfo, bool) { return debug.ReadBuildInfo() }

// get fills what the linker did not set from the build information.
func get(version, commit, date string, buildInfo func() (*debug.BuildInfo, bool)) Info {
	info := Info{Version: version, GitCommit: commit, BuildDate: date,
		GoVersion: runtime.Version(), Platform: runtime.GOOS + "/" + runtime.GOARCH}
	if bi, ok := buildInfo(); ok {
		settings := map[string]string{}
		for _, s := range bi.Settings {
			settings[s.Key] = s.Value
		}
		if info.Version == "" && bi.Main.Version != "" {
			info.Version = bi.Main.Version
		}
		if info.GitCommit == "" && settings["vcs.revision"] != "" {
			info.GitCommit = settings["vcs.revision"]
			if settings["vcs.modified"] == "true" {
				info.GitCommit += "-dirty"
			}
		}
		if info.BuildDate == "" {
			info.BuildDate = settings["vcs.time"]
		}
	}
	for _, f := range []*string{&info.Version, &info.GitCommit, &info.BuildDate} {
		if *f == "" {
			*f = "unknown"
		}
	}
	return info
}

// String is the version on one line, as --version prints it.
func (i Info) String() string {
	return fmt.Sprintf("%s (commit %s, committed %s, %s, %s)", i.Version, i.GitCommit, i.BuildDate, i.GoVersion, i.Platform)
}
