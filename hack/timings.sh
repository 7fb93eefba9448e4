#!/usr/bin/env bash
# Sourced by hack/envtest.sh and hack/timed.sh, which run the builds that take
# minutes: before a long build they say what is built and how long it took the
# last time on this host, and they keep Go's "go: downloading" lines out of the
# way. Not sourced by the scripts whose own text keys their caches
# (hack/kubernetes.sh, images/build.sh, images/node/binaries.sh): a change here
# must not rebuild every image and binary.
#
#   timing_last KEY           "last time on this host: 4m12s" (or "first time on this host")
#   timing_record KEY SECONDS keep the figure for the next build
#   go_quiet CMD...           run CMD; its stderr's "go: downloading" lines are counted,
#                             not shown, and summed up in one line when it ends; the
#                             lines of images/build.sh that start and end an image's
#                             build get that image's figure and record it
#
# Figures live in $CAPL_TIMINGS_DIR (default /var/cache/capi-libvirt/timings, next to
# the build caches they describe; ~/.cache/capi-libvirt/timings when that is not
# writable), one file per KEY holding the seconds.

timings_dir() {
  local d=${CAPL_TIMINGS_DIR:-/var/cache/capi-libvirt/timings}
  if mkdir -p "$d" 2>/dev/null && [[ -w $d ]]; then
    echo "$d"
    return
  fi
  d=${XDG_CACHE_HOME:-$HOME/.cache}/capi-libvirt/timings
  mkdir -p "$d" 2>/dev/null && echo "$d"
}

# timing_file KEY: the file of KEY (keys may hold spaces and slashes).
timing_file() {
  local d
  d=$(timings_dir) || return 1
  echo "$d/$(printf '%s' "$1" | tr -c 'A-Za-z0-9._-' '_')"
}

# human SECONDS: 4m12s.
human() {
  local s=$1
  if ((s >= 3600)); then
    printf '%dh%02dm%02ds' $((s / 3600)) $((s % 3600 / 60)) $((s % 60))
  elif ((s >= 60)); then
    printf '%dm%02ds' $((s / 60)) $((s % 60))
  else
    printf '%ds' "$s"
  fi
}

timing_last() {
  local f s
  f=$(timing_file "$1") || {
    echo "no figure from an earlier build"
    return 0
  }
  if [[ -f $f ]] && s=$(<"$f") && [[ $s =~ ^[0-9]+$ ]]; then
    echo "last time on this host: $(human "$s")"
  else
    echo "first time on this host"
  fi
}

timing_record() {
  local f
  f=$(timing_file "$1") || return 0
  echo "$2" >"$f.tmp" 2>/dev/null && mv -f "$f.tmp" "$f" 2>/dev/null || true
}

go_quiet() {
  local n=0 rc=1 line out name
  exec {out}>&1
  # The command's stderr comes through the loop, its stdout (a script's
  # result) goes where stdout goes; a last line carries its exit status.
  while IFS= read -r line; do
    case $line in
    "go: downloading "*) n=$((n + 1)) ;;
    "capl-go-quiet-exit "*) rc=${line#capl-go-quiet-exit } ;;
    *" images: "*": building ("*)
      # images/build.sh starts an image (HH:MM:SS images: NAME: building (...)).
      printf '%s\n' "$line" >&2
      name=${line#* images: }
      name=${name%%: building*}
      printf '%s images: %s: %s\n' "$(date +%T)" "$name" "$(timing_last "image $name")" >&2
      ;;
    *" images: "*": built in "*" s: "*)
      printf '%s\n' "$line" >&2
      name=${line#* images: }
      name=${name%%: built in*}
      local secs=${line#*: built in }
      timing_record "image $name" "${secs%% s:*}"
      ;;
    *) printf '%s\n' "$line" >&2 ;;
    esac
  done < <(
    "$@" 2>&1 1>&"$out"
    echo "capl-go-quiet-exit $?"
  )
  exec {out}>&-
  if ((n > 0)); then
    printf '%s go: downloaded %d modules from the Go module proxy (into %s)\n' "$(date +%T)" "$n" "$(go env GOMODCACHE 2>/dev/null)" >&2
  fi
  return "$rc"
}
