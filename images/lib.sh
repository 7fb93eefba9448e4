# Sourced by images/build.sh (the qcow2 images) and images/manager/build.sh
# (the manager's container image): what both build from and how, so that they
# take the same Debian packages from the same mirrors and the same .deb cache.
#
# Sourcing it only defines: it sets suite, image_dir, deb_cache,
# SOURCE_DATE_EPOCH (exported), mm_common and mm_save_debs (mmdebstrap
# options) and fails on nothing, so a script can source it before parsing its
# options and checking its host. find_mirrors, called after those checks,
# sets mirror, security and sources (mmdebstrap's source lines) from /etc/apt.
# start_work takes the build lock and makes $work, which every exit path
# removes. The sourcing script may set log_prefix first.

log() { printf '%s %s: %s\n' "$(date +%T)" "${log_prefix:-images}" "$*" >&2; }
die() {
  log "error: $*"
  exit 1
}

suite=bookworm
image_dir=${CAPL_IMAGE_DIR:-/var/cache/capi-libvirt/images}
deb_cache=${CAPL_DEB_CACHE:-$image_dir/debs}
# Pinned so that two builds of the same recipe and mirror content agree.
export SOURCE_DATE_EPOCH=${SOURCE_DATE_EPOCH:-1735689600} # 2025-01-01T00:00:00Z

# --- Debian mirrors, read from the host's apt configuration ----------------------
apt_uris() { # URIs of enabled "deb" entries, one-line and deb822 style
  local f
  for f in /etc/apt/sources.list /etc/apt/sources.list.d/*.list; do
    [[ -f $f ]] || continue
    awk '$1 == "deb" { i = 2; if ($i ~ /^\[/) { while (i <= NF && $i !~ /\]$/) i++; i++ } print $i }' "$f"
  done
  for f in /etc/apt/sources.list.d/*.sources; do
    [[ -f $f ]] || continue
    awk 'function flush() {
           if (types ~ /(^| )deb( |$)/ && enabled != "no") { n = split(uris, u, " "); for (j = 1; j <= n; j++) print u[j] }
           types = ""; uris = ""; enabled = ""
         }
         /^[ \t]*#/ { next }
         /^[ \t]*$/ { flush(); next }
         tolower($1) == "types:" { sub(/^[^:]*:[ \t]*/, ""); types = $0 }
         tolower($1) == "uris:" { sub(/^[^:]*:[ \t]*/, ""); uris = $0 }
         tolower($1) == "enabled:" { enabled = tolower($2) }
         END { flush() }' "$f"
  done
}
# find_mirrors sets mirror, security and sources: CAPL_MIRROR and
# CAPL_SECURITY_MIRROR, or the host's apt configuration.
find_mirrors() {
  local uris
  uris=$(apt_uris)
  mirror=${CAPL_MIRROR:-$(grep -E '/debian/?$' <<<"$uris" | head -n1 || true)}
  security=${CAPL_SECURITY_MIRROR:-$(grep -E '/debian-security/?$' <<<"$uris" | head -n1 || true)}
  [[ -n $mirror ]] || die "no Debian mirror (URI ending in /debian) in /etc/apt; set CAPL_MIRROR"
  mirror=${mirror%/} security=${security%/}
  sources=("deb $mirror $suite main" "deb $mirror $suite-updates main")
  if [[ -n $security ]]; then
    sources+=("deb $security $suite-security main")
  else
    log "warning: no Debian security mirror (URI ending in /debian-security) in /etc/apt; building without $suite-security"
  fi
}

packages() { # package names from list files
  sed -e 's/#.*//' "$@" | tr -s ' \t' '\n\n' | sed '/^$/d'
}

