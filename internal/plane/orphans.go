package plane

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// The plane's children die with it (child.go), even on SIGKILL. An etcd or
// kube-apiserver that holds the state directory's etcd data without a
// plane (say, one a user started by hand on it) would keep the next Serve
// from starting and outlive Down; Serve and Down stop it first. RSSBytes
// finds the plane's own two the same way.

// process is a running process and its arguments.
type process struct {
	pid  int
	args []string
}

// flag returns the value of --name=value in args.
func (p process) flag(name string) (string, bool) {
	for _, a := range p.args {
		if v, ok := strings.CutPrefix(a, "--"+name+"="); ok {
			return v, true
		}
	}
	return "", false
}

func processes() ([]process, error) {
	entries, err := os.ReadDir("/proc")
	if err != nil {
		return nil, err
	}
	var out []process
	for _, e := range entries {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmdline, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil || len(cmdline) == 0 {
			continue
		}
		out = append(out, process{pid: pid, args: strings.Split(string(bytes.TrimRight(cmdline, "\x00")), "\x00")})
	}
	return out, nil
}

// orphanedControlPlane finds the etcd serving dir's etcd/ data directory
// and the kube-apiserver using that etcd.
func orphanedControlPlane(dir string) ([]process, error) {
	abs, err := filepath.Abs(filepath.Join(dir, etcdDirName))
	if err != nil {
		return nil, err
	}
	procs, err := processes()
	if err != nil {
		return nil, err
	}
	var found []process
	var etcdURLs []string
	for _, p := range procs {
		if d, ok := p.flag("data-dir"); ok && filepath.Clean(d) == abs && filepath.Base(p.args[0]) == "etcd" {
			found = append(found, p)
			if u, ok := p.flag("listen-client-urls"); ok {
				etcdURLs = append(etcdURLs, strings.Split(u, ",")...)
			}
		}
	}
	for _, p := range procs {
		if filepath.Base(p.args[0]) != "kube-apiserver" {
			continue
		}
		servers, _ := p.flag("etcd-servers")
		for _, u := range etcdURLs {
			if servers != "" && strings.Contains(","+servers+",", ","+u+",") {
				found = append(found, p)
				break
			}
		}
	}
	return found, nil
}

// stopOrphanedControlPlane stops (SIGTERM, SIGKILL after 10 s) the etcd
// and kube-apiserver a killed plane of dir left behind. Only call it when
// no plane of dir runs.
func stopOrphanedControlPlane(dir string, logf func(string, ...any)) error {
	found, err := orphanedControlPlane(dir)
	if err != nil || len(found) == 0 {
		return err
	}
	for _, p := range found {
		logf("stopping %s (pid %d) left behind by a killed management plane", filepath.Base(p.args[0]), p.pid)
		_ = syscall.Kill(p.pid, syscall.SIGTERM)
	}
	// kube-apiserver drains for a while after SIGTERM; nothing is
	// connected to an orphan, so it need not wait long.
	killAt := time.Now().Add(10 * time.Second)
	giveUp := killAt.Add(10 * time.Second)
	for _, p := range found {
		killed := false
		for processAlive(p.pid, "") {
			now := time.Now()
			if now.After(giveUp) {
				return fmt.Errorf("%s (pid %d) of a killed management plane does not stop", filepath.Base(p.args[0]), p.pid)
			}
			if now.After(killAt) && !killed {
				_ = syscall.Kill(p.pid, syscall.SIGKILL)
				killed = true
			}
			time.Sleep(pollInterval)
		}
	}
	return nil
}
