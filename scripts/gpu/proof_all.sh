#!/usr/bin/env bash
# The GPU proofs of docs/verification.md in one go, for a lent machine with a time limit: copies the
# sources first (so nothing else touches them mid-build), then runs proof.sh for Block-Sparse-Attention
# (imagegen first) and SageAttention (plain pip first: the other half of an ABBA timing), logging to
# RESULTS/run.log.
#   scripts/gpu/proof_all.sh SAGE_SRC BSA_SRC RESULTS
set -uo pipefail
sage=$1 bsa=$2 results=$3
here=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$results"
src=$(mktemp -d)
cp -r "$sage" "$src/sage" && cp -r "$bsa" "$src/bsa"
{
  echo "start $(date -u +%FT%TZ)"
  ORDER=imagegen-first bash "$here/scripts/gpu/proof.sh" block-sparse-attn "$src/bsa" 9.0 "$results/bsa"; echo "bsa exit $?"
  echo "bsa done $(date -u +%FT%TZ)"
  ORDER=plain-first bash "$here/scripts/gpu/proof.sh" sageattention "$src/sage" 9.0 "$results/sage"; echo "sage exit $?"
  echo "all done $(date -u +%FT%TZ)"
} > "$results/run.log" 2>&1
