package plane

import (
	"bytes"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

var etcdPKIFiles = []string{etcdCAName, etcdServerCertName, etcdServerKeyName, etcdClientCertName, etcdClientKeyName}

// readPKI returns the files of dir by name.
func readPKI(t *testing.T, dir string) map[string][]byte {
	t.Helper()
	out := map[string][]byte{}
	for _, name := range etcdPKIFiles {
		data, err := os.ReadFile(filepath.Join(dir, name))
		must(t, err)
		out[name] = data
	}
	return out
}

// TestEnsureEtcdPKI: a directory without certificates (a plane of an
// older version) or with a broken, foreign or expiring set gets a new
// valid set, 0600; a valid set is kept byte for byte, its modes repaired.
func TestEnsureEtcdPKI(t *testing.T) {
	now := time.Now()
	for _, tc := range []struct {
		name string
		// prepare changes a valid set in dir (nil: leave it); noSet
		// starts from an empty directory.
		noSet   bool
		prepare func(t *testing.T, dir string)
		at      time.Time
		kept    bool
	}{
		{name: "older plane: no directory", noSet: true, at: now},
		{name: "valid set", at: now, kept: true},
		{name: "valid set, a key world-readable", at: now, kept: true, prepare: func(t *testing.T, dir string) {
			must(t, os.Chmod(filepath.Join(dir, etcdServerKeyName), 0o644))
		}},
		{name: "client key missing", at: now, prepare: func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, etcdClientKeyName)))
		}},
		{name: "authority missing (interrupted write)", at: now, prepare: func(t *testing.T, dir string) {
			must(t, os.Remove(filepath.Join(dir, etcdCAName)))
		}},
		{name: "garbled server certificate", at: now, prepare: func(t *testing.T, dir string) {
			must(t, os.WriteFile(filepath.Join(dir, etcdServerCertName), []byte("not a certificate"), 0o600))
		}},
		{name: "key of another certificate", at: now, prepare: func(t *testing.T, dir string) {
			data, err := os.ReadFile(filepath.Join(dir, etcdClientKeyName))
			must(t, err)
			must(t, os.WriteFile(filepath.Join(dir, etcdServerKeyName), data, 0o600))
		}},
		{name: "signed by another authority", at: now, prepare: func(t *testing.T, dir string) {
			other := t.TempDir()
			must(t, ensureEtcdPKI(other, now))
			data, err := os.ReadFile(filepath.Join(other, etcdCAName))
			must(t, err)
			must(t, os.WriteFile(filepath.Join(dir, etcdCAName), data, 0o600))
		}},
		{name: "expiring within the renewal window", at: now.Add(certificateLifetime - etcdCertRenewBefore/2)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			dir := filepath.Join(t.TempDir(), "etcd-pki")
			var before map[string][]byte
			if !tc.noSet {
				must(t, ensureEtcdPKI(dir, now))
				if tc.prepare != nil {
					tc.prepare(t, dir)
				}
				before = map[string][]byte{}
				for _, name := range etcdPKIFiles {
					before[name], _ = os.ReadFile(filepath.Join(dir, name))
				}
			}
			must(t, ensureEtcdPKI(dir, tc.at))
			after := readPKI(t, dir)
			same := before != nil && bytes.Equal(before[etcdServerCertName], after[etcdServerCertName]) &&
				bytes.Equal(before[etcdCAName], after[etcdCAName])
			if same != tc.kept {
				t.Errorf("set kept: %v, want %v", same, tc.kept)
			}
			// New certificates start now, whatever time tc.at pretends.
			if err := etcdPKI(dir).check(now.Add(etcdCertRenewBefore)); err != nil {
				t.Errorf("set after ensureEtcdPKI: %v", err)
			}
			for _, name := range etcdPKIFiles {
				fi, err := os.Stat(filepath.Join(dir, name))
				must(t, err)
				if fi.Mode().Perm() != 0o600 {
					t.Errorf("%s has mode %v, want 0600", name, fi.Mode().Perm())
				}
			}
			entries, err := os.ReadDir(dir)
			must(t, err)
			for _, e := range entries {
				if !slices.Contains(etcdPKIFiles, e.Name()) {
					t.Errorf("unexpected file %s in %s (the authority's key is never written)", e.Name(), dir)
				}
			}
		})
	}
}

// TestEtcdArgs: etcd listens on loopback only, TLS with client
// certificates required on both its client and peer URLs.
func TestEtcdArgs(t *testing.T) {
	pki := etcdPKI("/state/etcd-pki")
	tls := []string{
		"--cert-file=/state/etcd-pki/server.crt",
		"--key-file=/state/etcd-pki/server.key",
		"--trusted-ca-file=/state/etcd-pki/ca.crt",
		"--client-cert-auth=true",
		"--peer-cert-file=/state/etcd-pki/server.crt",
		"--peer-key-file=/state/etcd-pki/server.key",
		"--peer-trusted-ca-file=/state/etcd-pki/ca.crt",
		"--peer-client-cert-auth=true",
	}
	for _, tc := range []struct {
		name string
		s    etcdSettings
		want []string
	}{
		{"kept data", etcdSettings{dataDir: "/state/etcd", clientPort: 2379, peerPort: 2380, pki: pki},
			append([]string{
				"--data-dir=/state/etcd",
				"--listen-client-urls=https://127.0.0.1:2379",
				"--advertise-client-urls=https://127.0.0.1:2379",
				"--listen-peer-urls=https://127.0.0.1:2380",
			}, tls...)},
		{"throw-away data", etcdSettings{dataDir: "/tmp/w/etcd", clientPort: 40001, peerPort: 40002, pki: pki, unsafeNoFsync: true},
			append(append([]string{
				"--data-dir=/tmp/w/etcd",
				"--listen-client-urls=https://127.0.0.1:40001",
				"--advertise-client-urls=https://127.0.0.1:40001",
				"--listen-peer-urls=https://127.0.0.1:40002",
			}, tls...), "--unsafe-no-fsync=true")},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got := etcdArgs(tc.s); !slices.Equal(got, tc.want) {
				t.Errorf("etcdArgs:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(tc.want, "\n"))
			}
		})
	}
}
