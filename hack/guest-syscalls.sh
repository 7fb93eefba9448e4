#!/usr/bin/env bash
# Where a guest's system time goes, without a tool in the guest: the guest
# kernel's syscall histogram (a hist trigger on raw_syscalls/sys_enter in
# tracefs) by process and call, and its CPU split, context switches and
# page faults, over a window. Runs through the guest agent, as root in the
# guest; the trigger is removed afterwards (docs/tcg.md, "System time").
#
# Usage: hack/guest-syscalls.sh DOMAIN [SECONDS]   (default 60)
set -euo pipefail
domain=$1 seconds=${2:-60}

guest_script=$(cat <<'EOF'
T=/sys/kernel/tracing/events/raw_syscalls/sys_enter
H='hist:keys=common_pid.execname,id.syscall:vals=hitcount:size=8192'
snap() { head -1 /proc/stat; grep -E '^ctxt ' /proc/stat; grep -E '^(pgfault|pgmajfault) ' /proc/vmstat; }
echo "$H" > $T/trigger
snap; sleep "$1"; snap
grep hitcount $T/hist
echo "!$H" > $T/trigger
EOF
)

# agent runs one guest agent command; the manager asks the same agent too,
# and libvirt refuses a second command while one is in flight: retried.
agent() {
  local try
  for try in {1..30}; do
    virsh qemu-agent-command "$domain" "$1" --timeout 60 2>/dev/null && return
    sleep 2
  done
  echo "guest-syscalls: $domain's guest agent did not answer" >&2
  return 1
}
json_string() { python3 -c 'import json,sys; print(json.dumps(sys.argv[1]))' "$1"; }

cmd="echo $(base64 -w0 <<<"$guest_script") | base64 -d | sh -s $seconds"
started=$(agent "{\"execute\":\"guest-exec\",\"arguments\":{\"path\":\"/bin/sh\",\"arg\":[\"-c\",$(json_string "$cmd")],\"capture-output\":true}}")
pid=$(python3 -c 'import json,sys; print(json.load(sys.stdin)["return"]["pid"])' <<<"$started")
deadline=$((SECONDS + seconds + 300))
while :; do
  status=$(agent "{\"execute\":\"guest-exec-status\",\"arguments\":{\"pid\":$pid}}") || exit 1
  if grep -q '"exited":true' <<<"$status"; then break; fi
  if ((SECONDS > deadline)); then echo "guest-syscalls: no answer from $domain's guest agent" >&2; exit 1; fi
  sleep 2
done
status_file=$(mktemp)
trap 'rm -f "$status_file"' EXIT
printf '%s' "$status" >"$status_file"
python3 - "$seconds" "$status_file" <<'EOF'
import base64, collections, json, re, sys
r = json.load(open(sys.argv[2]))["return"]
out = base64.b64decode(r.get("out-data", "")).decode(errors="replace").splitlines()
if r.get("exitcode", 0) != 0:
    sys.exit("guest-syscalls: " + base64.b64decode(r.get("err-data", "")).decode(errors="replace"))
dur = float(sys.argv[1])
snaps = [l.split() for l in out if re.match(r"^(cpu |ctxt |pgfault |pgmajfault )", l)]
half = len(snaps) // 2
def parse(rows):
    d = {}
    for f in rows:
        if f[0] == "cpu":
            for k, v in zip(["user", "nice", "system", "idle", "iowait", "irq", "softirq"], f[1:8]):
                d[k] = int(v)
        else:
            d[f[0]] = int(f[1])
    return d
a, b = parse(snaps[:half]), parse(snaps[half:])
ticks = sum(b[k] - a[k] for k in ["user", "nice", "system", "idle", "iowait", "irq", "softirq"])
print("guest CPU: " + ", ".join(f"{k} {100 * (b[k] - a[k]) / ticks:.0f} %" for k in ["user", "system", "softirq", "idle", "iowait"]))
print(f"context switches/s: {(b['ctxt'] - a['ctxt']) / dur:.0f}; page faults/s: {(b['pgfault'] - a['pgfault']) / dur:.0f} ({(b['pgmajfault'] - a['pgmajfault']) / dur:.0f} major)")
by_process, by_call, total = collections.Counter(), collections.Counter(), 0
for l in out:
    m = re.search(r"common_pid:\s*(.*?)\s*\[\s*\d+\], id:\s*(\S+).*hitcount:\s*(\d+)", l)
    if m:
        name = "(systemd spawning)" if m.group(1).startswith("(") else m.group(1)
        n = int(m.group(3))
        by_process[name] += n
        by_call[m.group(2).removeprefix("sys_")] += n
        total += n
print(f"system calls/s: {total / dur:.0f}")
print("by process (/s): " + ", ".join(f"{k} {v / dur:.0f}" for k, v in by_process.most_common(10)))
print("by call (/s): " + ", ".join(f"{k} {v / dur:.0f}" for k, v in by_call.most_common(12)))
EOF
