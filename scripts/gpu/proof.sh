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

# The variables imagegen's in-build script will set (arch knob, force-build, MAX_JOBS split,
# EXT_PARALLEL, NVCC_THREADS): the plain pip build gets exactly these.
$py -m imagegen build "$recipe" --native --src-dir "$src" --arch "$arch" --work "$work/env" \
    ${jobs:+--max-jobs "$jobs"} --print-env > "$out/plain_env.json"

run_imagegen() {
  sample_memory "$out/imagegen_peak_mb" & local sampler=$!
  local t0; t0=$(now)
  $py -m imagegen build "$recipe" --native --src-dir "$src" --arch "$arch" --out "$out/wheels" --flat \
      --work "$work/imagegen" ${jobs:+--max-jobs "$jobs"} > "$out/imagegen.log" 2>&1 \
      || { kill $sampler; echo "imagegen build failed: $out/imagegen.log"; tail -30 "$out/imagegen.log"; exit 1; }
  echo "$t0 $(now)" > "$out/imagegen_times"
  kill $sampler
}

run_plain() {
  # The same source (with the recipe's patches, applied below before either build), plain pip
  # wheel, the same variables.
  rm -rf "$work/plain-src" && cp -r "$src" "$work/plain-src"
  sample_memory "$out/plain_peak_mb" & local sampler=$!
  local t0; t0=$(now)
  (cd "$work/plain-src" && $py -c 'import json, os, sys
os.execvpe(sys.argv[2], sys.argv[2:], dict(os.environ, **json.load(open(sys.argv[1]))))' "$out/plain_env.json" \
     $py -m pip wheel --no-build-isolation --no-deps -w "$work/plain-dist" . > "$out/plain.log" 2>&1)
  echo "$t0 $(now)" > "$out/plain_times"
  kill $sampler
}

# Patches first (imagegen's own fetch step, idempotent), so both builds compile the same tree.
$py - "$recipe" "$src" <<'PY'
import json, subprocess, sys, tempfile, os
from imagegen.recipes import load_catalogue
from imagegen.render import builder_script
r = load_catalogue().get(sys.argv[1]); v = r.version(None)
with tempfile.TemporaryDirectory() as tmp:
    script = os.path.join(tmp, "b.py"); open(script, "w").write(builder_script())
    sys.path.insert(0, tmp); import b
    for p in v.patches:
        b.apply_patch({"name": p.name, "reason": p.reason, "text": p.text}, sys.argv[2])
PY

# ORDER=plain-first puts the cold page cache on the plain build instead (run both orders: ABBA).
if [ "${ORDER:-imagegen-first}" = plain-first ]; then run_plain; run_imagegen; else run_imagegen; run_plain; fi
wheel=$(ls "$out"/wheels/*.whl)

# 3. verify + GPU check with imagegen's wheel (verify timed on its own: it is part of imagegen's own steps)
t_verify=$(now)
$py -m imagegen verify "$wheel" --arch "$($py -c "
from imagegen.recipes import load_catalogue; from imagegen.arch import parse_arch_list; from imagegen.plan import expected_archs
from packaging.version import Version
r = load_catalogue().get('$recipe'); v = r.version(None)
print(expected_archs(v, parse_arch_list('$arch'), Version('13.0')))")" > "$out/verify.txt" 2>&1 || true
echo "$t_verify $(now)" > "$out/verify_times"
t_torch=$(now); $py -c "import torch" && echo "$t_torch $(now)" > "$out/import_torch_times"
# The wheel unpacked onto PYTHONPATH: a venv made from a venv's python would not see its torch.
mkdir -p "$work/site" && $py -m zipfile -e "$wheel" "$work/site"
(cd "$work" && PYTHONPATH="$work/site:$here" $py "$here/scripts/gpu/check_recipe.py" "$recipe") > "$out/gpu_check.txt" 2>&1 || true

$py - "$wheel" "$work/plain-dist" "$out" "${ORDER:-imagegen-first}" <<'PY'
import json, sys, os, glob
wheel, plain, out, order = sys.argv[1:5]
pw = glob.glob(plain + "/*.whl")[0]
read = lambda name: open(os.path.join(out, name)).read().strip()
span = lambda name: (lambda a, b: float(b) - float(a))(*read(name).split())
ig, pl = span("imagegen_times"), span("plain_times")
import re
log = read("imagegen.log")
m = re.search(r"pip wheel took ([\d.]+) s", log)
pip_s = float(m.group(1)) if m else None
steps = next((l[len("time: "):] for l in log.splitlines() if l.startswith("time: ")), None)
res = {"order": order, "imagegen_s": round(ig, 1), "plain_pip_s": round(pl, 1), "overhead_ratio": round(ig / pl, 4),
       "imagegen_peak_gb": round(int(read("imagegen_peak_mb")) / 1024, 1),
       "plain_peak_gb": round(int(read("plain_peak_mb")) / 1024, 1),
       "plain_env": json.loads(read("plain_env.json")),
       "wheel": os.path.basename(wheel), "wheel_bytes": os.path.getsize(wheel),
       "plain_wheel": os.path.basename(pw), "plain_wheel_bytes": os.path.getsize(pw),
       "gpu_check": read("gpu_check.txt").splitlines()[-3:],
       # imagegen's own share: its wall time minus the `pip wheel` inside it (the compile itself)
       "imagegen_pip_s": pip_s, "imagegen_own_s": round(ig - pip_s, 1) if pip_s else None,
       "imagegen_steps": steps,
       # standalone `imagegen verify` of the wheel and a bare `import torch`, for the own-steps breakdown
       "verify_s": round(span("verify_times"), 2), "import_torch_s": round(span("import_torch_times"), 2),
       "verify": read("verify.txt").splitlines()}
json.dump(res, open(out + "/result.json", "w"), indent=2)
print(json.dumps(res, indent=2))
PY
