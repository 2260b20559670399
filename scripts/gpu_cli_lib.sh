# Shared by the GPU scripts that run the tpflex CLI (scripts/gpu_planner.sh, scripts/gpu_modes.sh):
# the summary file and note(), the environment record, the CLI build, and the bounded, logged
# step. Source it after setting ROOT, BUILD and OUT (created); it starts $OUT/summary.txt empty.

SUMMARY=$OUT/summary.txt
: >"$SUMMARY"
note() { echo "$*" | tee -a "$SUMMARY"; }

# Writes $OUT/env.txt (GPU, compute mode and MPS, nvcc, date, commit), notes the GPU, and brings
# the tpflex_cli target of $BUILD up to date (exits 1 if that fails).
gpu_cli_preamble() {
  {
    nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
    nvidia-smi -q 2>/dev/null | grep -i -E 'compute mode|mps' | head -4
    nvcc --version | tail -2
    date -u
    echo "commit $(git -C "$ROOT" rev-parse HEAD 2>/dev/null), $(git -C "$ROOT" status --short 2>/dev/null | wc -l) changed files"
  } >"$OUT/env.txt" 2>&1
  note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
  if ! cmake --build "$BUILD" -j "$(nproc)" --target tpflex_cli >"$OUT/build.log" 2>&1; then
    note "build of tpflex_cli in $BUILD FAILED (build.log)"; tail -30 "$OUT/build.log"; exit 1
  fi
}

# gpu_step WIDTH NAME LIMIT CMD...: stdout to $OUT/NAME.txt and stderr to $OUT/NAME.err, both
# also shown; killed after LIMIT seconds; one line "NAME rc=.. .. s" (NAME padded to WIDTH) noted.
gpu_step() {
  local width=$1 name=$2 limit=$3; shift 3
  local s0; s0=$(date +%s)
  timeout --signal=KILL "$limit" "$@" 2> >(tee "$OUT/$name.err" >&2) | tee "$OUT/$name.txt"
  local rc=${PIPESTATUS[0]}
  note "$(printf "%-${width}s rc=%-3s %4s s" "$name" "$rc" "$(( $(date +%s) - s0 ))")"
  return "$rc"
}
