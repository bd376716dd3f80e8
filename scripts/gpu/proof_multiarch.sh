#!/usr/bin/env bash
# Multi-arch proof on the GPU machine (issue "The plan tells the truth", docs/records/verification.md):
# for each RECIPE:SRC:ARCH, imagegen's gencode audit (`plan --audit --native`), then the native build
# of that exact arch list (wall time, CPU seconds of every process, peak RAM over the idle baseline,
# and the budget imagegen printed), `imagegen verify` of the wheel and `imagegen check` (the recipe's
# numerical check on the GPU). Longer than one device call: `start` runs the proofs in a session of
# their own and waits; `wait` is repeated call by call until it exits 0.
#   scripts/gpu/proof_multiarch.sh start OUT 'sage|.src/dev/SageAttention|8.0 8.6 9.0 12.0+PTX' ['causal-conv1d|...|8.0;9.0;12.0|--version 1.7.0' ...]
# (a fourth field: more words for that recipe's plan and build, after IMAGEGEN_ARGS)
#   scripts/gpu/proof_multiarch.sh wait OUT [SECONDS]
# PROOF_PYTHON: the interpreter whose torch the wheels are built for and checked with (default python3; pass the
# same as --python-exe in IMAGEGEN_ARGS, e.g. a venv with a newer torch than the machine's).
# Exit 0: done (results in OUT/proofs.tgz and printed), 1: the proofs died, 2: still running (what it has done so
# far in OUT/progress.tgz), 3: nothing started.
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
results=/tmp/imagegen-multiarch
cmd=${1:-}
shift || true

