#!/usr/bin/env bash
# The GPU proofs of docs/verification.md in one go, for a lent machine with a time limit: copies the
# sources first (so nothing else touches them mid-build), then runs proof.sh for each entry of PROOFS
# in turn, logging to RESULTS/run.log.
#   PROOFS="sageattention:plain-first sageattention:imagegen-first" \
#     scripts/gpu/proof_all.sh SAGE_SRC BSA_SRC RESULTS
# PROOFS entries are RECIPE:ORDER (ORDER as in proof.sh: imagegen-first or plain-first); the default is
# Block-Sparse-Attention imagegen first, then SageAttention plain pip first (the other half of an ABBA
# timing). Results go to RESULTS/<n>-<recipe>-<order>/ (result.json, logs). MAX_JOBS, when set, is
# passed to every proof.sh as its job budget.
set -uo pipefail
sage=$1 bsa=$2 results=$3
here=$(cd "$(dirname "$0")/../.." && pwd)
proofs=${PROOFS:-block-sparse-attn:imagegen-first sageattention:plain-first}
mkdir -p "$results"
src=$(mktemp -d)
cp -r "$sage" "$src/sageattention" && cp -r "$bsa" "$src/block-sparse-attn"
{
  echo "start $(date -u +%FT%TZ) proofs: $proofs"
  n=0
  for proof in $proofs; do
    n=$((n + 1))
    recipe=${proof%%:*} order=${proof#*:}
    case $recipe in sageattention|block-sparse-attn) ;; *) echo "unknown recipe in PROOFS: $recipe"; continue ;; esac
    case $order in imagegen-first|plain-first) ;; *) echo "unknown order in PROOFS: $order"; continue ;; esac
    ORDER=$order bash "$here/scripts/gpu/proof.sh" "$recipe" "$src/$recipe" 9.0 "$results/$n-$recipe-$order" ${MAX_JOBS:-}
    echo "$n $recipe $order exit $? at $(date -u +%FT%TZ)"
  done
  echo "all done $(date -u +%FT%TZ)"
} > "$results/run.log" 2>&1
