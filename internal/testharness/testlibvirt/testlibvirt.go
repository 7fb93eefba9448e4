// Package testlibvirt gives integration tests a real libvirtd to work
// against, and makes sure they leave nothing behind on a host that other
// engineers' tests share.
//
// Every object a test creates is named with Name (prefix "capltest-" and a
// random suffix); the names this process handed out are remembered so that
// AssertNothingOwned only judges this process's leftovers, not those of a
// concurrent run. It finds them with Scan, an independent listing of the
// raw host. What a killed run left (its cleanups never ran) is swept by the
// next test process that finds no other one running (HostLockPath).
package testlibvirt

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/internal/testharness/testprereq"
	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

const (
	// EnvURI names the libvirt URI for integration tests; unset skips them.
	EnvURI = "CAPL_TEST_LIBVIRT_URI"
	// EnvImage names the path of a bootable qcow2 base image; unset skips
	// the tests that boot a guest.
	EnvImage = "CAPL_TEST_IMAGE"
	// EnvSoak opts in to the integration tests that wait for a guest OS to
	// boot where the e2e suite's machines boot through the same code:
	// `make test-soak` sets it, `make test` (CI) does not.
	EnvSoak = "CAPL_TEST_SOAK"
	// PoolRoot is where test pools live on the libvirt host.
	PoolRoot = "/var/lib/libvirt"
)

// URI returns the libvirt URI for integration tests, skipping t when none
// is configured.
func URI(t testing.TB) string {
	t.Helper()
	uri := os.Getenv(EnvURI)
	if uri == "" {
		testprereq.Missing(t, "%s not set: the test runs against a real libvirtd (make test sets it)", EnvURI)
	}
	return uri
}

// SoakOnly skips t unless EnvSoak is set; coveredBy says what of the e2e
// suite covers it in CI.
func SoakOnly(t testing.TB, coveredBy string) {
	t.Helper()
	if os.Getenv(EnvSoak) == "" {
		t.Skipf("boots a guest; in CI %s (set %s=1 or run make test-soak)", coveredBy, EnvSoak)
	}
}

// Image returns the path of the bootable test image, skipping t when none
// is configured.
func Image(t testing.TB) string {
	t.Helper()
	img := os.Getenv(EnvImage)
	if img == "" {
		testprereq.Missing(t, "%s not set: the test boots a guest from it (make test sets it)", EnvImage)
	}
	return img
}

var (
	namesMu sync.Mutex
	names   []string
	// pools are the pools made by Pool whose cleanup has not run yet: a
	// check in the middle of a test expects them (not their contents).
	pools = map[string]bool{}
)

// Name returns a fresh object name "capltest-" + 6 hex digits: 15
// characters, so it also fits a Linux bridge name. Derive further names by
// appending to it; AssertNothingOwned recognises them by this prefix. The
// process's first call claims the host (see HostLockPath), removing what
// killed test runs left when no other test process runs.
func Name(t testing.TB) string {
	t.Helper()
	claimHostOnce()
	b := make([]byte, 3)
	if _, err := rand.Read(b); err != nil {
		t.Fatalf("random name: %v", err)
	}
	n := virt.TestNamePrefix + hex.EncodeToString(b)
	namesMu.Lock()
	names = append(names, n)
	namesMu.Unlock()
	return n
}