run_one() {  # $1 recipe, $2 source copy, $3 arch list, $4 result folder, $5 more words for plan and build
  local recipe=$1 src=$2 arch=$3 dir=$4 extra=${5:-}
  mkdir -p "$dir"
  export PYTHONPATH=$here PYTHONUNBUFFERED=1
  echo "== $recipe '$arch' $(date -u +%T)"
  # shellcheck disable=SC2086  # IMAGEGEN_ARGS and extra: words for plan and build (e.g. --recipe-dir DIR)
  python3 -m imagegen plan --audit --native "$recipe" --src-dir "$src" --arch "$arch" --json --work "$dir/work-audit" ${IMAGEGEN_ARGS:-} $extra \
    > "$dir/plan-audit.json" 2> "$dir/audit.err"
  echo "audit exit $? $(date -u +%T)"
  # Peak memory in use above the idle baseline, sampled every 0.5 s while the build runs.
  python3 - "$dir/mem.json" <<'PY' &
import json, sys, time
def used():
    info = {}
    for line in open("/proc/meminfo"):
        k, v = line.split(":", 1)
        info[k] = int(v.split()[0])
    return (info["MemTotal"] - info["MemAvailable"]) / 1024 / 1024
base = used(); peak = base
while True:
    peak = max(peak, used())
    json.dump({"baseline_gib": round(base, 2), "peak_gib": round(peak, 2), "peak_over_baseline_gib": round(peak - base, 2)},
              open(sys.argv[1], "w"))
    time.sleep(0.5)
PY
  local sampler=$!
  python3 - "$dir/times.json" python3 -m imagegen build --native "$recipe" --src-dir "$src" --arch "$arch" \
      --out "$dir/wheelhouse" --work "$dir/work" ${IMAGEGEN_ARGS:-} $extra > "$dir/build.out" 2> "$dir/build.err" <<'PY'
import json, resource, subprocess, sys, time
t0 = time.time(); rc = subprocess.call(sys.argv[2:]); t1 = time.time()
ru = resource.getrusage(resource.RUSAGE_CHILDREN)
json.dump({"rc": rc, "wall_s": round(t1 - t0, 1), "cpu_user_s": round(ru.ru_utime, 1), "cpu_sys_s": round(ru.ru_stime, 1)},
          open(sys.argv[1], "w"))
sys.exit(rc)
PY
  echo "build exit $? $(date -u +%T)"
  kill "$sampler" 2>/dev/null
  cp "$dir"/work/logs/*.json "$dir"/work/logs/build.log "$dir/" 2>/dev/null
  local wheel
  wheel=$(find "$dir/wheelhouse" -name '*.whl' | head -1)
  if [ -n "$wheel" ]; then
    python3 -m imagegen verify "$wheel" --arch "$arch" --json > "$dir/verify.json" 2> "$dir/verify.err"
    echo "verify exit $?"
    python3 -m imagegen check "$wheel" --python "${PROOF_PYTHON:-python3}" --json > "$dir/check.json" 2> "$dir/check.err"
    echo "check exit $?"
    find "$dir/wheelhouse" -name manifest.json -exec cp {} "$dir/manifest.json" \;
  fi
  python3 - "$dir" "$recipe" "$arch" <<'PY'
import json, os, re, sys
d, recipe, arch = sys.argv[1:]
def load(name):
    try:
        return json.load(open(os.path.join(d, name)))
    except (OSError, ValueError):
        return None
err = open(os.path.join(d, "build.err"), errors="replace").read() if os.path.exists(os.path.join(d, "build.err")) else ""
budget = re.search(r"jobs: (MAX_JOBS=\d+ NVCC_THREADS=\d+ \(~(\d+) GB peak\))", err)
times, mem = load("times.json") or {}, load("mem.json") or {}
cpu = (times.get("cpu_user_s") or 0) + (times.get("cpu_sys_s") or 0)
result = {"recipe": recipe, "arch": arch, "build_rc": times.get("rc"), "wall_s": times.get("wall_s"), "cpu_s": round(cpu, 1),
          "cpu_busy": round(cpu / times["wall_s"] / os.cpu_count(), 3) if times.get("wall_s") else None,
          "jobs": budget.group(1) if budget else None, "predicted_peak_gb": int(budget.group(2)) if budget else None,
          "measured": mem, "audit": (load("plan-audit.json") or {}).get("audit"), "verify": load("verify.json"), "check": load("check.json"),
          "error_tail": err.strip().splitlines()[-3:] if times.get("rc") else None}
json.dump(result, open(os.path.join(d, "result.json"), "w"), indent=2)
PY
}

run_all() {
  local i=0
  {
    nvidia-smi --query-gpu=name,compute_cap,driver_version --format=csv,noheader
    "${PROOF_PYTHON:-python3}" -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda)'
    nvcc --version | tail -2; nproc; free -g | head -2
    grep -m1 "model name" /proc/cpuinfo  # wall times compare only on the same CPU model
  } > "$results/host.txt" 2>&1
  for spec in "$@"; do
    IFS='|' read -r recipe src arch extra <<< "$spec"
    i=$((i + 1))
    run_one "$recipe" "$results/src$i" "$arch" "$results/proof$i" "$extra"
  done
  echo "all done $(date -u +%T)"
}

progress() {  # $1 OUT: what a build still running has shown so far, in case the machine goes back before it ends
  # (an idle gap of 30 s between calls gives the machine back and loses the run: 2026-11-29, flash-attn at
  # torch 2.14 after ~1,110 s of its ~1,280). ninja's log: one line per compiled source, with its times.
  local log tag
  for log in /tmp/imagegen-work-*/src/build/temp*/.ninja_log; do
    tag=${log#/tmp/imagegen-work-}
    [ -f "$log" ] && cp "$log" "$results/ninja_log.${tag%%/*}"
  done
  pack "$1" progress.tgz
}

pack() {  # $1 OUT, $2 file name: the results so far, without wheels, work folders or source copies
  mkdir -p "$1"
  tar -czf "$1/$2" --exclude=wheelhouse --exclude='work*' --exclude='src*' -C "$results" .
}

wait_for() {  # $1 OUT, $2 seconds
  local out=$1 budget=$2
  [ -f "$results/run.log" ] || { echo "nothing was started on this machine: run 'start' again"; exit 3; }
  while ! grep -q '^all done' "$results/run.log" && (( SECONDS < budget )); do
    if ! pgrep -f "proof_multiarch.sh run" > /dev/null && ! grep -q '^all done' "$results/run.log"; then
      progress "$out"; tail -n 20 "$results/run.log"; echo "the proofs stopped without finishing"; exit 1
    fi
    sleep 10
  done
  tail -n 20 "$results/run.log"
  if ! grep -q '^all done' "$results/run.log"; then
    progress "$out"
    echo "still running after ${SECONDS} s: call 'wait' again (progress so far: OUT/progress.tgz)"; exit 2
  fi
  pack "$out" proofs.tgz
  for f in "$results"/proof*/result.json; do python3 -c 'import json,sys; r=json.load(open(sys.argv[1])); r["audit"]=r["audit"] and {k: r["audit"][k] for k in ("verdict","refusals","warnings","seconds")}; r["verify"]=r["verify"] and [{k: w[k] for k in ("ok","problems","warnings","extensions")} for w in r["verify"]]; print(json.dumps(r))' "$f"; done
  exit 0
}

case $cmd in
  start)
    out=$1; shift
    for spec in "$@"; do  # a stray word (a wait time, say) would otherwise run as a recipe named so
      IFS='|' read -r recipe src arch _ <<< "$spec"
      [ -n "$recipe" ] && [ -d "$src" ] && [ -n "$arch" ] || { echo "not RECIPE|SRC|ARCH with SRC a folder: '$spec'"; exit 64; }
    done
    rm -rf "$results" && mkdir -p "$results"
    i=0
    for spec in "$@"; do  # copy the sources now: later calls need not carry them
      IFS='|' read -r _ src _ <<< "$spec"
      i=$((i + 1)); cp -a "$src" "$results/src$i"
    done
    setsid nohup bash "$here/scripts/gpu/proof_multiarch.sh" run "$@" > "$results/run.log" 2>&1 < /dev/null &
    sleep 2
    wait_for "$out" "${PROOF_WAIT:-540}"  # PROOF_WAIT: less when the same call did other work first
    ;;
  run) run_all "$@" ;;
  wait) wait_for "$1" "${2:-540}" ;;
  *) echo "usage: $0 start OUT 'RECIPE|SRC|ARCH[|WORDS]'... | wait OUT [SECONDS]"; exit 64 ;;
esac
