package loadbalancer

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"

	"github.com/capi-libvirt/cluster-api-provider-libvirt/pkg/virt"
)

// stagedPath is where a new configuration is written and checked before
// it replaces ConfigPath, so HAProxy never reloads a half-written or
// invalid file.
const stagedPath = ConfigPath + ".capl-new"

// confirmPoll is how often Apply asks HAProxy which configuration runs
// after a reload, until confirmTimeout (a variable for tests).
var (
	confirmPoll    = 250 * time.Millisecond
	confirmTimeout = 30 * time.Second
)

// statsScript sends one command ($3) to the stats socket at $1:$2 and
// prints the answer, with bash's /dev/tcp: the VM needs no socat or python.
const statsScript = `exec 3<>"/dev/tcp/$1/$2" || exit 3; printf '%s\n' "$3" >&3; cat <&3`

// errNoStats means nothing answers on StatsAddress: HAProxy runs a
// configuration the provider did not write, or does not run.
var errNoStats = errors.New("HAProxy's stats socket does not answer")

// ConfigInvalidError is `haproxy -c` rejecting a configuration; Output is
// what it said.
type ConfigInvalidError struct{ Output string }

// Error quotes haproxy -c for the condition message.
func (e *ConfigInvalidError) Error() string {
	return "haproxy -c rejected the configuration: " + e.Output
}

// ReloadError is HAProxy not running the configuration after a reload;
// Log is the tail of its journal.
type ReloadError struct {
	Want, Running string
	Log           string
}

// Error says which configuration runs and ends with HAProxy's log.
func (e *ReloadError) Error() string {
	return fmt.Sprintf("HAProxy runs configuration %q instead of %s after the reload; its log ends: %s", e.Running, e.Want, e.Log)
}

// Stats sends a command ("show info", "show stat") to HAProxy's stats
// socket in the VM through the guest agent and returns the answer.
func Stats(ctx context.Context, host virt.GuestHost, domain, command string) (string, error) {
	h, p, err := net.SplitHostPort(StatsAddress)
	if err != nil {
		return "", err
	}
	res, err := host.GuestExec(ctx, domain, "/bin/bash", []string{"-c", statsScript, "capl-stats", h, p, command}, nil)
	if err != nil {
		return "", err
	}
	if res.ExitCode != 0 {
		return "", fmt.Errorf("%w: %s", errNoStats, strings.TrimSpace(string(res.Stderr)))
	}
	return string(res.Stdout), nil
}

// ParseInfo turns `show info` output ("Key: value" lines) into a map.
func ParseInfo(out string) map[string]string {
	info := map[string]string{}
	sc := bufio.NewScanner(strings.NewReader(out))
	for sc.Scan() {
		if k, v, ok := strings.Cut(sc.Text(), ":"); ok {
			info[strings.TrimSpace(k)] = strings.TrimSpace(v)
		}
	}
	return info
}

// RunningConfigID returns the ID (see Config.Render) of the configuration
// the running HAProxy loaded; "" when it runs one the provider did not
// write, or none.
func RunningConfigID(ctx context.Context, host virt.GuestHost, domain string) (string, error) {
	out, err := Stats(ctx, host, domain, "show info")
	if errors.Is(err, errNoStats) {
		return "", nil
	}
	if err != nil {
		return "", err
	}
	return ParseInfo(out)["description"], nil
}

// applyScript checks the staged configuration ($1), moves it over the
// live one ($2) and reloads HAProxy, in one guest-agent command (each
// costs a round trip and a poll); the exit code tells which step failed.
// On first boot the agent can answer while haproxy.service is still
// starting with the image's own configuration; systemd folds a reload
// asked for then into the running start job, so HAProxy would keep the
// old file: the script waits (10 s at most) for the start to finish.
const applyScript = `haproxy -c -q -f "$1" || exit 10
mv -f "$1" "$2" || exit 11
i=0
while [ "$(systemctl show -p ActiveState --value haproxy.service)" = activating ] && [ $i -lt 100 ]; do
  sleep 0.1; i=$((i + 1))
done
systemctl reload-or-restart haproxy.service || exit 12`

// Exit codes of applyScript.
const (
	exitInvalid = 10
	exitMove    = 11
	exitReload  = 12
)

// Apply makes HAProxy in the VM run cfg: it writes it next to the live
// file, has `haproxy -c` check it, moves it into place, reloads HAProxy
// (which keeps established connections and the health states of unchanged
// servers; only a stopped service is started) and then waits until the
// running HAProxy reports id. Everything goes through the guest agent: the
// VM holds no credential and runs no SSH server.
func Apply(ctx context.Context, host virt.GuestHost, domain string, cfg []byte, id string) error {
	start := time.Now()
	if err := host.GuestWriteFile(ctx, domain, stagedPath, cfg, 0o644); err != nil {
		return fmt.Errorf("writing %s: %w", stagedPath, err)
	}
	written := time.Now()
	res, err := host.GuestExec(ctx, domain, "/bin/sh", []string{"-c", applyScript, "capl-apply", stagedPath, ConfigPath}, nil)
	ctrl.LoggerFrom(ctx).V(4).Info("HAProxy configuration checked and reloaded", "write", written.Sub(start).String(), "checkAndReload", time.Since(written).String())
	switch {
	case err != nil:
		return fmt.Errorf("applying the configuration: %w", err)
	case res.ExitCode == exitInvalid:
		return &ConfigInvalidError{Output: output(res)}
	case res.ExitCode == exitMove:
		return fmt.Errorf("moving %s into place: %s", stagedPath, output(res))
	case res.ExitCode == exitReload:
		return &ReloadError{Want: id, Log: output(res) + " | " + journalTail(ctx, host, domain)}
	case res.ExitCode != 0:
		return fmt.Errorf("applying the configuration: exit code %d: %s", res.ExitCode, output(res))
	}
	return confirm(ctx, host, domain, id)
}

// confirm waits until the running HAProxy reports id.
func confirm(ctx context.Context, host virt.GuestHost, domain, id string) error {
	deadline := time.Now().Add(confirmTimeout)
	for {
		running, err := RunningConfigID(ctx, host, domain)
		if err != nil {
			return fmt.Errorf("asking HAProxy which configuration runs: %w", err)
		}
		if running == id {
			return nil
		}
		if time.Now().After(deadline) {
			return &ReloadError{Want: id, Running: running, Log: journalTail(ctx, host, domain)}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(confirmPoll):
		}
	}
}

// journalTail is the end of HAProxy's log, for the condition message.
func journalTail(ctx context.Context, host virt.GuestHost, domain string) string {
	res, err := host.GuestExec(ctx, domain, "journalctl", []string{"-u", "haproxy.service", "-n", "8", "--no-pager", "-o", "cat"}, nil)
	if err != nil {
		return err.Error()
	}
	return output(res)
}

// output is a command's stderr and stdout, trimmed and bounded for a
// condition message.
func output(res virt.ExecResult) string {
	s := strings.TrimSpace(strings.TrimSpace(string(res.Stderr)) + "\n" + strings.TrimSpace(string(res.Stdout)))
	const limit = 1024
	if len(s) > limit {
		s = s[len(s)-limit:]
	}
	return strings.ReplaceAll(s, "\n", " | ")
}
