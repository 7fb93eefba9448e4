package cli

import (
	"bytes"
	"crypto/sha256"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/plane"
)

// recordName is the file in the state directory where capl-dev keeps
// what it needs between runs: how the plane was started, so that
// `capl-dev start` starts it the same way after `stop`, and which VMs
// `stop` shut down. `down` removes it with the state directory.
const recordName = plane.CLIStateFile

// record is recordName.
type record struct {
	// LibvirtURI, ManagerBinary, Assets, ImageDir and ManagerArgs are the
	// plane options `up` or `start` last started the plane with.
	LibvirtURI    string   `json:"libvirtURI,omitempty"`
	ManagerBinary string   `json:"managerBinary,omitempty"`
	Assets        string   `json:"assets,omitempty"`
	ImageDir      string   `json:"imageDir,omitempty"`
	ManagerArgs   []string `json:"managerArgs,omitempty"`
	// Stopped are the domains `stop` shut down, in the order `start`
	// starts them again: load balancers, control planes, workers.
	Stopped []string `json:"stopped,omitempty"`
}

func readRecord(dir string) (record, error) {
	var r record
	data, err := os.ReadFile(filepath.Join(dir, recordName))
	if err != nil {
		return r, err
	}
	if err := json.Unmarshal(data, &r); err != nil {
		return r, fmt.Errorf("reading %s: %w", filepath.Join(dir, recordName), err)
	}
	return r, nil
}

// updateRecord reads the record (an empty one when missing), lets change
// edit it and writes it back atomically.
func updateRecord(dir string, change func(*record)) error {
	r, err := readRecord(dir)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	change(&r)
	data, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	path := filepath.Join(dir, recordName)
	if err := os.WriteFile(path+".tmp", append(data, '\n'), 0o600); err != nil {
		return err
	}
	return os.Rename(path+".tmp", path)
}

// recordPlane keeps o as the way the plane was started.
func recordPlane(o plane.Options) error {
	return updateRecord(o.StateDir, func(r *record) {
		r.LibvirtURI, r.ManagerBinary, r.Assets, r.ImageDir, r.ManagerArgs = o.LibvirtURI, o.ManagerBinary, o.Assets, o.ImageDir, o.ManagerArgs
	})
}

// staleBinary tells, for a running process, whether the executable it
// was started from has been rebuilt since with other contents: replaced
// (the kernel then shows the old file as deleted) or modified after the
// process started. A rebuild that wrote the same bytes (make up runs go
// build every time) is not stale. It returns a description for the
// message, or "" when the process runs the current file (or cannot be
// told).
func staleBinary(pid int) string {
	running := fmt.Sprintf("/proc/%d/exe", pid)
	exe, err := os.Readlink(running)
	if err != nil {
		return ""
	}
	if path, ok := strings.CutSuffix(exe, " (deleted)"); ok {
		if sameContents(running, path) {
			return ""
		}
		return fmt.Sprintf("%s has been replaced since pid %d started", path, pid)
	}
	fi, err := os.Stat(exe)
	if err != nil {
		return ""
	}
	started, err := processStart(pid)
	if err != nil {
		return ""
	}
	// A second of slack: go build writes the file just before make runs it.
	if fi.ModTime().After(started.Add(time.Second)) && !sameContents(running, exe) {
		return fmt.Sprintf("%s was rebuilt at %s, after pid %d started at %s", exe, fi.ModTime().Format("15:04:05"), pid, started.Format("15:04:05"))
	}
	return ""
}

// sameContents tells whether the files a and b hold the same bytes; false
// when either cannot be read.
func sameContents(a, b string) bool {
	sum := func(path string) ([]byte, int64, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, 0, err
		}
		defer f.Close()
		h := sha256.New()
		n, err := io.Copy(h, f)
		return h.Sum(nil), n, err
	}
	sa, na, errA := sum(a)
	sb, nb, errB := sum(b)
	return errA == nil && errB == nil && na == nb && bytes.Equal(sa, sb)
}

// processStart is when pid started: field 22 of /proc/PID/stat, in clock
// ticks after boot (btime of /proc/stat). USER_HZ is 100 on every Linux
// architecture Go builds for here.
func processStart(pid int) (time.Time, error) {
	stat, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return time.Time{}, err
	}
	// Fields after the command name, which may hold spaces and ')'.
	i := bytes.LastIndexByte(stat, ')')
	if i < 0 {
		return time.Time{}, errors.New("malformed stat")
	}
	fields := strings.Fields(string(stat[i+1:]))
	// fields[0] is field 3 (state): starttime, field 22, is fields[19].
	if len(fields) < 20 {
		return time.Time{}, errors.New("short stat")
	}
	ticks, err := strconv.ParseInt(fields[19], 10, 64)
	if err != nil {
		return time.Time{}, err
	}
	boot, err := bootTime()
	if err != nil {
		return time.Time{}, err
	}
	return boot.Add(time.Duration(ticks) * time.Second / 100), nil
}

func bootTime() (time.Time, error) {
	data, err := os.ReadFile("/proc/stat")
	if err != nil {
		return time.Time{}, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		if v, ok := strings.CutPrefix(line, "btime "); ok {
			s, err := strconv.ParseInt(strings.TrimSpace(v), 10, 64)
			return time.Unix(s, 0), err
		}
	}
	return time.Time{}, errors.New("no btime in /proc/stat")
}
