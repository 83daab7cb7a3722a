#!/usr/bin/env bash
# make fresh-check: do loom's install steps hold on a fresh Debian 12 machine?
#
#   scripts/fresh-check.sh           the check: a minimal Debian 12 root (debootstrap, from the
#                                    mirror this machine's apt uses), scripts/install-deps.sh run
#                                    inside it (chroot), then the CMake configure step of every
#                                    build kind make test uses (Release, ASan+UBSan, TSan, fuzz
#                                    with clang) on the source tree
#   scripts/fresh-check.sh --full    the check, then `make run` and `make test` inside the root
#                                    on a clean copy of the committed tree (an hour and more)
#
# A missing package fails the step that needed it: apt names the package it cannot install,
# CMake names the find_package that found nothing; this script repeats that line last.
#
# The roots are cached in $LOOM_FRESH_CACHE (default ~/.cache/loom/fresh-check), outside the
# clone so that CI's fresh clones share them: the bare debootstrapped root, kept as long as its
# suite and mirror are the same, and the root with loom's packages installed, rebuilt from the
# bare one whenever scripts/install-deps.sh changes. build-fresh/ holds the logs and a link to
# the root in use. Cold (nothing cached) it took 110 s on a 2-core machine before chromium
# joined the package list, most of it downloading; with the roots cached, 7-8 s. .ci/run runs
# it before make test.
set -euo pipefail
cd "$(dirname "$0")/.."
src=$PWD

mode=check
case ${1:-} in
  "") ;;
  --full) mode=full ;;
  *) sed -n '2,21p' "$0" | sed 's/^# \{0,1\}//'; exit 2 ;;
esac

