#!/usr/bin/env bash
# shellcheck disable=SC2046,SC2086  # compiler flags from pkg-config are word-split on purpose
# The installed tree works for a consumer: `cmake --install` into a temporary prefix, then
# tests/install/app.c (one greedy chat turn on a fixture model) built, linked and run against the
# shared and the static library, once through pkg-config and once through find_package(lmx).
# Also: liblmx.so carries a versioned soname and exports exactly the functions lmx.h declares, and
# the issue-15 command `cc app.c $(pkg-config --cflags --libs --static lmx)` links.  On a CUDA build
# (no GPU needed) the same links prove lmx.pc and lmxTargets.cmake carry the CUDA libraries.
# usage: install_check.sh BUILD_DIR FIXTURES [CMAKE CC PKG_CONFIG]
set -euo pipefail
build=$(cd "$1" && pwd) fixtures=$2
cmake=${3:-cmake} cc=${4:-cc} pkgconfig=${5:-pkg-config}
here=$(cd "$(dirname "$0")" && pwd)
model=$fixtures/real/stories260K.gguf message=Hello
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; exit 1; }

prefix=$tmp/prefix
"$cmake" --install "$build" --prefix "$prefix" >/dev/null || fail "cmake --install $build"
pc=$(find "$prefix" -name lmx.pc) && [ -n "$pc" ] || fail "no lmx.pc under $prefix"
PKG_CONFIG_PATH=$(dirname "$pc")
export PKG_CONFIG_PATH
libdir=$("$pkgconfig" --variable=libdir lmx)
libdir=$(cd "$libdir" && pwd)
version=$("$pkgconfig" --modversion lmx)
for f in "$libdir/liblmx.a" "$libdir/liblmx.so" "$("$pkgconfig" --variable=includedir lmx)/lmx.h" \
         "$libdir/cmake/lmx/lmxConfig.cmake" "$libdir/cmake/lmx/lmxConfigVersion.cmake"; do
    [ -e "$f" ] || fail "not installed: $f"
done

# The soname carries major.minor (0.x: a minor version may change the ABI).
soname=$(readelf -d "$libdir/liblmx.so" | sed -n 's/.*(SONAME).*\[\(.*\)\]/\1/p')
[ "$soname" = "liblmx.so.${version%.*}" ] || fail "soname '$soname', expected liblmx.so.${version%.*}"
[ -e "$libdir/$soname" ] || fail "$soname is not installed"
echo "ok: liblmx.so soname $soname"

# Exactly lmx.h's functions are exported (internal modules, the CUDA runtime stay hidden).
declared=$(python3 - "$("$pkgconfig" --variable=includedir lmx)/lmx.h" <<'PY'
import re, sys
src = re.sub(r"/\*.*?\*/", "", open(sys.argv[1]).read(), flags=re.S)
print("\n".join(sorted(set(re.findall(r"\b(lmx_[a-z0-9_]+)\s*\(", src)))))
PY
)
exported=$(nm -D --defined-only "$libdir/liblmx.so" | awk '{print $3}' | sort)
[ "$declared" = "$exported" ] || fail "liblmx.so exports differ from lmx.h: $(diff <(echo "$declared") <(echo "$exported") | grep '^[<>]' | tr '\n' ' ')"
echo "ok: liblmx.so exports the $(wc -l <<<"$exported") functions lmx.h declares"

needs_liblmx() { readelf -d "$1" | grep -q "NEEDED.*\[$soname\]"; }
expected=
run_app() { # name binary: runs it, checks it is linked as named, and every app says the same
    local name=$1 bin=$2 out
    case $name in
        *static*) ! needs_liblmx "$bin" || fail "$name: needs $soname";;
        *) needs_liblmx "$bin" || fail "$name: does not need $soname";;
    esac
    out=$(LD_LIBRARY_PATH=$libdir "$bin" "$model" "$message") || fail "$name: exit $?"
    [ -n "$out" ] || fail "$name: empty reply"
    if [ -z "$expected" ]; then expected=$out
    elif [ "$out" != "$expected" ]; then fail "$name: replied '$out', others '$expected'"; fi
    echo "ok: $name: '${out//$'\n'/\\n}'"
}

# pkg-config: shared (-llmx), static (the archive in place of -llmx, plus Libs.private), and the
# issue's literal command (the linker takes liblmx.so, the static flags are extra).
app=$here/install/app.c
cflags=$("$pkgconfig" --cflags lmx)
"$cc" "$app" -o "$tmp/pc_shared" $cflags $("$pkgconfig" --libs lmx) -Wl,-rpath,"$libdir" \
    || fail "pkg-config shared link"
run_app pkg-config-shared "$tmp/pc_shared"
static_libs=$("$pkgconfig" --libs --static lmx)
"$cc" "$app" -o "$tmp/pc_static" $cflags ${static_libs/-llmx/-l:liblmx.a} || fail "pkg-config static link"
run_app pkg-config-static "$tmp/pc_static"
"$cc" "$app" -o "$tmp/pc_issue" $("$pkgconfig" --cflags --libs --static lmx) || fail "pkg-config --static link"
run_app pkg-config-literal "$tmp/pc_issue"

# find_package(lmx): lmx::lmx (shared) and lmx::lmx_static.
"$cmake" -S "$here/install" -B "$tmp/consumer" -DCMAKE_PREFIX_PATH="$prefix" -DCMAKE_C_COMPILER="$cc" \
    -DLMX_EXPECT_VERSION="$version" >"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; fail "find_package(lmx)"; }
"$cmake" --build "$tmp/consumer" >>"$tmp/consumer.log" 2>&1 || { cat "$tmp/consumer.log"; fail "cmake consumer build"; }
run_app cmake-shared "$tmp/consumer/app_shared"
run_app cmake-static "$tmp/consumer/app_static"

# The installed lmx command answers the same.
cli=$(printf '%s\n' "$message" | "$prefix/bin/lmx" chat "$model" --max-tokens 8 --temp 0)
grep -qF "$expected" <<<"$cli" || fail "lmx chat answered '$cli', the library '$expected'"
echo "ok: installed lmx chat agrees"
