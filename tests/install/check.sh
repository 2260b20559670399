#!/usr/bin/env bash
# Installs a build into a scratch prefix and builds consumers outside the tree: find_package with
# the static and the shared library; the README's two pkg-config lines (shared with an rpath,
# static with -l:libtpflex.a) exactly as written there; examples/hello_tpflex.c's own build line
# as written in its comment; examples/loopback_backend (a backend outside the tree) with its own
# CMakeLists.txt. Then the installed tpflex, and a copy of the prefix moved elsewhere,
# must find their cost tables under their own prefix (share/tpflex/cost), not in the source tree.
# Works for CUDA-enabled and CUDA-off builds alike.
set -euo pipefail
build=${1:-build}
here=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$here/../.." && pwd)
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
export PKG_CONFIG_PATH=$pc

# The README's pkg-config lines ("cc app.c ... -o app" in "Using the installed library"), run as
# written with app.c = consumer.c: the first must need libtpflex.so (found through its rpath),
# the second must not (static).
mapfile -t lines < <(awk '/^## Using the installed library/ {f=1; next} f && /^## / {exit}
                          f && /^cc app\.c / {print}' "$root/README.md")
[ "${#lines[@]}" = 2 ] || { echo "install check: README has ${#lines[@]} 'cc app.c' lines, want 2 (shared, static)"; exit 1; }
mkdir -p "$tmp/app"
cp "$here/consumer.c" "$tmp/app/app.c"
for i in 0 1; do
  (cd "$tmp/app" && rm -f app && eval "${lines[$i]}") || { echo "install check: README line FAILED: ${lines[$i]}"; exit 1; }
  (cd / && env -u LD_LIBRARY_PATH "$tmp/app/app") || { echo "install check: README line's program FAILED: ${lines[$i]}"; exit 1; }
  needs=$(readelf -d "$tmp/app/app" | grep -c 'NEEDED.*libtpflex' || true)
  if [ "$i" = 0 ] && [ "$needs" != 1 ]; then echo "install check: the shared line did not link libtpflex.so"; exit 1; fi
  if [ "$i" = 1 ] && [ "$needs" != 0 ]; then echo "install check: the static line linked libtpflex.so"; exit 1; fi
done

# examples/hello_tpflex.c's build line, as its comment writes it (continuation lines joined).
hello=$(awk '/^ \* Build/ {f=1; next} f && /^ \*\// {exit} f {sub(/^ \*[ ]+/, ""); printf "%s ", $0}' \
  "$root/examples/hello_tpflex.c" | sed 's/\\ / /g')
case "$hello" in "cc hello_tpflex.c "*) ;; *) echo "install check: no build line in hello_tpflex.c: '$hello'"; exit 1 ;; esac
mkdir -p "$tmp/hello"
cp "$root/examples/hello_tpflex.c" "$tmp/hello/"
if grep -q 'TPF_HAVE_SIM' "$tmp/prefix/lib"*/cmake/tpflex/tpflexTargets.cmake 2>/dev/null; then
  (cd "$tmp/hello" && eval "$hello") || { echo "install check: hello_tpflex.c's build line FAILED: $hello"; exit 1; }
  (cd / && env -u LD_LIBRARY_PATH "$tmp/hello/hello" | grep -q "every microbatch OK") ||
    { echo "install check: the hello program built by its own line FAILED"; exit 1; }
  hello_msg="hello_tpflex.c's build line"
else
  hello_msg="(hello_tpflex.c needs the simulator, not in this build)"
fi

# examples/loopback_backend: a backend written outside the tree, built from the installed headers
# and library as its CMakeLists.txt says, runs one operation. Then the same build against a copy of
# the prefix without tpflex_backend_support.h must fail: the example needs the installed header.
lb=$root/examples/loopback_backend
{ cmake -S "$lb" -B "$tmp/lb" -DCMAKE_PREFIX_PATH="$tmp/prefix" && cmake --build "$tmp/lb"; } >"$tmp/lb.log" 2>&1 ||
  { cat "$tmp/lb.log"; echo "install check: examples/loopback_backend build FAILED"; exit 1; }
{ (cd / && env -u LD_LIBRARY_PATH "$tmp/lb/loopback") >"$tmp/lb.out" 2>&1 &&
  grep -q "on an out-of-tree backend OK" "$tmp/lb.out"; } ||
  { cat "$tmp/lb.out"; echo "install check: examples/loopback_backend's program FAILED"; exit 1; }
cp -a "$tmp/prefix" "$tmp/nosupport"
rm "$tmp/nosupport/include/tpflex/tpflex_backend_support.h"
if { cmake -S "$lb" -B "$tmp/lb-nosupport" -DCMAKE_PREFIX_PATH="$tmp/nosupport" &&
     cmake --build "$tmp/lb-nosupport"; } >"$tmp/lb-nosupport.log" 2>&1; then
  echo "install check: examples/loopback_backend built without tpflex_backend_support.h installed"; exit 1
fi
grep -q 'tpflex_backend_support.h' "$tmp/lb-nosupport.log" ||
  { cat "$tmp/lb-nosupport.log"; echo "install check: the build without the support header failed for another reason"; exit 1; }

# The installed tool finds its cost tables under its own prefix, also after the prefix moved.
ncost=$(ls "$root"/data/cost/*.txt | wc -l)
[ "$(ls "$tmp/prefix/share/tpflex/cost/"*.txt | wc -l)" = "$ncost" ] ||
  { echo "install check: share/tpflex/cost lacks some of data/cost/*.txt"; exit 1; }
cp -a "$tmp/prefix" "$tmp/moved"
for p in prefix moved; do
  out=$(cd / && "$tmp/$p/bin/tpflex" plan --tp 4 --capacity 64 --hidden 64 --algo ring --coll ag --predict) ||
    { echo "install check: $p/bin/tpflex plan --predict FAILED"; exit 1; }
  got=$(printf '%s\n' "$out" | sed -n 's/^cost table: //p')
  case "$got" in "$tmp/$p/"*/share/tpflex/cost/h200.txt) ;;
    *) echo "install check: $p/bin/tpflex read its cost table from '$got', not from $tmp/$p"; exit 1 ;; esac
done

echo "install check: find_package (static, shared), the README's pkg-config lines (shared + rpath," \
  "static), $hello_msg, the out-of-tree loopback backend (and its build failing without" \
  "tpflex_backend_support.h) and the installed/moved tpflex's cost tables OK"
