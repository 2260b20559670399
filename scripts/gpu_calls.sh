#!/usr/bin/env bash
# One device call of a session: scripts/gpu.sh --call (its header lists the calls and the steps
# each runs). Every call builds the committed snapshot when the machine is fresh (carry ".snap"
# and ".deps"; scripts/gpu_snapshot.sh writes .snap), runs its steps within BOUND_S, then packs
# every log into $OUT/<call>.tgz with the summaries in $OUT/<call>-summary.txt.
#
#   usage: OUT=$OUT bash scripts/gpu_calls.sh check|fp8|host|thd [BOUND_S]
exec bash "$(dirname "$0")/gpu.sh" --call "$@"
