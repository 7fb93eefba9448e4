#!/usr/bin/env bash
# Runs a command so that it only takes CPU that nothing else on the host
# wants, the VMs included: in a cpu cgroup marked idle (cpu.idle, Linux
# 5.15+), made on first use.
#
# `nice -n 19` alone does not do that: libvirt puts each QEMU in a cgroup
# of its own (cpu:/machine/...), and with autogroups (the Debian default)
# a command outside any cgroup competes through its session's group, whose
# weight is the same as /machine's whatever the command's nice. A niced
# compile then takes half of a 2-core host from the guests when both want
# CPU (docs/tcg.md, "Nice is not idle").
#
# Usage: hack/idle.sh COMMAND [ARG...]
# Without a writable cpu cgroup it falls back to a session of its own at
# autogroup nice 19, and says so.
set -euo pipefail

[[ $# -gt 0 ]] || {
  echo "usage: $0 COMMAND [ARG...]" >&2
  exit 2
}

# join_idle_cgroup moves this shell into an idle cpu cgroup (cgroup v1's
# cpu controller, or the unified hierarchy with cpu enabled); false when
# neither is writable.
join_idle_cgroup() {
  local group
  for group in /sys/fs/cgroup/cpu/capl-idle /sys/fs/cgroup/capl-idle; do
    [[ -d ${group%/*} && -w ${group%/*} ]] || continue
    mkdir -p "$group" 2>/dev/null || continue
    [[ -w $group/cpu.idle ]] || continue
    echo 1 >"$group/cpu.idle" 2>/dev/null || continue
    echo $$ >"$group/cgroup.procs" 2>/dev/null || continue
    return 0
  done
  return 1
}

if join_idle_cgroup; then
  exec nice -n 19 "$@"
fi
echo "idle.sh: no writable cpu cgroup with cpu.idle; running in a session of its own at autogroup nice 19" >&2
exec setsid -w bash -c 'echo 19 >/proc/self/autogroup 2>/dev/null || true; exec nice -n 19 "$@"' idle "$@"
