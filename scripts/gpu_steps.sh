# Sourced by the GPU scripts (gpu_round.sh, gpu_fp8.sh, gpu_calibrate_fp8.sh): note and step, with
# the caller's S (summary file), OUT (log folder) and SRC (the snapshot, where steps run).
#   note TEXT...              prints TEXT and appends it to $S
#   step NAME TIMEOUT CMD...  runs CMD in $SRC under timeout, its output in $OUT/NAME.log; notes
#                             its status and seconds; returns its status
note() { echo "$*" | tee -a "$S"; }
step() {
  local name=$1 to=$2; shift 2
  local t0=$(date +%s)
  (cd "$SRC" && timeout "$to" bash -c "$*") >"$OUT/$name.log" 2>&1
  local rc=$?
  note "step $name: rc=$rc in $(( $(date +%s) - t0 )) s: $*"
  return $rc
}
