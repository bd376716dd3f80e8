#!/usr/bin/env bash
# Proof on a real GPU (docs/verification.md): build RECIPE natively with imagegen for ARCH, verify the
# archs in the .so, run the recipe's GPU check against torch, then build the same source with a
# plain `pip wheel` and the same flags, and compare the times.
#   scripts/gpu/proof.sh RECIPE SRC_DIR ARCH OUT_DIR [MAX_JOBS]
# Needs: python3 with torch (CUDA) and nvcc; jinja2, pyyaml, packaging (imagegen runs from this tree).
set -euo pipefail
recipe=$1 src=$2 arch=$3 out=$4 jobs=${5:-16}
here=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$here PYTHONUNBUFFERED=1
mkdir -p "$out"
py=python3
{
  echo "== host"; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
  $py -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -2; nproc; free -g | head -2
} > "$out/host.txt" 2>&1

now() { date +%s.%N; }
work=$(mktemp -d)

# 1. imagegen, native
t0=$(now)
$py -m imagegen build "$recipe" --native --src-dir "$src" --arch "$arch" --out "$out/wheels" --flat \
    --work "$work/imagegen" --max-jobs "$jobs" > "$out/imagegen.log" 2>&1
t1=$(now)
wheel=$(ls "$out"/wheels/*.whl)

# 2. the same source, plain pip wheel, same flags (the recipe's env: EXT_PARALLEL=1 for sage)
cp -r "$src" "$work/plain-src"
(cd "$work/plain-src" && TORCH_CUDA_ARCH_LIST="$arch" MAX_JOBS="$jobs" EXT_PARALLEL=1 NVCC_THREADS=4 \
   $py -m pip wheel --no-build-isolation --no-deps -w "$work/plain-dist" . > "$out/plain.log" 2>&1)
t2=$(now)

echo "{\"imagegen_s\": $(echo "$t1 - $t0" | bc), \"plain_pip_s\": $(echo "$t2 - $t1" | bc)}" > "$out/times.json"

# 3. verify + GPU check with imagegen's wheel
$py -m imagegen verify "$wheel" --arch "$(python3 -c "
from imagegen.recipes import load_catalogue; from imagegen.arch import parse_arch_list; from imagegen.plan import expected_archs
from packaging.version import Version
r = load_catalogue().get('$recipe'); v = r.version(None)
print(expected_archs(v, parse_arch_list('$arch'), Version('13.0')))")" > "$out/verify.txt" 2>&1
cuobjdump --list-elf --list-ptx "$work/plain-dist"/*.whl > /dev/null 2>&1 || true
# The wheel unpacked onto PYTHONPATH: a venv made from a venv's python would not see its torch.
mkdir -p "$work/site" && $py -m zipfile -e "$wheel" "$work/site"
(cd "$work" && PYTHONPATH="$work/site:$here" $py "$here/scripts/gpu/check_recipe.py" "$recipe") > "$out/gpu_check.txt" 2>&1 || true

python3 - "$t0" "$t1" "$t2" "$wheel" "$work/plain-dist" "$out" <<'PY'
import json, sys, os, glob
t0, t1, t2 = map(float, sys.argv[1:4])
wheel, plain, out = sys.argv[4], sys.argv[5], sys.argv[6]
pw = glob.glob(plain + "/*.whl")[0]
res = {"imagegen_s": round(t1 - t0, 1), "plain_pip_s": round(t2 - t1, 1),
       "overhead_ratio": round((t1 - t0) / (t2 - t1), 4),
       "wheel": os.path.basename(wheel), "wheel_bytes": os.path.getsize(wheel),
       "plain_wheel": os.path.basename(pw), "plain_wheel_bytes": os.path.getsize(pw),
       "gpu_check": open(out + "/gpu_check.txt").read().strip().splitlines()[-3:],
       "verify": open(out + "/verify.txt").read().strip().splitlines()}
json.dump(res, open(out + "/result.json", "w"), indent=2)
print(json.dumps(res, indent=2))
PY
