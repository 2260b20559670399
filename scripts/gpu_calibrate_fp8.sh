#!/usr/bin/env bash
# FP8 GEMM points for the planner's cost table on one GPU (issue 28 item 5): builds the committed
# snapshot with CUDA (scripts/gpu_round.sh's build step, as scripts/gpu_fp8.sh does), then
#   calibrate   `tpflex calibrate --backend cuda --out $OUT/h200_measured.txt` (--fp8 on, the
#               default): the bf16 GEMM points, then the same grid as E4M3 x E4M3 -> bf16 GEMMs
#               through the public API (a P = 1 BULK communicator, tpf_bulk_overlap_ex with
#               tpf_op_options a_scale_inv / w_scale_inv, fp8 operands of valid E4M3 values),
#               written as `gemm fp8_e4m3 m n k us`; links, launch and handshake as before
#   speedup     fp8_e4m3 / bf16 per GEMM shape from that table (fp8_speedup.txt): for scale, issue
#               28 quotes 1.45 / 1.66 / 1.66 / 1.94x at K 8192, N 3584, T = 1k / 4k / 16k / 32k,
#               which are the AG rows m x 3584 x 8192 here
#   table       h200_new.txt: data/cost/h200.txt with its gemm lines replaced by the measured bf16
#               and fp8_e4m3 ones (every other line as shipped; its header comment still says the
#               fp8 points are missing: the session that records this run rewrites it, naming the
#               date, the machine and this directory)
#   predict     `tpflex plan --predict` RING AG fp8_e4m3 (issue 28's command) and the RS site of an
#               fp8 GEMM on h200_new.txt: no "priced on its bf16 points" note must remain
# Everything under $OUT: <step>.log, summary.txt. About 1-2 minutes after the build.
#
#   usage: OUT=/path/to/out bash scripts/gpu_calibrate_fp8.sh
set -u -o pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-$ROOT/gpu-logs/calibrate-fp8}
SRC=${SRC:-/tmp/tpf-src}
BUILD=$SRC/build-gpu
mkdir -p "$OUT"
S=$OUT/summary.txt
. "$ROOT/scripts/gpu_steps.sh" # note, step

if [ ! -x "$BUILD/tpflex" ]; then
  OUT=$OUT/round SRC=$SRC bash "$ROOT/scripts/gpu_round.sh" build || { note "build failed: $OUT/round"; exit 1; }
fi
export PATH=/usr/local/cuda/bin:$PATH
export LD_LIBRARY_PATH=$SRC/.deps/root/usr/lib/x86_64-linux-gnu:${LD_LIBRARY_PATH:-}
note "snapshot: $(cat "$SRC/.snap-commit" 2>/dev/null || echo '?')"
note "gpu: $(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader 2>/dev/null | head -1)"
TPF=$BUILD/tpflex
MEAS=$OUT/h200_measured.txt
NEW=$OUT/h200_new.txt
SHIPPED=$SRC/data/cost/h200.txt

step calibrate 240 "$TPF calibrate --backend cuda --out $MEAS"
grep -E "^  " "$OUT/calibrate.log" | tee -a "$S"
n8=$(grep -c '^gemm fp8_e4m3 ' "$MEAS" 2>/dev/null)
nb=$(grep -c '^gemm bf16 ' "$MEAS" 2>/dev/null)
n8=${n8:-0} nb=${nb:-0}
note "measured gemm points: $nb bf16, $n8 fp8_e4m3"
if [ "$n8" = 0 ] || [ "$nb" = 0 ]; then
  note "FAILED: the measured table lacks bf16 or fp8_e4m3 gemm points ($OUT/calibrate.log)"
  exit 1
fi

# fp8 / bf16 speedup per shape (m n k), in the order of the table.
awk '$1 == "gemm" && $2 == "bf16" { b[$3" "$4" "$5] = $6; order[++n] = $3" "$4" "$5 }
     $1 == "gemm" && $2 == "fp8_e4m3" { f[$3" "$4" "$5] = $6 }
     END { print "m n k | bf16 us | fp8_e4m3 us | speedup";
           for (i = 1; i <= n; i++) { k = order[i]; if (k in f)
             printf "%s | %.2f | %.2f | %.2f\n", k, b[k], f[k], b[k] / f[k] } }' "$MEAS" \
  >"$OUT/fp8_speedup.txt"
note "fp8_e4m3 / bf16 at N 3584, K 8192 (issue 28's shape), T = 1k / 4k / 16k / 32k:"
grep -E "^(1024|4096|16384|32768) 3584 8192 " "$OUT/fp8_speedup.txt" | tee -a "$S"

# The shipped table with the measured gemm lines in place of its own.
{ grep -v '^gemm ' "$SHIPPED"; grep -E '^gemm (bf16|fp8_e4m3) ' "$MEAS"; } >"$NEW"

P8="--tp 8 --capacity 32768 --hidden 8192 --tokens 4096 --predict --cost $NEW"
step predict-ag 20 "$TPF plan --algo ring --coll ag --dtype fp8_e4m3 $P8"
step predict-rs 20 "$TPF plan --algo ring --coll rs --dtype fp8_e4m3 $P8"
for s in predict-ag predict-rs; do
  grep -E "^(choice|note)" "$OUT/$s.log" | sed "s/^/$s: /" | tee -a "$S"
  if grep -q "priced on its bf16 points" "$OUT/$s.log"; then
    note "FAILED: $s still prices fp8 GEMMs on bf16 points"
  fi
done
note "done: replace data/cost/h200.txt's gemm lines with those of $NEW (and rewrite its header)"
