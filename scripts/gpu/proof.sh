#!/usr/bin/env bash
# Proof on a real GPU (docs/records/verification.md): build RECIPE natively with imagegen for ARCH, verify the
# archs in the .so, run the recipe's GPU check against torch, then build the same source with a
# plain `pip wheel` and the same flags, and compare the times and peak memory.
#   scripts/gpu/proof.sh RECIPE SRC_DIR ARCH OUT_DIR [MAX_JOBS]
# MAX_JOBS is the build's whole job budget (default: imagegen sizes it from RAM and cores).
# MODE=sequential (default): one build after the other, ORDER=imagegen-first|plain-first says which
#   goes first (run both orders: ABBA).
# MODE=concurrent: both builds at the same time, each pinned to its own half of the physical cores
#   (hyperthread siblings stay together), so that both see the same machine at the same moments:
#   machine-to-machine and minute-to-minute spread (+-5 % between sequential runs on these VMs)
#   cancels out of the ratio. Each half gets the job settings imagegen picks for its CPU count.
#   ORDER=imagegen-first gives imagegen the first half, plain-first the second: run both to cancel
#   any difference between the halves.
# Every build is timed with the CPU time of all its processes (user + sys), not only wall time.
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
mode=${MODE:-sequential} order=${ORDER:-imagegen-first}

# timed FILE CPUS CMD...: runs CMD (on the CPU list CPUS when not empty) and writes "start end user
# sys" to FILE: wall clock, and the CPU seconds of CMD and every process below it.
timed() {
  $py -c 'import os, resource, subprocess, sys, time
path, cpus = sys.argv[1], sys.argv[2]
if cpus:
    os.sched_setaffinity(0, [int(c) for c in cpus.split(",")])
t0 = time.time(); rc = subprocess.call(sys.argv[3:]); t1 = time.time()
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
open(path, "w").write("%r %r %.2f %.2f\n" % (t0, t1, ru.ru_utime, ru.ru_stime))
sys.exit(rc)' "$@"
}

# Two halves of this machine's CPUs, whole physical cores each (concurrent mode).
cpus_imagegen="" cpus_plain=""
if [ "$mode" = concurrent ]; then
  read -r half_a half_b < <($py - <<'PY'
import os
cores = {}
for c in sorted(os.sched_getaffinity(0)):
    try:
        with open(f"/sys/devices/system/cpu/cpu{c}/topology/thread_siblings_list") as fh:
            key = fh.read().strip()
    except OSError:
        key = str(c)
    cores.setdefault(key, []).append(c)
groups = list(cores.values())
half = len(groups) // 2
print(",".join(str(c) for g in groups[:half] for c in g), ",".join(str(c) for g in groups[half:2 * half] for c in g))
PY
)
  if [ "$order" = plain-first ]; then cpus_imagegen=$half_b cpus_plain=$half_a; else cpus_imagegen=$half_a cpus_plain=$half_b; fi
  echo "concurrent: imagegen on CPUs $cpus_imagegen, plain pip on CPUs $cpus_plain" >> "$out/host.txt"
fi

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
# (Computed on imagegen's CPUs: the job settings follow the CPU count a build may use; not timed.)
timed /dev/null "$cpus_imagegen" $py -m imagegen build "$recipe" --native --src-dir "$src" --arch "$arch" \
    --work "$work/env" ${jobs:+--max-jobs "$jobs"} --print-env > "$out/plain_env.json"

run_imagegen() {  # $1: file for the peak memory (empty: no sampler)
  local sampler=""
  if [ -n "${1:-}" ]; then sample_memory "$1" & sampler=$!; fi
  timed "$out/imagegen_times" "$cpus_imagegen" \
      $py -m imagegen build "$recipe" --native --src-dir "$src" --arch "$arch" --out "$out/wheels" --flat \
      --work "$work/imagegen" ${jobs:+--max-jobs "$jobs"} > "$out/imagegen.log" 2>&1 \
      || { [ -z "$sampler" ] || kill $sampler; echo "imagegen build failed: $out/imagegen.log"; tail -30 "$out/imagegen.log"; exit 1; }
  [ -z "$sampler" ] || kill $sampler
}

