#!/usr/bin/env bash
# Installs a build into a scratch prefix and builds consumers outside the tree: find_package with
# the static and the shared library, pkg-config with the static and the shared library (the shared
# consumer is linked with an rpath, as the README tells pkg-config users). Works for CUDA-enabled
# and CUDA-off builds alike.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
if ! cmake -S "$here" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" >"$tmp/cm.log" 2>&1; then
  cat "$tmp/cm.log"; echo "install check: find_package(tpflex) FAILED"; exit 1
fi
grep 'consumer:' "$tmp/cm.log" || true
cmake --build "$tmp/cm" >"$tmp/build.log" 2>&1 || { cat "$tmp/build.log"; echo "install check: find_package consumer build FAILED"; exit 1; }
"$tmp/cm/c"
"$tmp/cm/cs"
pc="$tmp/prefix/lib/pkgconfig"
[ -d "$pc" ] || pc="$tmp/prefix/lib64/pkgconfig"
libdir=$(PKG_CONFIG_PATH=$pc pkg-config --variable=libdir tpflex)
cc "$here/consumer.c" $(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs --static tpflex | sed 's/-ltpflex/-l:libtpflex.a/') -o "$tmp/pc"
"$tmp/pc"
cc "$here/consumer.c" $(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs tpflex) -Wl,-rpath,"$libdir" -o "$tmp/pcs"
"$tmp/pcs"
echo "install check: find_package (static, shared) and pkg-config (static, shared + rpath) consumers OK"
