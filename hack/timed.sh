#!/usr/bin/env bash
# Runs one of make's builds so that a person can follow it: before a long build a
# line says what is built and how long it took the last time on this host, Go's
# "go: downloading" lines are summed up in one, and a failure says what failed
# after how long. Stdout is the command's, untouched (scripts print their result
# there).
#
# Usage: hack/timed.sh [--key KEY --what WHAT] -- COMMAND [ARG...]
#   --key, --what  the command is one build: WHAT is announced with KEY's last
#                  figure before it runs, and its duration becomes KEY's figure
#   without        the command is images/build.sh: each image it builds gets its
#                  own line with its last figure (hack/timings.sh)
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=timings.sh
source "$root/hack/timings.sh"

key="" what=""
while (($#)); do
  case $1 in
  --key) key=$2 && shift 2 ;;
  --what) what=$2 && shift 2 ;;
  --) shift && break ;;
  *) break ;;
  esac
done
(($#)) || {
  echo "usage: $0 [--key KEY --what WHAT] -- COMMAND [ARG...]" >&2
  exit 2
}

if [[ -n $key ]]; then
  printf '%s building %s (%s)\n' "$(date +%T)" "${what:-$key}" "$(timing_last "$key")" >&2
fi
start=$SECONDS
rc=0
go_quiet "$@" || rc=$?
took=$((SECONDS - start))
if ((rc != 0)); then
  printf '%s %s failed after %s (exit %d): the lines above say why\n' "$(date +%T)" "${what:-$*}" "$(human "$took")" "$rc" >&2
  exit "$rc"
fi
if [[ -n $key ]]; then
  timing_record "$key" "$took"
fi
