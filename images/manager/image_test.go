//go:build image

// Package manager_test checks the manager's container image that `make image`
// writes (images/manager/build.sh): built twice from the same commit into
// fresh directories it is the same image, byte for byte, and in a chroot of
// its root file system /manager and ssh find their libraries and run as the
// image's user, ssh also through the #!/bin/sh wrapper pkg/hosts writes for
// a qemu+ssh connection.
package manager_test

import (
	"bytes"
	"context"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"path"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/hosts"
)

// TestManagerImage builds the image twice, compares the builds and runs the
// image's programs. It needs root (mmdebstrap, chroot) and takes minutes, so
// it is built only with the image tag (make test-image), not in make test.
func TestManagerImage(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Fatal("building the image and chroot need root: run make test-image as root")
	}
	tmp := t.TempDir()
	dirs := []string{filepath.Join(tmp, "first"), filepath.Join(tmp, "second")}
	// The builds end before the test binary's -timeout would end it and leave
	// them running with the build lock: at the deadline their whole process
	// group (build.sh, mmdebstrap, go) gets SIGTERM, on which build.sh removes
	// its work directory and releases the lock, and whatever is left a minute
	// later SIGKILL.
	ctx := t.Context()
	if deadline, ok := t.Deadline(); ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline.Add(-2*time.Minute))
		defer cancel()
	}
	for i, dir := range dirs {
		start := time.Now()
		var stderr bytes.Buffer
		cmd := exec.CommandContext(ctx, "./build.sh", dir)
		cmd.Env = append(os.Environ(), "IMG="+ref, "RELEASE_VERSION=v0.0.0-test")
		cmd.Stderr = &stderr
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		cmd.Cancel = func() error { return syscall.Kill(-cmd.Process.Pid, syscall.SIGTERM) }
		cmd.WaitDelay = time.Minute
		out, err := cmd.Output()
		if ctx.Err() != nil && cmd.Process != nil {
			// What outlived build.sh or ignored SIGTERM: the group exists
			// as long as one of its processes does.
			_ = syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		}
		if err != nil {
			t.Fatalf("build %d: %v (deadline: %v)\n%s", i+1, err, ctx.Err(), stderr.String())
		}
		fmt.Printf("BENCH manager image build %d took %v: %s", i+1, time.Since(start).Round(time.Second), out)
		if got := strings.TrimSpace(string(out)); !strings.HasPrefix(got, ref+"@sha256:") {
			t.Fatalf("build %d printed %q, want %s@sha256:…", i+1, got, ref)
		}
	}

	first, second := readTree(t, dirs[0]), readTree(t, dirs[1])
	if first["digest"] != second["digest"] {
		t.Errorf("the builds' digests differ: %s and %s", first["digest"], second["digest"])
	}
	for name, data := range first {
		if second[name] != data {
			t.Errorf("%s differs between the builds", name)
		}
	}
	if len(first) != len(second) {
		t.Errorf("the builds wrote different files: %v and %v", keys(first), keys(second))
	}
	t.Logf("image %s, %d MB compressed", strings.TrimSpace(first["ref"]), blobBytes(first)>>20)

	config, layers := readImage(t, first)
	rootfs := filepath.Join(tmp, "rootfs")
	for _, layer := range layers {
		extract(t, rootfs, layer)
	}
	// What a container runtime gives every container, and ssh opens first.
	null := filepath.Join(rootfs, "dev/null")
	if err := syscall.Mknod(null, syscall.S_IFCHR, 1<<8|3); err != nil { // major 1, minor 3
		t.Fatal(err)
	}
	if err := os.Chmod(null, 0o666); err != nil {
		t.Fatal(err)
	}

	// build.sh sets its own umask: the caller's would otherwise reach what
	// it makes itself (the root, status.d, the CA bundle), and the digest.
	t.Run("modes", func(t *testing.T) {
		if len(layers) == 0 {
			t.Fatal("the image has no layers")
		}
		modes := layerModes(t, layers[0])
		for name, want := range map[string]int64{
			"/":                                  0o755,
			"/etc/ssl/certs/ca-certificates.crt": 0o644,
			"/var/lib/dpkg/status.d":             0o755,
			"/var/lib/dpkg/status.d/libvirt0":    0o644,
			"/etc/passwd":                        0o644,
			"/home/manager":                      0o755,
		} {
			if got, ok := modes[name]; !ok {
				t.Errorf("%s is not in the base layer", name)
			} else if got != want {
				t.Errorf("%s has mode %#o in the base layer, want %#o", name, got, want)
			}
		}
	})

	t.Run("configuration", func(t *testing.T) {
		rev := strings.TrimSpace(first["revision"])
		for _, tc := range []struct {
			field     string
			got, want any
		}{
			{"entrypoint", config.Config.Entrypoint, []string{"/manager"}},
			{"user", config.Config.User, "65532:65532"},
			{"HOME", slices.Contains(config.Config.Env, "HOME=/home/manager"), true},
			{"created", config.Created, "2025-01-01T00:00:00Z"},
			{"version label", config.Config.Labels["org.opencontainers.image.version"], "v0.0.0-test"},
			{"revision label", config.Config.Labels["org.opencontainers.image.revision"], rev},
			{"source label", config.Config.Labels["org.opencontainers.image.source"], "https://github.com/capi-libvirt/cluster-api-provider-libvirt"},
		} {
			if !reflect.DeepEqual(tc.got, tc.want) {
				t.Errorf("%s = %v, want %v", tc.field, tc.got, tc.want)
			}
		}
		if rev == "" || rev == "unknown" {
			t.Errorf("revision %q: the build did not record its commit", rev)
		}
	})

	// The dynamic loader resolves every library, as it will in a container.
	for _, bin := range []string{"/manager", "/usr/bin/ssh"} {
		t.Run("libraries of "+bin, func(t *testing.T) {
			out := chroot(t, rootfs, nil, "/lib64/ld-linux-x86-64.so.2", "--list", bin)
			if strings.Contains(out, "not found") {
				t.Errorf("unresolved libraries:\n%s", out)
			}
			if bin == "/manager" && !strings.Contains(out, "libvirt.so.0 => ") {
				t.Errorf("/manager does not load libvirt.so.0:\n%s", out)
			}
		})
	}

	user := []string{"--userspec=65532:65532"}
	for _, tc := range []struct {
		name string
		args []string
		want string
	}{
		{"manager runs", []string{"/manager", "--help"}, "--libvirt-uri"},
		// ssh -G reads the configuration as for a connection: the user comes
		// from /etc/passwd, the ssh_config from openssh-client.
		{"ssh runs", []string{"/usr/bin/ssh", "-G", "host.example"}, "user manager"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if out := chroot(t, rootfs, user, tc.args...); !strings.Contains(out, tc.want) {
				t.Errorf("%s printed no %q:\n%s", strings.Join(tc.args, " "), tc.want, out)
			}
		})
	}

	// A qemu+ssh connection with a credentials Secret: libvirt runs, as ssh
	// (the URI's command=), the wrapper pkg/hosts writes, a #!/bin/sh script
	// that execs ssh with the connection's own configuration. These are
	// pkg/hosts' own files for the ssh the manager finds on the image's PATH,
	// in a credentials directory under the image's /tmp (the manager's
	// os.TempDir()), run as the manager's user with libvirt's kind of
	// arguments; ssh -G prints the configuration it would connect with,
	// without connecting.
	t.Run("qemu+ssh wrapper", func(t *testing.T) {
		if target, err := os.Readlink(filepath.Join(rootfs, "bin/sh")); err != nil || target != "dash" {
			t.Errorf("/bin/sh: link to %q, %v; want a link to dash", target, err)
		}
		hostDir, err := os.MkdirTemp(filepath.Join(rootfs, "tmp"), "capl-credentials-")
		if err != nil {
			t.Fatal(err)
		}
		if err := os.Chown(hostDir, 65532, 65532); err != nil {
			t.Fatal(err)
		}
		dir := "/tmp/" + filepath.Base(hostDir) // in the chroot
		files, wrapper := hosts.SSHClientFiles("/usr/bin/ssh", dir)
		for name, content := range files {
			mode := os.FileMode(0o600)
			if name == wrapper {
				mode = 0o700
			}
			p := filepath.Join(hostDir, name)
			if err := os.WriteFile(p, []byte(content), mode); err != nil {
				t.Fatal(err)
			}
			if err := os.Chown(p, 65532, 65532); err != nil {
				t.Fatal(err)
			}
		}
		out := chroot(t, rootfs, user, path.Join(dir, wrapper), "-G", "-p", "2222", "-l", "root", "--", "kvm1")
		got := map[string]string{}
		for _, line := range strings.Split(out, "\n") {
			if k, v, ok := strings.Cut(line, " "); ok {
				got[k] = strings.TrimSpace(strings.Join([]string{got[k], v}, " "))
			}
		}
		for key, want := range map[string]string{
			// libvirt's arguments, passed on
			"hostname": "kvm1",
			"user":     "root",
			"port":     "2222",
			// the wrapper's -F: the connection's configuration, nothing else
			"identityfile":          path.Join(dir, "id"),
			"userknownhostsfile":    path.Join(dir, "known_hosts"),
			"globalknownhostsfile":  "none",
			"stricthostkeychecking": "true",
			"identitiesonly":        "yes",
			"batchmode":             "yes",
		} {
			if got[key] != want {
				t.Errorf("ssh -G through the wrapper: %s = %q, want %q\n%s", key, got[key], want, out)
			}
		}
	})

	t.Run("CA bundle", func(t *testing.T) {
		data, err := os.ReadFile(filepath.Join(rootfs, "etc/ssl/certs/ca-certificates.crt"))
		if err != nil {
			t.Fatal(err)
		}
		n := 0
		for block, rest := pem.Decode(data); block != nil; block, rest = pem.Decode(rest) {
			if _, err := x509.ParseCertificate(block.Bytes); err != nil {
				t.Errorf("certificate %d: %v", n+1, err)
			}
			n++
		}
		if n < 100 {
			t.Errorf("%d certificates, want Mozilla's 100 and more", n)
		}
	})

	t.Run("files", func(t *testing.T) {
		var home syscall.Stat_t
		if err := syscall.Stat(filepath.Join(rootfs, "home/manager"), &home); err != nil || home.Uid != 65532 || home.Gid != 65532 {
			t.Errorf("/home/manager: %v, owner %d:%d, want 65532:65532", err, home.Uid, home.Gid)
		}
		err := filepath.WalkDir(rootfs, func(p string, d fs.DirEntry, err error) error {
			if err != nil || !d.Type().IsRegular() {
				return err
			}
			info, err := d.Info()
			if err == nil && info.Mode()&(fs.ModeSetuid|fs.ModeSetgid) != 0 {
				t.Errorf("%s is %v: no file may be setuid or setgid", strings.TrimPrefix(p, rootfs), info.Mode())
			}
			return err
		})
		if err != nil {
			t.Fatal(err)
		}
		for _, tc := range []struct {
			pkg       string
			installed bool
		}{
			{"libvirt0", true}, {"openssh-client", true}, {"ca-certificates", true}, {"base-files", true}, {"dash", true},
			// what only maintainer scripts need is left out
			{"passwd", false}, {"openssl", false}, {"debconf", false}, {"libpam0g", false},
			{"dpkg", false}, {"tar", false}, {"debianutils", false},
		} {
			_, err := os.Stat(filepath.Join(rootfs, "var/lib/dpkg/status.d", tc.pkg))
			if got := err == nil; got != tc.installed {
				t.Errorf("package %s in /var/lib/dpkg/status.d: %v, want %v", tc.pkg, got, tc.installed)
			}
		}
	})
}
