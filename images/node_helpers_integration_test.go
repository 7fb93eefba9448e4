package images_test

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/netalloc"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// criImages maps each repo tag of `crictl images -o json` to its image ID.
func criImages(t *testing.T, out string) map[string]string {
	t.Helper()
	var list struct {
		Images []struct {
			ID       string   `json:"id"`
			RepoTags []string `json:"repoTags"`
		} `json:"images"`
	}
	if err := json.Unmarshal([]byte(out), &list); err != nil {
		t.Fatalf("crictl images: %v\n%s", err, out)
	}
	m := map[string]string{}
	for _, img := range list.Images {
		for _, tag := range img.RepoTags {
			m[tag] = img.ID
		}
	}
	return m
}

func equalImages(a, b map[string]string) bool {
	if len(a) != len(b) {
		return false
	}
	for k, v := range a {
		if b[k] != v {
			return false
		}
	}
	return true
}

func keys(m map[string]string) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

// logBootPhases logs, from inside the guest, how long boot took to reach
// systemd's default target and when containerd and the kubelet started.
func logBootPhases(t *testing.T, ctx context.Context, c virt.Host, vm string) {
	t.Helper()
	run := func(args ...string) string {
		res, err := c.GuestExec(ctx, vm, args[0], args[1:], nil)
		if err != nil {
			return err.Error()
		}
		return strings.TrimSpace(string(res.Stdout) + string(res.Stderr))
	}
	t.Logf("figure: systemd-analyze time: %s", run("/usr/bin/systemd-analyze", "time"))
	for _, unit := range []string{"containerd.service", "kubelet.service", "cloud-final.service"} {
		t.Logf("figure: %s started at %s after boot (monotonic)", unit,
			monotonic(run("/usr/bin/systemctl", "show", "-P", "ExecMainStartTimestampMonotonic", unit)))
	}
	t.Logf("systemd-analyze blame (top 15):\n%s", firstLines(run("/usr/bin/systemd-analyze", "blame", "--no-pager"), 15))
	t.Logf("cloud-init analyze blame (top 15):\n%s", firstLines(run("/usr/bin/cloud-init", "analyze", "blame"), 15))
}

func monotonic(micros string) string {
	var us int64
	if _, err := fmt.Sscan(micros, &us); err != nil || us == 0 {
		return "never (" + micros + ")"
	}
	return (time.Duration(us) * time.Microsecond).Round(100 * time.Millisecond).String()
}

// firstMonotonic is the time stamp of journalctl's first short-monotonic
// line ("[  623.123456] host systemd[1]: ...") as a duration.
func firstMonotonic(journal string) string {
	open, closing := strings.Index(journal, "["), strings.Index(journal, "]")
	if open < 0 || closing < open {
		return "never"
	}
	secs, err := strconv.ParseFloat(strings.TrimSpace(journal[open+1:closing]), 64)
	if err != nil {
		return "unreadable (" + journal[open:closing+1] + ")"
	}
	return (time.Duration(secs * float64(time.Second))).Round(100 * time.Millisecond).String()
}

func firstLines(s string, n int) string {
	lines := strings.Split(s, "\n")
	return strings.Join(lines[:min(n, len(lines))], "\n")
}

// nodeImageKubernetesVersion is the Kubernetes release of the node image:
// the one its name carries, capl-node-<version>.qcow2 as `make node-image`
// names it (the e2e reads it the same way), so that
// `make test-node-image KUBERNETES_VERSION=...` tests that release's image;
// for an image named otherwise, the pinned release.
func nodeImageKubernetesVersion(t *testing.T, img string) string {
	t.Helper()
	if m := regexp.MustCompile(`^capl-node-(v1\.\d+\.\d+)\.qcow2$`).FindStringSubmatch(filepath.Base(img)); m != nil {
		return m[1]
	}
	return pinnedKubernetesVersion(t)
}

// pinnedKubernetesVersion is the k8s.io/kubernetes version of the tools
// module the node image's binaries are built from by default.
func pinnedKubernetesVersion(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(), "hack", "tools", "envtest", "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s*k8s\.io/kubernetes (v\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("no k8s.io/kubernetes requirement in hack/tools/envtest/go.mod")
	}
	return string(m[1])
}

// flannelImageRef is the image the CNI manifest runs.
func flannelImageRef(t *testing.T) string {
	t.Helper()
	data, err := os.ReadFile(filepath.Join(repoRoot(), "templates", "cni-flannel.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`(?m)^\s+image: (\S+)$`).FindSubmatch(data)
	if m == nil {
		t.Fatal("no image in templates/cni-flannel.yaml")
	}
	return string(m[1])
}

func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..")
}

func fileSHA256(t *testing.T, path string) string {
	t.Helper()
	f, err := os.Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	h := sha256.New()
	if _, err := io.Copy(h, f); err != nil {
		t.Fatal(err)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// waitLease waits for the lease event of mac and returns how long it took,
// failing fast when the domain stops or crashes instead.
func waitLease(t *testing.T, events <-chan virt.Event, vm, mac string, timeout time.Duration) time.Duration {
	t.Helper()
	start := time.Now()
	deadline := time.After(timeout)
	for {
		select {
		case ev, ok := <-events:
			if !ok {
				t.Fatal("event stream closed before the lease")
			}
			switch {
			case ev.Kind == virt.EventLease && netalloc.SameMAC(ev.MAC.String(), mac):
				return time.Since(start)
			case ev.Domain == vm && (ev.Kind == virt.EventDomainCrashed || ev.Kind == virt.EventDomainStopped):
				t.Fatalf("domain %s: %s (%s) before its lease", vm, ev.Kind, ev.Detail)
			}
		case <-deadline:
			t.Fatalf("no DHCP lease for %s within %v", mac, timeout)
		}
	}
}

// waitFile polls a guest file through the guest agent until it exists.
func waitFile(t *testing.T, ctx context.Context, c virt.Host, vm, path string, timeout time.Duration) {
	t.Helper()
	deadline := time.Now().Add(timeout)
	for {
		if _, err := c.GuestReadFile(ctx, vm, path); err == nil {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("%s did not appear in %s within %v", path, vm, timeout)
		}
		time.Sleep(3 * time.Second)
	}
}
