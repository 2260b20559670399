#!/usr/bin/env bash
# The shared library exports the public API and nothing else: every exported function is one the
# public headers mark TPF_API, and every TPF_API name is exported. Usage: check_symbols.sh LIB INCDIR
set -euo pipefail
lib=$1 inc=$2
exported=$(nm -D --defined-only "$lib" | awk '$2 ~ /^[TW]$/ {print $3}' | sort -u)
declared=$(cat "$inc"/tpflex/*.h | tr '\n' ' ' | grep -oE 'TPF_API [^;(]*\(' | grep -oE 'tpf_[a-z0-9_]+ *\($' |
  tr -d ' (' | sort -u)
# Backends built in decide which declared names exist (tpf_cuda_* only with CUDA, tpf_sim_* only
# with the simulator).
have_cuda=0; echo "$exported" | grep -q '^tpf_cuda_backend_create$' && have_cuda=1
have_sim=0; echo "$exported" | grep -q '^tpf_sim_world_create$' && have_sim=1
bad=0
extra=$(comm -23 <(echo "$exported") <(echo "$declared") | grep -vE '^(_init|_fini)$' || true)
if [ -n "$extra" ]; then
  echo "exported but not public (TPF_API):"; echo "$extra" | head -40; bad=1
fi
missing=$(comm -13 <(echo "$exported") <(echo "$declared") || true)
[ "$have_cuda" = 1 ] || missing=$(echo "$missing" | grep -v '^tpf_cuda_' || true)
[ "$have_sim" = 1 ] || missing=$(echo "$missing" | grep -v '^tpf_sim_' || true)
if [ -n "$missing" ]; then
  echo "public (TPF_API) but not exported:"; echo "$missing"; bad=1
fi
echo "symbols: $(echo "$exported" | wc -l) exported, $(echo "$declared" | wc -l) declared TPF_API (cuda=$have_cuda sim=$have_sim)"
[ "$bad" = 0 ] && echo "symbol check: OK" || { echo "symbol check: FAILED"; exit 1; }
