#!/usr/bin/env bash
# Installs a build into a scratch prefix and builds a consumer with find_package and pkg-config.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
cmake --install "$build" --prefix "$tmp/prefix" >/dev/null
cmake -S "$here" -B "$tmp/cm" -DCMAKE_PREFIX_PATH="$tmp/prefix" >/dev/null
cmake --build "$tmp/cm" >/dev/null
"$tmp/cm/c"
pc="$tmp/prefix/lib/pkgconfig"
cc "$here/consumer.c" $(PKG_CONFIG_PATH=$pc pkg-config --cflags --libs --static tpflex | sed 's/-ltpflex/-l:libtpflex.a/') -o "$tmp/pc"
"$tmp/pc"
echo "install check: find_package and pkg-config consumers OK"
