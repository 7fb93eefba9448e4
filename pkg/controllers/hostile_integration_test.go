package controllers_test

import (
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"sigs.k8s.io/cluster-api/util/conditions"

	infrav1 "github.com/capi-libvirt/cluster-api-provider-libvirt/api/v1alpha1"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/manager"
)

// TestHostileInput: what a tenant or an image server hands the provider,
// with no webhook installed to stop it first, ends in a condition with a
// reason a user can act on, names no secret, and leaves nothing in libvirt:
// a qcow2 naming a host file as its backing file, a redirect to a denied
// address, an endless download, a file:// outside the allowed directories,
// a machine larger than one machine may be.
func TestHostileInput(t *testing.T) {
	h := newHarness(t)
	backed := filepath.Join(t.TempDir(), "backed.qcow2")
	if out, err := exec.Command("qemu-img", "create", "-q", "-f", "qcow2", "-u", "-b", "/etc/shadow", "-F", "raw", backed, "1G").CombinedOutput(); err != nil {
		t.Fatalf("qemu-img: %v: %s", err, out)
	}
	backedBytes, err := os.ReadFile(backed)
	must(t, err)
	backedSum := sha256.Sum256(backedBytes)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		switch r.URL.Path {
		case "/backed.qcow2":
			http.ServeContent(w, r, "backed.qcow2", time.Now(), bytes.NewReader(backedBytes))
		case "/redirect.qcow2":
			http.Redirect(w, r, "http://127.0.0.2:1/internal", http.StatusFound)
		case "/endless.qcow2":
			buf := make([]byte, 1<<20)
			for r.Context().Err() == nil {
				if _, err := w.Write(buf); err != nil {
					return
				}
			}
		}
	}))
	t.Cleanup(srv.Close)

	h.options = func(o *manager.Options) {
		o.ImageURLDenyCIDRs = []string{"127.0.0.2/32"}
		o.ImageImportMaxSize = "8Mi"
		o.MaxMachineMemory = "1Gi"
	}
	defer func() { h.options = nil }()
	h.startProvider(nil)
	h.createCluster("hostile", true)
	anySum := "sha256:" + strings.Repeat("1", 64)
	cases := []struct {
		machine   string
		image     infrav1.ImageSource
		memoryMiB int32
		condition string
		reason    string
	}{
		{"backing", infrav1.ImageSource{URL: srv.URL + "/backed.qcow2", Checksum: "sha256:" + hex.EncodeToString(backedSum[:])}, 0,
			infrav1.DiskReadyCondition, infrav1.ImageHasBackingFileReason},
		{"redirect", infrav1.ImageSource{URL: srv.URL + "/redirect.qcow2?token=s3cr3t", Checksum: anySum}, 0,
			infrav1.DiskReadyCondition, infrav1.ImageSourceNotAllowedReason},
		{"endless", infrav1.ImageSource{URL: srv.URL + "/endless.qcow2", Checksum: anySum}, 0,
			infrav1.DiskReadyCondition, infrav1.ImageTooLargeReason},
		{"file-outside", infrav1.ImageSource{URL: "file:///etc/passwd", Checksum: anySum}, 0,
			infrav1.DiskReadyCondition, infrav1.ImageNotAllowedReason},
		{"too-large", infrav1.ImageSource{}, 2048, infrav1.DomainReadyCondition, infrav1.MachineSizeNotAllowedReason},
	}
	for _, c := range cases {
		opts := machineOpts{cluster: "hostile", withData: true, memoryMiB: c.memoryMiB}
		if c.image.URL != "" {
			opts.image = &c.image
		}
		h.createMachine(c.machine, opts)
	}
	for _, c := range cases {
		lm := h.waitCondition(c.machine, c.condition, metav1.ConditionFalse, c.reason, 2*time.Minute)
		msg := conditions.Get(lm, c.condition).Message
		t.Logf("%s: %s %s: %s", c.machine, c.condition, c.reason, msg)
		if strings.Contains(msg, "s3cr3t") || strings.Contains(msg, "root:") {
			t.Errorf("%s: the message shows a secret: %s", c.machine, msg)
		}
	}
	// Refused references stop before anything is made; refused images
	// after the address was reserved (the reservation precedes the disk),
	// never with a disk, a seed or a domain.
	for _, c := range cases {
		if c.condition == infrav1.DomainReadyCondition || c.reason == infrav1.ImageNotAllowedReason {
			h.assertNoLibvirtObjects(c.machine)
		} else {
			h.assertNoDomainOrVolumes(c.machine)
		}
	}
	if st, err := os.Stat("/etc/shadow"); err == nil && st.Sys() != nil {
		// The backing file the image named kept its owner: nothing opened it for QEMU.
		if uid := statUID(st); uid != 0 {
			t.Errorf("/etc/shadow is owned by uid %d", uid)
		}
	}
	for _, c := range cases {
		h.deleteAndAssertClean(c.machine)
	}
	if got := h.poolVolumes(); len(got) != 0 {
		t.Errorf("left in the pool: %v", got)
	}
}

// statUID is the owner of the file st describes.
func statUID(st os.FileInfo) uint32 {
	if sys, ok := st.Sys().(*syscall.Stat_t); ok {
		return sys.Uid
	}
	return 0
}
