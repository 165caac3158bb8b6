#!/usr/bin/env bash
# Check the README's two commands the way a new user meets them: a fresh Debian root (debootstrap
# minbase: no compiler, no cmake, no python), a clean clone of this repository in it with the shared
# fixtures beside it as ../shared, and the README's "Two commands" run exactly as written there
# (read from the clone's README.md): the main job with a question piped in, then the test command.
# Before that, as an ordinary user without sudo, scripts/setup.sh must fail with one line naming the
# missing packages.  Run as root on Debian (debootstrap is installed with apt-get when missing);
# mounts live in a private mount namespace, so nothing stays mounted when the script ends.  The fresh
# root gets the host's network set-up, as a new machine beside it would: resolv.conf, proxy variables
# and the locally added CA certificates (/usr/local/share/ca-certificates).
#
# usage: scripts/fresh_debian_check.sh [options]
#   --main-only      run only the main job (the test command builds twice and runs every test)
#   --as-user        run the commands as an ordinary user with sudo (default: as root)
#   --worktree       copy the working tree as `git add -A` would see it, instead of cloning HEAD
#   --suite NAME     Debian suite (default: the host's codename, else bookworm)
#   --mirror URL     Debian mirror (default http://deb.debian.org/debian)
#   --shared DIR     the shared fixtures folder (default: ../shared beside this repository)
#   --keep           keep the fresh root (its path is printed) instead of deleting it
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
main_only=0 as_user=0 worktree=0 keep=0
suite=$( (. /etc/os-release 2>/dev/null && echo "${VERSION_CODENAME:-}") || true)
suite=${suite:-bookworm}
mirror=http://deb.debian.org/debian
shared=$(cd "$repo/.." && pwd)/shared
while [ $# -gt 0 ]; do
    case $1 in
    --main-only) main_only=1 ;;
    --as-user) as_user=1 ;;
    --worktree) worktree=1 ;;
    --keep) keep=1 ;;
    --suite) suite=$2; shift ;;
    --mirror) mirror=$2; shift ;;
    --shared) shared=$(cd "$2" && pwd); shift ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) echo "fresh_debian_check: unknown option $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ "$(id -u)" = 0 ] || { echo "fresh_debian_check: run as root (debootstrap, chroot, mounts)" >&2; exit 2; }
[ -d "$shared/fixtures" ] || { echo "fresh_debian_check: no fixtures in $shared (--shared DIR)" >&2; exit 2; }

log() { printf '== %s  %s\n' "$(date +%T)" "$*"; }
t0=$SECONDS
if ! command -v debootstrap >/dev/null; then
    log "installing debootstrap on the host"
    DEBIAN_FRONTEND=noninteractive apt-get -y -q update >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get -y -q install --no-install-recommends debootstrap >/dev/null
fi

work=$(mktemp -d /var/tmp/lmx-fresh.XXXXXX)
root=$work/root
cleanup() {
    if [ $keep = 1 ]; then echo "kept: $root"; return; fi
    # Never delete through a mount (the namespace's mounts are gone by now; check anyway).
    if grep -q " $work/" /proc/self/mountinfo; then
        echo "fresh_debian_check: something is still mounted under $work; not deleting it" >&2
    else
        rm -rf "$work"
    fi
}
trap cleanup EXIT

log "debootstrap --variant=minbase $suite ($mirror)"
debootstrap --variant=minbase "$suite" "$root" "$mirror" >"$work/debootstrap.log" 2>&1 ||
    { tail -n 20 "$work/debootstrap.log"; echo "fresh_debian_check: debootstrap failed" >&2; exit 1; }
t_root=$((SECONDS - t0))

# The clone: /src/lmx, the fixtures at /src/shared (read-only bind mount below).
mkdir -p "$root/src/lmx" "$root/src/shared"
if [ $worktree = 1 ]; then
    log "copying the working tree of $repo"
    (cd "$repo" && git ls-files -z --cached --others --exclude-standard |
        while IFS= read -r -d '' f; do [ -e "$f" ] && printf '%s\0' "$f"; done |
        tar --null -T - -cf -) | tar -xf - -C "$root/src/lmx"
else
    log "cloning $repo (HEAD $(git -C "$repo" rev-parse --short HEAD))"
    git clone -q --no-hardlinks "$repo" "$root/src/lmx"
