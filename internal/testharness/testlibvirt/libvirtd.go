package testlibvirt

import (
	"errors"
	"fmt"
	"io/fs"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"libvirt.org/go/libvirt"
)

// LibvirtdPidFile is where `libvirtd -d` records its pid when run as root.
// The pid comes from there rather than from pidof: libvirtd forks a child
// for every command it runs (qemu-img, dnsmasq, iptables), and until that
// child execs it too is named libvirtd.
const LibvirtdPidFile = "/run/libvirtd.pid"

// StopLibvirtd sends SIGTERM to the running libvirtd and waits up to
// timeout for it to exit. Running guests keep running: QEMU does not
// depend on libvirtd.
func StopLibvirtd(timeout time.Duration) (pid int, err error) {
	b, err := os.ReadFile(LibvirtdPidFile)
	if err != nil {
		return 0, fmt.Errorf("libvirtd's pid: %w", err)
	}
	if pid, err = strconv.Atoi(strings.TrimSpace(string(b))); err != nil {
		return 0, fmt.Errorf("libvirtd's pid file %s: %w", LibvirtdPidFile, err)
	}
	if err := syscall.Kill(pid, syscall.SIGTERM); err != nil {
		return pid, fmt.Errorf("stopping libvirtd %d: %w", pid, err)
	}
	for deadline := time.Now().Add(timeout); ; time.Sleep(50 * time.Millisecond) {
		dead, state, err := ProcessDead(pid)
		if err != nil || dead {
			return pid, err
		}
		if time.Now().After(deadline) {
			return pid, fmt.Errorf("libvirtd %d did not exit within %s (state %s)", pid, timeout, state)
		}
	}
}

// StartLibvirtd starts libvirtd the way this host runs it, as a daemon
// without a service manager; it does not wait for its socket.
func StartLibvirtd() error {
	if out, err := exec.Command("libvirtd", "-d").CombinedOutput(); err != nil {
		return fmt.Errorf("starting libvirtd: %w: %s", err, out)
	}
	return nil
}

// WaitLibvirtd waits up to timeout until libvirtd accepts a connection to
// uri.
func WaitLibvirtd(uri string, timeout time.Duration) error {
	for deadline := time.Now().Add(timeout); ; time.Sleep(100 * time.Millisecond) {
		conn, err := libvirt.NewConnect(uri)
		if err == nil {
			_, err = conn.Close()
			return err
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("libvirtd did not answer on %s within %s: %w", uri, timeout, err)
		}
	}
}

// ProcessDead tells whether process pid has exited: /proc/<pid> is gone,
// or its state is zombie (Z) or dead (X). Where PID 1 reaps no orphans
// (this host runs without a service manager) an exited daemon stays a
// zombie, so /proc/<pid> vanishing cannot be the test. state is the state
// letter read, or "gone".
func ProcessDead(pid int) (dead bool, state string, err error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if errors.Is(err, fs.ErrNotExist) || errors.Is(err, syscall.ESRCH) {
		return true, "gone", nil
	}
	if err != nil {
		return false, "", err
	}
	state, err = procState(string(b))
	if err != nil {
		return false, "", err
	}
	return state == "Z" || state == "X" || state == "x", state, nil
}

// procState reads the state field of a /proc/<pid>/stat line: the first
// field after the command name, which is in parentheses and may itself
// contain spaces and parentheses.
func procState(stat string) (string, error) {
	i := strings.LastIndexByte(stat, ')')
	if i < 0 {
		return "", fmt.Errorf("malformed /proc stat %q", stat)
	}
	fields := strings.Fields(stat[i+1:])
	if len(fields) == 0 {
		return "", fmt.Errorf("malformed /proc stat %q: no state", stat)
	}
	return fields[0], nil
}