run_plain() {  # $1: file for the peak memory (empty: no sampler)
  # The same source (with the recipe's patches, applied below before either build), plain pip
  # wheel, the same variables.
  local sampler=""
  if [ -n "${1:-}" ]; then sample_memory "$1" & sampler=$!; fi
  (cd "$work/plain-src" && timed "$out/plain_times" "$cpus_plain" $py -c 'import json, os, sys
os.execvpe(sys.argv[2], sys.argv[2:], dict(os.environ, **json.load(open(sys.argv[1]))))' "$out/plain_env.json" \
     $py -m pip wheel --no-build-isolation --no-deps -w "$work/plain-dist" . > "$out/plain.log" 2>&1) \
      || { [ -z "$sampler" ] || kill $sampler; echo "plain build failed: $out/plain.log"; tail -30 "$out/plain.log"; exit 1; }
  [ -z "$sampler" ] || kill $sampler
}

# Patches first (imagegen's own fetch step, idempotent), so both builds compile the same tree.
$py - "$recipe" "$src" <<'PY'
import json, subprocess, sys, tempfile, os
from imagegen.recipes import load_catalogue
from imagegen.render import builder_files
r = load_catalogue().get(sys.argv[1]); v = r.version(None)
with tempfile.TemporaryDirectory() as tmp:
    for name, text in builder_files().items():
        open(os.path.join(tmp, name), "w").write(text)
    sys.path.insert(0, tmp); import imagegen_build as b
    for p in v.patches:
        b.apply_patch({"name": p.name, "reason": p.reason, "text": p.text}, sys.argv[2])
PY

rm -rf "$work/plain-src" && cp -r "$src" "$work/plain-src"
if [ "$mode" = concurrent ]; then
  sample_memory "$out/both_peak_mb" & sampler=$!
  run_imagegen "" & ig=$!
  run_plain "" & pl=$!
  wait $ig || { kill $sampler; exit 1; }
  wait $pl || { kill $sampler; exit 1; }
  kill $sampler
# ORDER=plain-first puts the cold page cache on the plain build instead (run both orders: ABBA).
elif [ "$order" = plain-first ]; then
  run_plain "$out/plain_peak_mb"; run_imagegen "$out/imagegen_peak_mb"
else
  run_imagegen "$out/imagegen_peak_mb"; run_plain "$out/plain_peak_mb"
fi
# The variables imagegen's build really ran with (its in-build script logs them first thing).
grep -m1 '^\[imagegen\] build env: ' "$work/imagegen/logs/build.log" | sed 's/^\[imagegen\] build env: //' > "$out/imagegen_env.json" || true
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
# The recipe's gpu_check against the wheel: `imagegen check` unpacks it into a temporary folder (nothing
# installed: a venv made from a venv's python would not see its torch) and runs it from an empty one.
$py -m imagegen check "$wheel" --recipe "$recipe" > "$out/gpu_check.txt" 2>&1 || true

$py - "$wheel" "$work/plain-dist" "$out" "$order" "$mode" "$cpus_imagegen" "$cpus_plain" <<'PY'
import json, sys, os, glob
wheel, plain, out, order, mode, cpus_imagegen, cpus_plain = sys.argv[1:8]
pw = glob.glob(plain + "/*.whl")[0]
read = lambda name: open(os.path.join(out, name)).read().strip()
span = lambda name: (lambda a, b, *_: float(b) - float(a))(*read(name).split())
cpu = lambda name: (lambda a, b, user, system: float(user) + float(system))(*read(name).split())
ig, pl = span("imagegen_times"), span("plain_times")
peak = lambda name: round(int(read(name)) / 1024, 1) if os.path.exists(os.path.join(out, name)) else None
plain_env = json.loads(read("plain_env.json"))
try:
    imagegen_env = json.loads(read("imagegen_env.json"))
except ValueError:
    imagegen_env = None
import re
log = read("imagegen.log")
m = re.search(r"pip wheel took ([\d.]+) s", log)
pip_s = float(m.group(1)) if m else None
steps = next((l[len("time: "):] for l in log.splitlines() if l.startswith("time: ")), None)
res = {"mode": mode, "order": order, "imagegen_s": round(ig, 1), "plain_pip_s": round(pl, 1), "overhead_ratio": round(ig / pl, 4),
       # CPU seconds (user + sys) of every process of each build: the work done, whatever the machine's mood
       "imagegen_cpu_s": round(cpu("imagegen_times"), 1), "plain_cpu_s": round(cpu("plain_times"), 1),
       "cpu_ratio": round(cpu("imagegen_times") / cpu("plain_times"), 4),
       "cpus_imagegen": cpus_imagegen or "all", "cpus_plain": cpus_plain or "all",
       "imagegen_peak_gb": peak("imagegen_peak_mb"), "plain_peak_gb": peak("plain_peak_mb"), "both_peak_gb": peak("both_peak_mb"),
       "plain_env": plain_env,
       # the variables imagegen's build ran with: the comparison holds only if they are plain pip's
       "imagegen_env": imagegen_env, "same_env": imagegen_env == plain_env,
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