// Client dials uri and closes the client when t ends.
func Client(t testing.TB, uri string) *virt.Client {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	c, err := virt.Dial(ctx, uri)
	if err != nil {
		t.Fatalf("dial %s: %v", uri, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Pool creates a test directory pool under PoolRoot through h and removes
// it with every volume in it when t ends, even on failure. It returns the
// pool's name.
func Pool(t testing.TB, uri string, h virt.Host) string {
	t.Helper()
	name := Name(t)
	path := filepath.Join(PoolRoot, name)
	t.Cleanup(func() {
		if err := DestroyPool(uri, name); err != nil {
			t.Errorf("cleaning up pool %s: %v", name, err)
			return
		}
		namesMu.Lock()
		delete(pools, name)
		namesMu.Unlock()
	})
	namesMu.Lock()
	pools[name] = true
	namesMu.Unlock()
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	if err := h.EnsurePool(ctx, virt.PoolSpec{Name: name, Path: path}); err != nil {
		t.Fatalf("creating test pool %s: %v", name, err)
	}
	return name
}

// DestroyPool deletes every volume of the test pool name, the pool's
// directory and its definition, on a connection of its own so that it does
// not depend on the code under test. It refuses names without the test
// prefix. A missing pool is success.
func DestroyPool(uri, name string) error {
	if !strings.HasPrefix(name, virt.TestNamePrefix) {
		return fmt.Errorf("refusing to destroy non-test pool %q", name)
	}
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return err
	}
	defer conn.Close()
	if err := removePool(conn, name); err != nil && !virt.IsNotFound(err) {
		return err
	}
	return nil
}

// removePool deletes every volume of the pool name, its directory and
// its definition.
func removePool(conn *libvirt.Connect, name string) error {
	pool, err := conn.LookupStoragePoolByName(name)
	if err != nil {
		return err
	}
	defer pool.Free()
	if active, _ := pool.IsActive(); active {
		_ = pool.Refresh(0)
		vols, err := pool.ListAllStorageVolumes(0)
		if err != nil {
			return err
		}
		for i := range vols {
			if err := vols[i].Delete(0); err != nil && !virt.IsNotFound(err) {
				err = fmt.Errorf("deleting volume: %w", err)
				for j := i; j < len(vols); j++ {
					_ = vols[j].Free()
				}
				return err
			}
			_ = vols[i].Free()
		}
		if err := pool.Destroy(); err != nil {
			return err
		}
	}
	// The directory may be gone already; the definition must go regardless.
	_ = pool.Delete(libvirt.STORAGE_POOL_DELETE_NORMAL)
	return pool.Undefine()
}

// CheckNothingOwned returns an error listing every object on the host at
// uri that this process's tests made: a domain, network, pool, volume or
// pool-directory entry named with a name handed out by Name (or, as the
// namespace of the provider's names, "capl-<name>.…"), anything in such a
// pool, and a domain or network whose owner metadata names such a name.
// It looks through Scan, not through pkg/virt, so an object that lost (or
// never got) its metadata is found by its name, and a file libvirt does
// not know about by the pool's directory; PoolRoot is also listed, for the
// directories of test pools whose definition is gone.
// A pool made by Pool whose cleanup has not run yet, and its directory, are
// expected; what is in them is not.
func CheckNothingOwned(uri string) error {
	objs, err := Scan(uri, PoolRoot)
	if err != nil {
		return fmt.Errorf("listing the host: %w", err)
	}
	namesMu.Lock()
	mine := append([]string(nil), names...)
	pending := maps.Clone(pools)
	namesMu.Unlock()
	var left []string
	for _, o := range objs {
		pendingPool := (o.Kind == KindPool || o.Kind == KindFile && o.Dir == PoolRoot) && pending[o.Name]
		if ours(o, mine) && !pendingPool {
			left = append(left, o.String())
		}
	}
	if len(left) > 0 {
		return fmt.Errorf("left behind: %s", strings.Join(left, ", "))
	}
	return nil
}

// AssertNothingOwned fails t when this process left any object behind on
// the host at uri. Call it after the cleanups of the tests it judges have
// run.
func AssertNothingOwned(t testing.TB, uri string) {
	t.Helper()
	if err := CheckNothingOwned(uri); err != nil {
		t.Error(err)
	}
}

// ours tells whether o belongs to one of the names in mine: named with it
// (directly, or as the namespace of a name the provider derived,
// "capl-<namespace>.…"), in a pool named with it, or owned by it.
func ours(o Object, mine []string) bool {
	for _, n := range mine {
		named := func(s string) bool {
			return strings.HasPrefix(s, n) || strings.HasPrefix(s, virt.NamePrefix+n+".")
		}
		if named(o.Name) || named(o.Pool) || named(filepath.Base(o.Pool)) ||
			(o.Owner != nil && (o.Owner.Cluster == n || o.Owner.Namespace == n || named(o.Owner.Name))) {
			return true
		}
	}
	return false
}

// RunChecked runs a package's tests and then, when they passed against a
// real libvirtd, checks that nothing they created is left on the host; it
// returns the exit code for os.Exit. Packages call it from TestMain.
func RunChecked(m *testing.M) int {
	code := m.Run()
	if uri := os.Getenv(EnvURI); uri != "" && code == 0 {
		if err := CheckNothingOwned(uri); err != nil {
			fmt.Fprintln(os.Stderr, "FAIL:", err)
			code = 1
		}
	}
	return code
}

// FilePolicy lets imports read the directories of files, and nothing else:
// the tests' images are files of their own.
func FilePolicy(files ...string) virt.SourcePolicy {
	var dirs []string
	for _, f := range files {
		dirs = append(dirs, filepath.Dir(strings.TrimPrefix(f, "file://")))
	}
	return virt.SourcePolicy{FileDirs: dirs}
}