suite=bookworm
# The mirror this machine's apt uses (deb822 sources, else sources.list), else Debian's own.
mirror=$(grep -hsE '^URIs:' /etc/apt/sources.list.d/*.sources | awk '{print $2}' |
         grep -v security | head -n1 || true)
[ -n "$mirror" ] || mirror=$(grep -hsE '^deb ' /etc/apt/sources.list | awk '{print $2}' |
                             grep -v security | head -n1 || true)
[ -n "$mirror" ] || mirror=http://deb.debian.org/debian

sudo=""
[ "$(id -u)" -eq 0 ] || sudo=sudo
# It needs root (debootstrap, mount, chroot) and the mirror. Where either is missing it fails;
# with LOOM_FRESH_OPTIONAL=1 (.ci/run) it says so and stops without failing.
cannot() {
  if [ "${LOOM_FRESH_OPTIONAL:-0}" = 1 ]; then
    echo "fresh-check: NOT RUN: $*"
    exit 0
  fi
  echo "fresh-check: cannot run: $*"
  exit 1
}
if [ -n "$sudo" ] && ! sudo -n true 2>/dev/null; then
  cannot "it needs root or passwordless sudo (debootstrap, mount and chroot)"
fi
if ! $sudo unshare --mount true 2>/dev/null; then
  cannot "this machine does not let root mount file systems (a container without CAP_SYS_ADMIN?)"
fi
if command -v curl >/dev/null && ! curl -fsS -m 20 -o /dev/null "$mirror/dists/$suite/Release"; then
  cannot "the mirror $mirror does not answer"
fi
cache=${LOOM_FRESH_CACHE:-$HOME/.cache/loom/fresh-check}
mkdir -p build-fresh "$cache"
log_dir=$src/build-fresh/logs
rm -rf "$log_dir" && mkdir -p "$log_dir"
t_start=$(date +%s)
since() { echo "$(( $(date +%s) - $1 ))s"; }

fail() {  # fail STEP LOG: names the step and the line that says what is missing
  echo
  echo "fresh-check: FAILED at $1 (log: ${2#"$src"/})"
  local why
  why=$(grep -hE "Unable to locate package|has no installation candidate|Could not find a package configuration file|Could NOT find|Could not find|not found|No such file|E: " "$2" | head -n 5 || true)
  [ -n "$why" ] && printf '  %s\n' "$why"
  exit 1
}

# ---- the bare root: debootstrap, once per suite and mirror ---------------------------------
if ! command -v debootstrap >/dev/null; then
  echo "fresh-check: installing debootstrap (Debian's package), which the check needs"
  { $sudo apt-get update -qq &&
      DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends debootstrap
  } >"$log_dir/debootstrap-install.log" 2>&1 || fail "installing debootstrap" "$log_dir/debootstrap-install.log"
fi
bare_key=$(printf '%s %s minbase' "$suite" "$mirror" | sha256sum | cut -c1-12)
bare=$cache/bare-$bare_key
if [ ! -f "$bare/.loom-complete" ]; then
  t0=$(date +%s)
  echo "fresh-check: debootstrap $suite from $mirror (once; cached in $cache)"
  $sudo rm -rf "$bare"
  $sudo debootstrap --variant=minbase "$suite" "$bare" "$mirror" >"$log_dir/debootstrap.log" 2>&1 ||
    fail debootstrap "$log_dir/debootstrap.log"
  # The security and updates suites, as a fresh installation has them.
  $sudo tee "$bare/etc/apt/sources.list" >/dev/null <<EOF
deb $mirror $suite main
deb $mirror $suite-updates main
deb http://deb.debian.org/debian-security $suite-security main
EOF
  $sudo touch "$bare/.loom-complete"
  echo "  done in $(since "$t0")"
fi

# ---- the root with loom's packages: rebuilt from the bare one when the list changes --------
deps_key=$(sha256sum scripts/install-deps.sh | cut -c1-12)
root=$cache/root-$bare_key-$deps_key
ln -sfn "$root" build-fresh/root

mounted=()
unmount_all() {
  local i
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do $sudo umount -l "${mounted[$i]}" 2>/dev/null || true; done
  mounted=()
}
trap unmount_all EXIT
mount_into() {  # mount_into ROOT: what a chroot needs, and the sources read-only at /src
  local r=$1
  for d in proc sys dev dev/pts; do
    $sudo mkdir -p "$r/$d"
  done
  $sudo mount -t proc proc "$r/proc" && mounted+=("$r/proc")
  $sudo mount --rbind /sys "$r/sys" && mounted+=("$r/sys")
  $sudo mount --rbind /dev "$r/dev" && mounted+=("$r/dev")
  $sudo mkdir -p "$r/src"
  $sudo mount --bind "$src" "$r/src" && $sudo mount -o remount,bind,ro "$r/src" && mounted+=("$r/src")
  $sudo cp -L /etc/resolv.conf "$r/etc/resolv.conf" 2>/dev/null || true
}
in_root() {  # in_root COMMAND...: runs a shell command inside the root, as root
  $sudo env -i HOME=/root PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
    LANG=C.UTF-8 DEBIAN_FRONTEND=noninteractive chroot "$root" /bin/bash -c "$*"
}

if [ ! -f "$root/.loom-complete" ]; then
  t0=$(date +%s)
  echo "fresh-check: a copy of the bare root, then scripts/install-deps.sh inside it"
  # Roots made for an older package list are of no further use.
  for old in "$cache"/root-"$bare_key"-*; do
    [ "$old" = "$root" ] || $sudo rm -rf "$old"
  done
  $sudo rm -rf "$root"
  $sudo cp -a "$bare" "$root"
  $sudo rm -f "$root/.loom-complete"
  mount_into "$root"
  in_root "cd /src && scripts/install-deps.sh" >"$log_dir/install-deps.log" 2>&1 ||
    fail "scripts/install-deps.sh" "$log_dir/install-deps.log"
  in_root "apt-get clean" >/dev/null 2>&1 || true
  unmount_all
  $sudo touch "$root/.loom-complete"
  echo "  done in $(since "$t0")"
else
  echo "fresh-check: the root for this package list is cached ($root)"
fi

# ---- the configure step of every build kind ---------------------------------------------------
mount_into "$root"
# Nothing but the list may be installed; install-deps.sh must find everything present.
in_root "cd /src && scripts/install-deps.sh && echo 'install-deps: nothing missing'" \
  >"$log_dir/install-deps-again.log" 2>&1 || fail "scripts/install-deps.sh (again)" "$log_dir/install-deps-again.log"
configure() {  # configure NAME CMAKE_ARGS...
  local name=$1; shift
  local t0
  t0=$(date +%s)
  if in_root "rm -rf /tmp/fresh-$name && $* -S /src -B /tmp/fresh-$name -Wno-dev -DLOOM_WERROR=ON" \
       >"$log_dir/configure-$name.log" 2>&1; then
    echo "  configure $name: ok ($(since "$t0"))"
  else
    fail "the CMake configure step of the $name build" "$log_dir/configure-$name.log"
  fi
}
echo "fresh-check: configuring every build kind of make test inside the root"
configure release cmake -DCMAKE_BUILD_TYPE=Release
configure asan cmake -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=address -DLOOM_BUILD_TOOLS=OFF
configure tsan cmake -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=thread -DLOOM_BUILD_TOOLS=OFF
configure fuzz env CC=clang CXX=clang++ cmake -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOOM_SANITIZE=address \
  -DLOOM_FUZZ=ON -DLOOM_BUILD_TESTS=OFF -DLOOM_BUILD_TOOLS=OFF

if [ "$mode" = full ]; then
  # make run and make test on a clean copy of the committed tree, as a new user would.
  { $sudo rm -rf "$root/root/loom" && git archive --format=tar --prefix=loom/ HEAD |
      $sudo tar -x -C "$root/root"; } >"$log_dir/copy.log" 2>&1 ||
    fail "copying the committed tree" "$log_dir/copy.log"
  # The compiler cache of this machine, if any, is shared: it holds compiler output only, so
  # it cannot hide a missing package, and it spares an hour of compiling.
  host_ccache=$(ccache -k cache_dir 2>/dev/null || true)
  if [ -n "$host_ccache" ] && [ -d "$host_ccache" ]; then
    $sudo mkdir -p "$root/root/.cache/ccache"
    $sudo mount --bind "$host_ccache" "$root/root/.cache/ccache" && mounted+=("$root/root/.cache/ccache")
  fi
  t0=$(date +%s)
  in_root "cd /root/loom && make run" >"$log_dir/make-run.log" 2>&1 || fail "make run" "$log_dir/make-run.log"
  echo "  make run: ok ($(since "$t0")); $(grep -E 'test accuracy' "$log_dir/make-run.log" | tail -n1 | sed 's/^ *//')"
  t0=$(date +%s)
  in_root "cd /root/loom && make test" >"$log_dir/make-test.log" 2>&1 || fail "make test" "$log_dir/make-test.log"
  echo "  make test: ok ($(since "$t0")); $(tail -n1 "$log_dir/make-test.log")"
fi
unmount_all

echo "fresh-check: passed in $(since "$t_start")"