# --- work directory, lock, cleanup on every exit path ------------------------------
mounts_under() { # mount points below $1, deepest first
  awk -v d="$1/" 'index($5, d) == 1 { print $5 }' /proc/self/mountinfo | sort -r
}
release_dir() { # unmount, detach loop devices of and delete a work directory
  local dir=$1 m dev back
  while read -r m; do
    [[ -n $m ]] || continue
    umount "$m" 2>/dev/null || umount -l "$m" || true
  done < <(mounts_under "$dir")
  while read -r dev back; do
    [[ -n $dev && $back == "$dir/"* ]] || continue
    partx -d "$dev" 2>/dev/null || true
    losetup -d "$dev" || true
  done < <(losetup -l -n -O NAME,BACK-FILE 2>/dev/null)
  if [[ -n $(mounts_under "$dir") ]]; then
    log "warning: $dir still has mounts; not deleting it"
    return 0
  fi
  rm -rf --one-file-system "$dir"
}

child=
run() { # a long command, in the background so that signals reach our traps at once
  "$@" &
  child=$!
  wait "$child"
  child=
}
cleanup() {
  local rc=$?
  set +e
  if [[ -n $child ]]; then # interrupted: let mmdebstrap undo its own mounts first
    kill -TERM "$child" 2>/dev/null
    wait "$child" 2>/dev/null
  fi
  release_dir "$work"
  ((rc == 0)) || log "failed (exit $rc); nothing half-built was kept"
  exit "$rc"
}

# start_work takes the lock every build shares (the .deb cache, the work
# directories), removes what killed builds left and makes $work.
start_work() {
  local stale
  mkdir -p "$image_dir" "$deb_cache"
  exec 9>"$image_dir/.build.lock"
  if ! flock -n 9; then
    log "waiting for another image build ($image_dir/.build.lock)"
    flock 9
  fi
  # Leftovers of a build that was killed (SIGKILL, power loss); we hold the lock.
  rm -f "$deb_cache"/.*.part
  for stale in "$image_dir"/.work.*; do
    [[ -d $stale ]] || continue
    log "removing leftovers of an interrupted build: $stale"
    release_dir "$stale"
  done
  work=$(mktemp -d "$image_dir/.work.XXXXXX")
  chmod 0755 "$work" # apt's _apt user downloads into the chroot
  trap cleanup EXIT
  trap 'exit 130' INT
  trap 'exit 143' TERM HUP
  mkdir -p "$work/tmp"
  export TMPDIR=$work/tmp # mmdebstrap and friends: nothing in /tmp
}

# mmdebstrap options of every root file system: .debs come from the cache
# (mm_common) and go back into it (mm_save_debs, after the other hooks; in
# mmdebstrap's extract variant, which runs no customize hooks, pass
# mm_save_debs_hook as an --extract-hook); no documentation, manual pages or
# translations.
mm_common=(
  --mode=root
  --aptopt='Acquire::Retries "3"'
  --dpkgopt='path-exclude=/usr/share/man/*'
  --dpkgopt='path-exclude=/usr/share/locale/*'
  --dpkgopt='path-include=/usr/share/locale/locale.alias'
  --dpkgopt='path-exclude=/usr/share/doc/*'
  --dpkgopt='path-include=/usr/share/doc/*/copyright'
  --dpkgopt='path-exclude=/usr/share/info/*'
  --setup-hook='mkdir -p "$1/var/cache/apt/archives/partial" &&
      for f in "$CAPL_DEB_CACHE"/*.deb; do
        [ -e "$f" ] || continue
        ln "$f" "$1/var/cache/apt/archives/" 2>/dev/null || cp "$f" "$1/var/cache/apt/archives/"
      done'
)
mm_save_debs_hook='for f in "$1"/var/cache/apt/archives/*.deb; do
        [ -e "$f" ] || continue
        b=${f##*/}
        [ -e "$CAPL_DEB_CACHE/$b" ] && continue
        cp "$f" "$CAPL_DEB_CACHE/.$b.part" && mv "$CAPL_DEB_CACHE/.$b.part" "$CAPL_DEB_CACHE/$b"
      done'
mm_save_debs=(--customize-hook="$mm_save_debs_hook")
