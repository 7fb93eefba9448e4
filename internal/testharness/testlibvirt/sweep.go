package testlibvirt

import (
	"errors"
	"fmt"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"libvirt.org/go/libvirt"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// HostLockPath is the lock every test process that names objects with Name
// holds (shared) on its host for as long as it runs. The kernel drops a
// flock when its process dies, however it dies, so a process that gets
// the lock exclusively knows that every test object on the host was left
// by a run that was killed before its cleanups ran.
var HostLockPath = filepath.Join(os.TempDir(), "capl-test.lock")

var (
	claimMu sync.Mutex
	// claimed is this process's hold of HostLockPath; nil until Name is
	// first called.
	claimed *os.File
)

// claimHostOnce claims the host for this process before its first test
// object exists, sweeping what killed runs left when no other test process
// runs. Only for a libvirtd on this machine: a remote one may be shared
// with runners the lock cannot see. A failure is reported, not fatal: the
// sweep is hygiene, and AssertNothingOwned still judges this process.
func claimHostOnce() {
	claimMu.Lock()
	defer claimMu.Unlock()
	uri := os.Getenv(EnvURI)
	if claimed != nil || uri == "" || !localURI(uri) {
		return
	}
	held, swept, err := claimHost(HostLockPath, uri, isTestObject)
	if err != nil {
		fmt.Fprintf(os.Stderr, "testlibvirt: sweeping what killed test runs left on %s: %v\n", uri, err)
	}
	if len(swept) > 0 {
		fmt.Fprintf(os.Stderr, "testlibvirt: removed %d objects that killed test runs left on %s: %v\n", len(swept), uri, swept)
	}
	claimed = held
}

// localURI tells whether uri names the libvirtd of this machine.
func localURI(uri string) bool {
	u, err := url.Parse(uri)
	return err == nil && u.Host == "" && !strings.Contains(u.Scheme, "+")
}

// claimHost takes the lock at lockPath for the calling process and
// returns it held shared. When nobody else holds it, it first removes every
// object on the host at uri that match picks and returns those it removed.
// While another process holds it, it removes nothing.
func claimHost(lockPath, uri string, match func(Object) bool) (held *os.File, swept []Object, err error) {
	f, alone, err := LockExclusive(lockPath)
	if err != nil {
		return nil, nil, err
	}
	if alone {
		swept, err = sweep(uri, match)
	}
	// Downgrading is not atomic; whoever gets the lock exclusively in
	// between finds nothing of ours, which does not exist yet.
	if lockErr := syscall.Flock(int(f.Fd()), syscall.LOCK_SH); lockErr != nil {
		_ = f.Close()
		return nil, swept, errors.Join(err, lockErr)
	}
	return f, swept, err
}

// LockExclusive opens the lock file at path and tries to flock it
// exclusively without waiting. alone tells whether it got the lock; the
// file stays open either way, and closing it releases whatever it holds.
// The kernel drops a flock when its process dies, however it dies.
func LockExclusive(path string) (f *os.File, alone bool, err error) {
	f, err = os.OpenFile(path, os.O_RDONLY|os.O_CREATE, 0o644)
	if err != nil {
		return nil, false, err
	}
	err = syscall.Flock(int(f.Fd()), syscall.LOCK_EX|syscall.LOCK_NB)
	if err != nil && !errors.Is(err, syscall.EWOULDBLOCK) {
		_ = f.Close()
		return nil, false, err
	}
	return f, err == nil, nil
}

// isTestObject tells whether o is a test object: named with
// virt.TestNamePrefix (or a provider name derived from one, "capl-capltest-…"),
// in such a pool, or owned by such a name.
func isTestObject(o Object) bool {
	named := func(s string) bool {
		return strings.HasPrefix(s, virt.TestNamePrefix) || strings.HasPrefix(s, virt.NamePrefix+virt.TestNamePrefix)
	}
	return named(o.Name) || named(o.Pool) || named(filepath.Base(o.Pool)) ||
		o.Owner != nil && (named(o.Owner.Cluster) || named(o.Owner.Namespace) || named(o.Owner.Name))
}

// sweep removes the objects on the host at uri that match picks, domains
// first (they hold the networks and volumes), then networks, volumes,
// pools and the files left in PoolRoot. It returns what it removed.
func sweep(uri string, match func(Object) bool) ([]Object, error) {
	objs, err := Scan(uri, PoolRoot)
	if err != nil {
		return nil, err
	}
	conn, err := libvirt.NewConnect(uri)
	if err != nil {
		return nil, err
	}
	defer conn.Close()
	var removed []Object
	var errs []error
	for _, kind := range []string{KindDomain, KindNetwork, KindVolume, KindPool, KindFile} {
		for _, o := range objs {
			if o.Kind != kind || !match(o) || !removable(o) {
				continue
			}
			err := Remove(conn, o)
			switch {
			case virt.IsNotFound(err) || errors.Is(err, os.ErrNotExist):
			case err != nil:
				errs = append(errs, fmt.Errorf("%s: %w", o, err))
			default:
				removed = append(removed, o)
			}
		}
	}
	return removed, errors.Join(errs...)
}

// removable leaves what goes with something else: the volumes and files
// of a test pool go with the pool (its directory, if anything is left in
// it, as an entry of PoolRoot), and outside PoolRoot no file is removed.
func removable(o Object) bool {
	switch o.Kind {
	case KindVolume:
		return !strings.HasPrefix(o.Pool, virt.TestNamePrefix)
	case KindFile:
		return o.Dir == PoolRoot && strings.HasPrefix(o.Name, virt.TestNamePrefix)
	}
	return true
}

// Remove deletes one object Scan found on conn: a domain with its
// managed save, snapshot, checkpoint and NVRAM metadata, a network, a
// volume, a pool with its volumes, a file or directory. Callers decide
// what may be removed; Remove does not check names.
func Remove(conn *libvirt.Connect, o Object) error {
	switch o.Kind {
	case KindDomain:
		dom, err := conn.LookupDomainByName(o.Name)
		if err != nil {
			return err
		}
		defer dom.Free()
		if active, _ := dom.IsActive(); active {
			if err := dom.Destroy(); err != nil && !virt.IsNotFound(err) {
				return err
			}
		}
		return dom.UndefineFlags(libvirt.DOMAIN_UNDEFINE_NVRAM | libvirt.DOMAIN_UNDEFINE_MANAGED_SAVE |
			libvirt.DOMAIN_UNDEFINE_SNAPSHOTS_METADATA | libvirt.DOMAIN_UNDEFINE_CHECKPOINTS_METADATA)
	case KindNetwork:
		nw, err := conn.LookupNetworkByName(o.Name)
		if err != nil {
			return err
		}
		defer nw.Free()
		if active, _ := nw.IsActive(); active {
			if err := nw.Destroy(); err != nil && !virt.IsNotFound(err) {
				return err
			}
		}
		// A transient network is gone once destroyed.
		if persistent, _ := nw.IsPersistent(); !persistent {
			return nil
		}
		return nw.Undefine()
	case KindVolume:
		pool, err := conn.LookupStoragePoolByName(o.Pool)
		if err != nil {
			return err
		}
		defer pool.Free()
		vol, err := pool.LookupStorageVolByName(o.Name)
		if err != nil {
			return err
		}
		defer vol.Free()
		return vol.Delete(0)
	case KindPool:
		return removePool(conn, o.Name)
	case KindFile:
		path := filepath.Join(o.Dir, o.Name)
		if _, err := os.Lstat(path); err != nil {
			return err
		}
		return os.RemoveAll(path)
	}
	return fmt.Errorf("unknown kind %q", o.Kind)
}
