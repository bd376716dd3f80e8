#!/usr/bin/env bash
# The GPU proofs of docs/records/verification.md in one go, for a lent machine with a time limit: copies the
# sources first (so nothing else touches them mid-build), then runs proof.sh for each entry of PROOFS
# in turn, logging to RESULTS/run.log.
#   PROOFS="sageattention:plain-first sageattention:imagegen-first" \
#     scripts/gpu/proof_all.sh SAGE_SRC BSA_SRC RESULTS
# PROOFS entries are RECIPE:ORDER[:MODE] (ORDER and MODE as in proof.sh: imagegen-first or plain-first;
# sequential, the default, or concurrent); the default is
# Block-Sparse-Attention imagegen first, then SageAttention plain pip first (the other half of an ABBA
# timing), after a warm-up read of the toolchain. Results go to RESULTS/<n>-<recipe>-<order>/ (result.json, logs). MAX_JOBS, when set, is
# passed to every proof.sh as its job budget.
set -uo pipefail
sage=$1 bsa=$2 results=$3
here=$(cd "$(dirname "$0")/../.." && pwd)
proofs=${PROOFS:-block-sparse-attn:imagegen-first sageattention:plain-first}
mkdir -p "$results"
src=$(mktemp -d)
cp -r "$sage" "$src/sageattention" && cp -r "$bsa" "$src/block-sparse-attn"
# The first build after boot paid 20-30 s more than the second, whichever tool ran it (cold page
# cache for nvcc, cicc, ptxas and the CUDA/torch headers): read them all once before timing anything.
warm_up() {
  local cuda torch_dir
  cuda=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  torch_dir=$(python3 -c 'import os, torch; print(os.path.dirname(torch.__file__))')
  # Without nvcc or torch the paths below would be "/": read nothing rather than the whole disk.
  if ! command -v nvcc > /dev/null || [ "$cuda" = / ] || [ -z "$torch_dir" ]; then echo "warm-up skipped: no nvcc or no torch"; return; fi
  find "$cuda/" "$torch_dir/" "$src/" -type f -print0 | xargs -0 cat > /dev/null 2>&1
  echo "warm-up: read $(du -sh "$cuda/" "$torch_dir/" "$src/" | awk '{print $1}' | paste -sd+) in ${SECONDS} s"
}
{
  echo "start $(date -u +%FT%TZ) proofs: $proofs"
  warm_up
  n=0
  for proof in $proofs; do
    n=$((n + 1))
    IFS=: read -r recipe order mode <<< "$proof"
    mode=${mode:-sequential}
    case $recipe in sageattention|block-sparse-attn) ;; *) echo "unknown recipe in PROOFS: $recipe"; continue ;; esac
    case $order in imagegen-first|plain-first) ;; *) echo "unknown order in PROOFS: $order"; continue ;; esac
    case $mode in sequential|concurrent) ;; *) echo "unknown mode in PROOFS: $mode"; continue ;; esac
    ORDER=$order MODE=$mode bash "$here/scripts/gpu/proof.sh" "$recipe" "$src/$recipe" 9.0 "$results/$n-$recipe-$order-$mode" ${MAX_JOBS:-}
    echo "$n $recipe $order $mode exit $? at $(date -u +%FT%TZ)"
  done
  echo "all done $(date -u +%FT%TZ)"
} > "$results/run.log" 2>&1
