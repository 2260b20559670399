#!/usr/bin/env bash
# Writes .snap/src.tar: the committed tree (git archive HEAD) plus .snap-commit naming it, for
# scripts/gpu.sh (its build step) on a GPU machine (carry ".snap" and ".deps"). Uncommitted
# edits are left out on purpose: a GPU round tests exactly one commit.
set -euo pipefail
cd "$(dirname "$0")/.."
mkdir -p .snap
rm -f .snap/src.tar
git archive HEAD -o .snap/src.tar
tmp=$(mktemp -d)
git rev-parse --short HEAD >"$tmp/.snap-commit"
tar -rf .snap/src.tar -C "$tmp" .snap-commit
rm -rf "$tmp"
echo "snapshot of $(git rev-parse --short HEAD) in .snap/src.tar ($(du -h .snap/src.tar | cut -f1))"
