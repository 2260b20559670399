#!/usr/bin/env bash
# CI tiers that .ci/run calls, one per subcommand. Each configures its own build folder, builds,
# runs, prints a header and ctest's summary line, and exits non-zero on any failure.
#
#   bash .ci/tiers.sh asan                # clang ASan+UBSan build (build-asan), the non-GPU C tests
#   bash .ci/tiers.sh ubsan               # gcc UBSan build (build-ubsan), -Werror, every non-GPU test
#   bash .ci/tiers.sh tsan                # TSan build (build-tsan), the non-GPU C tests (simulator)
#   bash .ci/tiers.sh coverage            # gcc --coverage build (build-cov), tests + gcovr + gate
#   bash .ci/tiers.sh fuzz-smoke [SECS]   # libFuzzer build (build-fuzz), SECS (<= 60) per target
#   bash .ci/tiers.sh afl                 # AFL++ build check (build-afl); skipped without afl++
#   bash .ci/tiers.sh all [SECS]          # all of the above, in that order
# (every tier: the quick variants of the tests labelled full; none labelled torchrun or selftest)
#
# Environment: JOBS (default 2) for build and ctest parallelism; CMAKE_FLAGS appended to every
# configure. Output is captured 2>&1 (CMocka prints its closing line on stderr).
set -u
cd "$(dirname "$0")/.."
JOBS=${JOBS:-2}
CMAKE_FLAGS=${CMAKE_FLAGS:-}

header() {
  echo
  echo "================================================================================"
  echo "== tier $1: $2"
  echo "================================================================================"
}

# ctest over BUILD_DIR with extra args; prints everything and returns ctest's status.
run_ctest() {
  local dir=$1
  shift
  (cd "$dir" && ctest --output-on-failure -j "$JOBS" "$@" 2>&1)
}

# Prints the tier's result line and returns its status.
finish() {
  local tier=$1 rc=$2 start=$3 log=${4:-}
  local summary=""
  if [ -n "$log" ] && [ -f "$log" ]; then
    summary=$(grep -E 'tests passed|tests failed' "$log" | tail -1)
  fi
  local t=$(($(date +%s) - start))
  if [ "$rc" -eq 0 ]; then
    echo "== tier $tier: PASS in ${t}s${summary:+ ($summary)}"
  else
    echo "== tier $tier: FAIL (status $rc) in ${t}s${summary:+ ($summary)}"
  fi
  return "$rc"
}

# configure DIR CMAKE_ARGS...: logs to DIR/configure.log, prints it on failure.
configure() {
  local dir=$1
  shift
  mkdir -p "$dir"
  # shellcheck disable=SC2086
  if ! cmake -S . -B "$dir" -DTPF_WITH_CUDA=OFF "$@" $CMAKE_FLAGS >"$dir/configure.log" 2>&1; then
    tail -30 "$dir/configure.log"
    echo "configure of $dir failed (log: $dir/configure.log)"
    return 1
  fi
  grep -E '^-- tpflex:' "$dir/configure.log"
  return 0
}

# build DIR [TARGET...]: logs to DIR/build.log; prints warnings and errors, the tail on failure.
build() {
  local dir=$1 rc
  shift
  local args=()
  for t in "$@"; do args+=(--target "$t"); done
  cmake --build "$dir" -j "$JOBS" "${args[@]}" >"$dir/build.log" 2>&1
  rc=$?
  grep -E 'warning:|error:' "$dir/build.log" | head -40
  if [ $rc -ne 0 ]; then
    tail -30 "$dir/build.log"
    echo "build of $dir failed (log: $dir/build.log)"
  fi
  return $rc
}

configure_build() { # DIR CMAKE_ARGS...
  configure "$@" && build "$1"
}

# The Python tests (label python) load libtpflex.so into python3, which a sanitizer runtime must
# come first in: they run in the plain and coverage builds, not under ASan/TSan.
# Every tier leaves out the labels full (conformance_sim's 16P sweep, cli_options' whole table:
# their quick variants conformance_sim_quick and cli_options_quick run instead), torchrun (the
# Python tests under torchrun, whose C the C tests reach) and selftest (conformance_sim_quick's
# operations again, its judge tested); make test-sim runs them all.
tier_asan() {
  local start=$(date +%s) log=build-asan/ctest.log rc
  header asan "clang, -fsanitize=address,undefined, every C test without a GPU (-LE gpu|python|full|selftest)"
  CC=clang configure_build build-asan -DTPF_SANITIZE=address,undefined \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo || { finish asan 1 "$start"; return 1; }
  ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=1:strict_string_checks=1} \
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    run_ctest build-asan -LE "gpu|python|full|selftest" | tee "$log"
  rc=${PIPESTATUS[0]}
  finish asan "$rc" "$start" "$log"
}

# gcc (the default compiler, with the default -Werror) and -fsanitize=undefined with
# -fno-sanitize-recover=all (CMakeLists.txt's TPF_SANITIZE): the configuration the README names,
# which the clang ASan+UBSan tier did not build (gcc 12 warned -Wsign-conversion in core/dtype.c
# under the instrumentation). Every test without a GPU, the Python ones included (but torchrun's):
# libubsan, unlike ASan's runtime, need not be loaded first.
tier_ubsan() {
  local start=$(date +%s) log=build-ubsan/ctest.log rc
  header ubsan "gcc, -fsanitize=undefined -fno-sanitize-recover=all, -Werror, every test without a GPU (-LE gpu|full|torchrun|selftest)"
  CC=${UBSAN_CC:-gcc} configure_build build-ubsan -DTPF_SANITIZE=undefined \
    -DCMAKE_BUILD_TYPE=RelWithDebInfo || { finish ubsan 1 "$start"; return 1; }
  UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1} \
    run_ctest build-ubsan -LE "gpu|full|torchrun|selftest" | tee "$log"
  rc=${PIPESTATUS[0]}
  finish ubsan "$rc" "$start" "$log"
}

