#!/usr/bin/env bash
# The CUDA backend's rooms call each other without a cycle: for every object file of
# backend_cuda/ (one per .c/.cu file), list the symbols it uses that another file of backend_cuda/
# defines (functions called or taken as pointers, tables read), and fail if those file-to-file
# edges contain a cycle. Works on the compiled objects (nm), so calls hidden behind macros count
# and static inline helpers of the headers do not.
# Usage: check_cuda_rooms.sh OBJECT...   (arguments may also be ';'-separated lists, as CTest
# passes $<TARGET_OBJECTS:tpf_backend_cuda>)
set -euo pipefail
NM=${NM:-nm}
objs=()
for a in "$@"; do
  IFS=';' read -r -a parts <<<"$a"
  for p in "${parts[@]}"; do [ -n "$p" ] && objs+=("$p"); done
done
[ "${#objs[@]}" -gt 0 ] || { echo "usage: $0 OBJECT..." >&2; exit 2; }

name_of() { local b; b=$(basename "$1"); echo "${b%.o}"; } # cuda_exec.c.o -> cuda_exec.c
declare -A owner
for o in "${objs[@]}"; do
  f=$(name_of "$o")
  while read -r _ _ sym; do owner[$sym]=$f; done < <("$NM" --defined-only -g "$o" | awk 'NF == 3')
done

edges=$(mktemp)
trap 'rm -f "$edges"' EXIT
for o in "${objs[@]}"; do
  f=$(name_of "$o")
  "$NM" -u "$o" | awk '{print $NF}' | sort -u | while read -r sym; do
    g=${owner[$sym]:-}
    if [ -n "$g" ] && [ "$g" != "$f" ]; then echo "$f $g $sym"; fi
  done
done | sort >"$edges"

echo "calls between the files of backend_cuda/ (caller -> callee: symbols):"
for o in "${objs[@]}"; do
  f=$(name_of "$o")
  callees=$(awk -v f="$f" '$1 == f {print $2}' "$edges" | sort -u)
  if [ -z "$callees" ]; then echo "  $f -> (none)"; continue; fi
  for g in $callees; do
    syms=$(awk -v f="$f" -v g="$g" '$1 == f && $2 == g {printf "%s%s", sep, $3; sep = ", "}' "$edges")
    echo "  $f -> $g: $syms"
  done
done
# tsort fails (and names the loop) when the edges are not a partial order.
if ! out=$(awk '{print $1, $2} END {print "_", "_"}' "$edges" | sort -u | tsort 2>&1 >/dev/null); then
  echo "rooms: CYCLE"; echo "$out"; exit 1
fi
if [ -n "$out" ]; then echo "rooms: CYCLE"; echo "$out"; exit 1; fi
echo "rooms: acyclic (${#objs[@]} files, $(awk '{print $1, $2}' "$edges" | sort -u | wc -l) file edges)"