fi
chmod 755 "$root/src" "$root/src/lmx"
# The network as the host meets it: its resolver and the CA certificates added on it locally (a
# TLS-intercepting proxy's, say; Debian's ca-certificates package, once installed, trusts them too).
cp /etc/resolv.conf "$root/etc/resolv.conf"
if compgen -G '/usr/local/share/ca-certificates/*' >/dev/null; then
    mkdir -p "$root/usr/local/share/ca-certificates"
    cp -r /usr/local/share/ca-certificates/. "$root/usr/local/share/ca-certificates/"
fi
chroot "$root" useradd -m -s /bin/bash lmx

readme_block() { # N: the Nth ```sh block under "## Two commands" of the clone's README.md
    awk -v n="$1" '/^## Two commands/ {s = 1; next}  s && /^## / {exit}
                   s && /^```sh/ {b++; inside = 1; next}  /^```/ {inside = 0; next}
                   s && inside && b == n' "$root/src/lmx/README.md"
}
main_cmd=$(readme_block 1) test_cmd=$(readme_block 2)
[ -n "$main_cmd" ] && [ -n "$test_cmd" ] ||
    { echo "fresh_debian_check: README.md has no two sh blocks under '## Two commands'" >&2; exit 1; }

# Inside a private mount namespace: /dev, /proc, /sys, /dev/pts, /dev/shm and the fixtures, then
# each step in the chroot with a clean environment.
uid=$(chroot "$root" id -u lmx)
export root shared main_cmd test_cmd main_only as_user uid
inner=$(cat <<'INNER'
set -euo pipefail
mount --rbind /dev "$root/dev"
mount -t proc proc "$root/proc"
mount --rbind /sys "$root/sys"
mount -t tmpfs tmpfs "$root/dev/shm"
mount --bind "$shared" "$root/src/shared"
mount -o remount,bind,ro "$root/src/shared"
log() { printf '== %s  %s\n' "$(date +%T)" "$*"; }
proxies=()
for v in http_proxy https_proxy no_proxy HTTP_PROXY HTTPS_PROXY NO_PROXY; do
    [ -z "${!v:-}" ] || proxies+=("$v=${!v}")
done
in_root() { # user command...: run in the chroot, in the clone, with a fresh login-like environment
    local user=$1 spec=0:0 home=/root; shift
    [ "$user" = root ] || { spec=$uid:$uid home=/home/$user; }
    chroot --userspec="$spec" "$root" /usr/bin/env -i HOME="$home" USER="$user" LANG=C.UTF-8 \
        PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin TERM=dumb "${proxies[@]}" \
        bash -c 'cd /src/lmx && eval "$1"' bash "$*"
}

log "as a user without root or sudo: scripts/setup.sh must name the missing packages in one line"
rc=0
err=$(in_root lmx scripts/setup.sh 2>&1 >/dev/null </dev/null) || rc=$?
if [ $rc = 1 ] && [ "$(wc -l <<<"$err")" = 1 ] && grep -q 'libcjson-dev' <<<"$err"; then
    echo "ok: $err"
else
    echo "FAIL: exit $rc, stderr: $err"; exit 1
fi

user=root
if [ "$as_user" = 1 ]; then
    log "installing sudo for user lmx (passwordless)"
    in_root root 'DEBIAN_FRONTEND=noninteractive apt-get -y -q update >/dev/null &&
        DEBIAN_FRONTEND=noninteractive apt-get -y -q install --no-install-recommends sudo >/dev/null &&
        echo "lmx ALL=(ALL) NOPASSWD:ALL" >/etc/sudoers.d/lmx' </dev/null
    chroot "$root" chown -R lmx:lmx /src/lmx
    user=lmx
fi

log "main job as $user: $main_cmd"
t=$SECONDS
out=$(printf 'What is the capital of France?\n' | in_root $user "$main_cmd") || { echo "FAIL: main job exit $?"; exit 1; }
printf '%s\n' "$out" | sed 's/^/    | /'
[ -n "$(tr -d '[:space:]' <<<"$out")" ] || { echo "FAIL: the main job printed no reply"; exit 1; }
echo "ok: main job ran in $((SECONDS - t)) s"
if [ "$main_only" = 1 ]; then exit 0; fi

log "test command as $user: $test_cmd"
t=$SECONDS
in_root $user "$test_cmd" </dev/null || { echo "FAIL: test command exit $?"; exit 1; }
echo "ok: test command ran in $((SECONDS - t)) s"
INNER
)
unshare --mount --propagation private -- bash -c "$inner"
log "passed (fresh root made in $t_root s; $((SECONDS - t0)) s in all)"