tier_tsan() {
  local start=$(date +%s) log=build-tsan/ctest.log rc
  header tsan "clang, -fsanitize=thread, every C test without a GPU (-LE gpu|python|full|selftest; the simulator runs threads)"
  CC=clang configure_build build-tsan -DTPF_SANITIZE=thread -DCMAKE_BUILD_TYPE=RelWithDebInfo ||
    { finish tsan 1 "$start"; return 1; }
  TSAN_OPTIONS=${TSAN_OPTIONS:-halt_on_error=1:second_deadlock_stack=1} \
    run_ctest build-tsan -LE "gpu|python|full|selftest" | tee "$log"
  rc=${PIPESTATUS[0]}
  finish tsan "$rc" "$start" "$log"
}

tier_coverage() {
  local start=$(date +%s) log=build-cov/coverage.log rc
  header coverage "gcc --coverage; gcovr for core/ and backend_sim/; gate core/ >= 95% lines, >= 90% branches"
  CC=gcc configure_build build-cov -DTPF_COVERAGE=ON -DCMAKE_BUILD_TYPE=Debug ||
    { finish coverage 1 "$start"; return 1; }
  cmake --build build-cov --target coverage 2>&1 | tee "$log"
  rc=${PIPESTATUS[0]}
  echo "   HTML report: build-cov/coverage/index.html"
  finish coverage "$rc" "$start" "$log"
}

tier_fuzz_smoke() {
  local secs=${1:-60} start=$(date +%s) rc
  [ "$secs" -gt 60 ] && secs=60
  header fuzz-smoke "libFuzzer (clang, address+undefined), ${secs}s per target"
  CC=clang configure build-fuzz -DTPF_FUZZ=ON || { finish fuzz-smoke 1 "$start"; return 1; }
  # shellcheck disable=SC2046
  build build-fuzz $(sed 's/^/fuzz_/' build-fuzz/fuzz/targets.txt) ||
    { finish fuzz-smoke 1 "$start"; return 1; }
  bash fuzz/run.sh build-fuzz "$secs" 2>&1
  rc=$?
  finish fuzz-smoke "$rc" "$start"
}

tier_afl() {
  local start=$(date +%s) rc=0
  header afl "AFL++ build of the same harnesses (afl-clang-fast), corpus replay, 10 s of afl-fuzz"
  if ! command -v afl-clang-fast >/dev/null 2>&1; then
    echo "afl-clang-fast not installed (apt-get install -y afl++): skipped"
    finish afl 0 "$start"
    return 0
  fi
  CC=afl-clang-fast configure build-afl -DTPF_FUZZ=ON || { finish afl 1 "$start"; return 1; }
  # shellcheck disable=SC2046
  AFL_QUIET=1 build build-afl $(sed 's/^/fuzz_/' build-afl/fuzz/targets.txt) ||
    { finish afl 1 "$start"; return 1; }
  for t in $(cat build-afl/fuzz/targets.txt); do
    exe=build-afl/fuzz/fuzz_$t
    [ -x "$exe" ] || { echo "afl: $exe not built"; rc=1; continue; }
    # AFL's driver runs the files it is given once each: the committed corpus must pass.
    for f in fuzz/corpus/"$t"/*; do
      "$exe" "$f" >/dev/null 2>&1 || { echo "afl: $t fails on $f"; rc=1; }
    done
    out=build-afl/afl-out-$t
    rm -rf "$out"
    AFL_SKIP_CPUFREQ=1 AFL_NO_UI=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 \
      timeout 30 afl-fuzz -V 10 -i fuzz/corpus/"$t" -o "$out" -- "$exe" >/dev/null 2>&1
    if [ -f "$out/default/fuzzer_stats" ]; then
      execs=$(sed -n 's/^execs_done *: *//p' "$out/default/fuzzer_stats")
      crashes=$(sed -n 's/^saved_crashes *: *//p' "$out/default/fuzzer_stats")
      echo "afl: $t: ${execs:-?} execs in 10 s, ${crashes:-?} crashes"
      [ "${crashes:-0}" = 0 ] || rc=1
    else
      echo "afl: $t: afl-fuzz produced no stats (see $out)"
      rc=1
    fi
  done
  finish afl "$rc" "$start"
}

cmd=${1:-}
shift || true
case "$cmd" in
asan) tier_asan ;;
ubsan) tier_ubsan ;;
tsan) tier_tsan ;;
coverage) tier_coverage ;;
fuzz-smoke) tier_fuzz_smoke "${1:-60}" ;;
afl) tier_afl ;;
all)
  status=0
  tier_asan || status=1
  tier_ubsan || status=1
  tier_tsan || status=1
  tier_coverage || status=1
  tier_fuzz_smoke "${1:-60}" || status=1
  tier_afl || status=1
  exit $status
  ;;
*)
  sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//'
  exit 2
  ;;
esac
