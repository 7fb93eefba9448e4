#!/usr/bin/env bash
# Host CPU of each libvirt guest (its QEMU process) and of the busiest other
# processes over a window, in host core-seconds per minute: the figure
# docs/tcg.md compares settings by. Usage: hack/tcg-cost.sh [seconds, default 60]
set -euo pipefail
window=${1:-60}
hz=$(getconf CLK_TCK)

# ticks prints "pid ticks label" for every process; a QEMU process is
# labelled by its guest name, any other by its command name.
ticks() {
  local stat pid rest label
  for stat in /proc/[0-9]*/stat; do
    pid=${stat#/proc/}; pid=${pid%/stat}
    rest=$(cat "$stat" 2>/dev/null) || continue
    label=${rest#*(}; label=${label%%)*}
    rest=${rest##*) }
    # f starts at stat's 3rd field (state): utime and stime, the 14th and
    # 15th, are f[11] and f[12].
    read -r -a f <<<"$rest"
    if [[ $label == qemu-system* ]]; then
      label=$(tr '\0' '\n' </proc/"$pid"/cmdline 2>/dev/null | sed -n '/^-name$/{n;s/^guest=\([^,]*\).*/\1/p;q}') || true
      label="vm:${label:-unknown}"
    fi
    echo "$pid $((f[11] + f[12])) ${label// /_}"
  done
}

before=$(ticks)
sleep "$window"
after=$(ticks)
# Per label, core-seconds per minute; a process started in the window
# counts all its CPU, one that ended in it is missed.
awk -v hz="$hz" -v w="$window" '
  NR == FNR { before[$1] = $2; next }
  { d[$3] += $2 - before[$1] }
  END {
    for (l in d) { c = d[l] / hz * 60 / w; total += c; if (c >= 0.1) printf "%8.1f  %s\n", c, l }
    printf "%8.1f  all (host core-seconds per minute over %d s)\n", total, w }' <(echo "$before") <(echo "$after") |
  sort -k1,1nr
