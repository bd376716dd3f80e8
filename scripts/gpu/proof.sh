#!/usr/bin/env bash
# Proof on a real GPU (docs/verification.md): build RECIPE natively with imagegen for ARCH, verify the
# archs in the .so, run the recipe's GPU check against torch, then build the same source with a
# plain `pip wheel` and the same flags, and compare the times and peak memory.
#   scripts/gpu/proof.sh RECIPE SRC_DIR ARCH OUT_DIR [MAX_JOBS]
# MAX_JOBS is the build's whole job budget (default: imagegen sizes it from RAM and cores).
# Needs: python3 with torch (CUDA) and nvcc; jinja2, pyyaml, packaging (imagegen runs from this tree).
set -euo pipefail
recipe=$1 src=$2 arch=$3 out=$4 jobs=${5:-}
here=$(cd "$(dirname "$0")/../.." && pwd)
export PYTHONPATH=$here PYTHONUNBUFFERED=1
mkdir -p "$out"
py=python3
{
  echo "== host"; nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader || true
  $py -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
  nvcc --version | tail -2; nproc; free -g | head -2
} > "$out/host.txt" 2>&1

now() { date +%s.%N; }
work=$(mktemp -d)

# Peak used memory of the machine while a build runs (sampled every second), in GB.
sample_memory() {  # $1: file to write the peak into; runs until killed
  local peak=0 used
  while :; do
    used=$(awk '/MemTotal/{t=$2} /MemAvailable/{a=$2} END{print int((t-a)/1024)}' /proc/meminfo)
    (( used > peak )) && peak=$used && echo "$peak" > "$1"
    sleep 1
  done
}

# 1. imagegen, native
sample_memory "$out/imagegen_peak_mb" & sampler=$!
t0=$(now)
$py -m imagegen build "$recipe" --native --src-dir "$src" --arch "$arch" --out "$out/wheels" --flat \
    --work "$work/imagegen" ${jobs:+--max-jobs "$jobs"} > "$out/imagegen.log" 2>&1 || { kill $sampler; echo "imagegen build failed: $out/imagegen.log"; tail -30 "$out/imagegen.log"; exit 1; }
t1=$(now)
kill $sampler
echo "{\"imagegen_s\": $(echo "$t1 - $t0" | bc)}" > "$out/times.json"
wheel=$(ls "$out"/wheels/*.whl)

# 2. the same source (already patched by step 1 where the recipe has patches), plain pip wheel, and
#    exactly the variables imagegen's in-build script set (arch knob, force-build, MAX_JOBS split,
#    EXT_PARALLEL, NVCC_THREADS), read back from its log.
grep -o '^\[imagegen\] build env: .*' "$work/imagegen/logs/build.log" | head -1 | sed 's/^\[imagegen\] build env: //' > "$out/plain_env.json"
cp -r "$src" "$work/plain-src"
sample_memory "$out/plain_peak_mb" & sampler=$!
t1=$(now)
(cd "$work/plain-src" && env $($py -c 'import json,sys; print(" ".join(f"{k}={v}" for k, v in json.load(open(sys.argv[1])).items()))' "$out/plain_env.json") \
   $py -m pip wheel --no-build-isolation --no-deps -w "$work/plain-dist" . > "$out/plain.log" 2>&1)
t2=$(now)
kill $sampler

# 3. verify + GPU check with imagegen's wheel
$py -m imagegen verify "$wheel" --arch "$($py -c "
from imagegen.recipes import load_catalogue; from imagegen.arch import parse_arch_list; from imagegen.plan import expected_archs
from packaging.version import Version
r = load_catalogue().get('$recipe'); v = r.version(None)
print(expected_archs(v, parse_arch_list('$arch'), Version('13.0')))")" > "$out/verify.txt" 2>&1 || true
# The wheel unpacked onto PYTHONPATH: a venv made from a venv's python would not see its torch.
mkdir -p "$work/site" && $py -m zipfile -e "$wheel" "$work/site"
(cd "$work" && PYTHONPATH="$work/site:$here" $py "$here/scripts/gpu/check_recipe.py" "$recipe") > "$out/gpu_check.txt" 2>&1 || true

$py - "$t0" "$t1" "$t2" "$wheel" "$work/plain-dist" "$out" <<'PY'
import json, sys, os, glob
t0, t1, t2 = map(float, sys.argv[1:4])
wheel, plain, out = sys.argv[4], sys.argv[5], sys.argv[6]
pw = glob.glob(plain + "/*.whl")[0]
read = lambda name: open(os.path.join(out, name)).read().strip()
res = {"imagegen_s": round(t1 - t0, 1), "plain_pip_s": round(t2 - t1, 1),
       "overhead_ratio": round((t1 - t0) / (t2 - t1), 4),
       "imagegen_peak_gb": round(int(read("imagegen_peak_mb")) / 1024, 1),
       "plain_peak_gb": round(int(read("plain_peak_mb")) / 1024, 1),
       "plain_env": json.loads(read("plain_env.json")),
       "wheel": os.path.basename(wheel), "wheel_bytes": os.path.getsize(wheel),
       "plain_wheel": os.path.basename(pw), "plain_wheel_bytes": os.path.getsize(pw),
       "gpu_check": read("gpu_check.txt").splitlines()[-3:],
       "verify": read("verify.txt").splitlines()}
json.dump(res, open(out + "/result.json", "w"), indent=2)
print(json.dumps(res, indent=2))
PY
