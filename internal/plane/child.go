package plane

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"syscall"
	"time"
)

// child is a process the plane runs (etcd, kube-apiserver, the manager,
// kube-controller-manager), its output appended to a log file. It dies
// with the plane even when the plane is SIGKILLed, so that a restarted
// plane never meets a stale one on its ports or its etcd data.
type child struct {
	name    string
	logPath string
	pid     int
	// exited is closed once the process has exited; err is then its
	// exit status.
	exited chan struct{}
	err    error
}

// startChild starts binary with args and env (nil: this process's), its
// stdout and stderr appended to logPath.
func startChild(name, binary string, args, env []string, logPath string) (*child, error) {
	out, err := os.OpenFile(logPath, os.O_WRONLY|os.O_CREATE|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	c := &child{name: name, logPath: logPath, exited: make(chan struct{})}
	started := make(chan error, 1)
	go func() {
		defer out.Close()
		// Pdeathsig fires when the thread that forked the child exits, not
		// the process: pin this goroutine to its thread for the child's
		// whole life.
		runtime.LockOSThread()
		defer runtime.UnlockOSThread()
		cmd := exec.Command(binary, args...)
		cmd.Env = env
		cmd.Stdout, cmd.Stderr = out, out
		cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
		if err := cmd.Start(); err != nil {
			started <- fmt.Errorf("starting %s: %w", name, err)
			return
		}
		c.pid = cmd.Process.Pid
		started <- nil
		c.err = cmd.Wait()
		close(c.exited)
	}()
	if err := <-started; err != nil {
		return nil, err
	}
	return c, nil
}

// running tells whether the process has not exited yet.
func (c *child) running() bool {
	select {
	case <-c.exited:
		return false
	default:
		return true
	}
}

// failure describes an exit before the plane asked for it, with the end
// of the process's log.
func (c *child) failure() error {
	return fmt.Errorf("%s exited (%v); the end of %s:\n%s", c.name, c.err, c.logPath, tail(c.logPath, 20))
}

// stop sends SIGTERM and waits; after grace it sends SIGKILL. It returns
// nil when the process stopped on SIGTERM.
func (c *child) stop(grace time.Duration) error {
	if !c.running() {
		return nil
	}
	_ = syscall.Kill(c.pid, syscall.SIGTERM)
	select {
	case <-c.exited:
		var exit *exec.ExitError
		if c.err == nil || errors.As(c.err, &exit) {
			return nil
		}
		return c.err
	case <-time.After(grace):
		_ = syscall.Kill(c.pid, syscall.SIGKILL)
		<-c.exited
		return fmt.Errorf("%s (pid %d) did not stop within %s of SIGTERM and was killed", c.name, c.pid, grace)
	}
}
