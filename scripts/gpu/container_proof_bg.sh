#!/usr/bin/env bash
# The container proof (scripts/gpu/container_proof.sh) in one lease of the GPU device, whose calls last at
# most 10 minutes and whose machine goes back 30 s after a call ends: the steps run in the background and
# each call waits on them, copying the logs back as they grow.
#   scripts/gpu/container_proof_bg.sh start SRC OUT [STEP...]   (after `engine.sh unpack .src/engine-a`
#       in an earlier call; carry .src/engine-b and .whl): engine, host image, base image, then the steps
#       (default: diag runtime native; bake too if named), each logged to OUT/STEP.log, times in OUT/times.txt
#   scripts/gpu/container_proof_bg.sh wait OUT SECONDS COPY_TO   waits up to SECONDS, copying OUT's logs to
#       COPY_TO every 20 s; exit 0 once every step has ended, 2 while they still run
# diag: one SageAttention kernel file (csrc/fused/fused.cu) compiled by nvcc for sm_90a on the host and
# in a container of the base image, the same command and flags, timed: is the container slower?
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export PATH=/opt/imagegen-engine/bin:$PATH

probe() {  # what a process sees here: CPUs, cgroup limits, the compilers, /tmp, single- and 16-way CPU speed
    nproc; grep Cpus_allowed_list /proc/self/status
    echo "cgroup $(tr '\n' ' ' < /proc/self/cgroup); cpu.max $(cat /sys/fs/cgroup/cpu.max 2>/dev/null || echo -)"
    echo "g++ $(command -v g++) $(g++ --version 2>/dev/null | head -1); CUDAHOSTCXX=${CUDAHOSTCXX:-unset}"
    df -h /tmp | tail -1
    python3 -c 'import time; t = time.time(); sum(range(30000000)); print("1 loop %.2f s" % (time.time() - t))'
    python3 -c '
import multiprocessing as mp, time
def loop(_): sum(range(30000000))
t = time.time()
with mp.Pool(16) as p: p.map(loop, range(16))
print("16 loops at once %.2f s" % (time.time() - t))'
}

diag() {  # diag SRC
    local src inc
    src=$(cd "$1" && pwd)  # absolute: it is bind-mounted
    inc=$(python3 -c 'from torch.utils.cpp_extension import include_paths; print(" ".join("-I" + p for p in include_paths()))')
    local cmd="nvcc -c $src/csrc/fused/fused.cu -o /tmp/fused.o $inc -I/usr/include/python3.12 -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -DTORCH_EXTENSION_NAME=_fused -D_GLIBCXX_USE_CXX11_ABI=1"
    local img=imagegen-gpu/base:1
    echo "== host"; probe
    echo "== container"; docker run --rm --network none "$img" bash -c "$(declare -f probe); probe"
    docker info --format '{{.NCPU}} CPUs, cgroup {{.CgroupVersion}} {{.CgroupDriver}}, {{.Driver}}'
    # One kernel file, the same nvcc command, on the host and in a container at the same time (16 cores,
    # one target each: they hardly compete), each cut at 240 s: is the container slower, and by how much?
    echo "== fused.cu sm_90a: host and container at once"
    ( time timeout 240 bash -c "$cmd" ) > /tmp/diag-host.txt 2>&1 &
    ( time docker run --rm --network none -v "$src:$src:ro" "$img" timeout 240 bash -c "$cmd" ) > /tmp/diag-ctr.txt 2>&1 &
    wait
    echo "host:"; tail -4 /tmp/diag-host.txt; echo "container:"; tail -4 /tmp/diag-ctr.txt
}

sample() {  # sample FILE: every 60 s, the load, the busiest processes and the containers' CPU throttling
    while :; do
        { date +%T; cat /proc/loadavg
          ps -eo stat,pcpu,etimes,comm --sort=-pcpu | head -12
          for f in /sys/fs/cgroup/system.slice/docker-*.scope/cpu.stat /sys/fs/cgroup/docker/*/cpu.stat; do
              [ -f "$f" ] && echo "$f: $(tr '\n' ' ' < "$f")"
          done; echo; } >> "$1" 2>&1
        sleep 60
    done
}

case ${1:-} in
start)
    src=$2 out=$3; shift 3
    steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(diag runtime native)
    mkdir -p "$out"
    setsid bash -c '
        here=$1 src=$2 out=$3; shift 3
        cd "$here"
        {
            [ -x /opt/imagegen-engine/bin/runc ] || bash scripts/gpu/engine.sh unpack .src/engine-b
            bash scripts/gpu/engine.sh start
            docker image inspect imagegen-gpu/host:1 >/dev/null 2>&1 || bash scripts/gpu/engine.sh host-image imagegen-gpu/host:1
            python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl
            docker image inspect imagegen-gpu/base:1 >/dev/null 2>&1 \
                || bash scripts/gpu/container_proof.sh base imagegen-gpu/host:1 imagegen-gpu/base:1 "$out/x"
        } > "$out/setup.log" 2>&1
        bash scripts/gpu/container_proof_bg.sh sample "$out/sample.log" & sampler=$!
        for step in "$@"; do
            case $step in
                diag) bash scripts/gpu/container_proof_bg.sh diag "$src" ;;
                native) bash scripts/gpu/container_proof.sh native "$src" 9.0 "$out/native" ;;
                runtime) bash scripts/gpu/container_proof.sh runtime imagegen-gpu/base:1 "$src" "$out/runtime" ;;
                bake) bash scripts/gpu/container_proof.sh bake imagegen-gpu/base:1 "$src" 9.0 "$out/bake" ;;
                bakegpu) bash scripts/gpu/container_proof.sh frontend /opt/imagegen-engine/bin/dockerfile-frontend imagegen-gpu/dockerfile:labs \
                             && bash scripts/gpu/container_proof.sh bakegpu imagegen-gpu/base:1 "$src" 9.0 "$out/bakegpu" ;;
            esac > "$out/$step.log" 2>&1
            echo "exit=$?" >> "$out/$step.log"
        done
        kill $sampler 2>/dev/null
        touch "$out/DONE"
    ' _ "$here" "$src" "$out" "${steps[@]}" < /dev/null > /dev/null 2>&1 &
    echo "started: ${steps[*]} (logs in $out)"
    ;;
diag)
    diag "$2"
    ;;
sample)
    sample "$2"
    ;;
wait)
    out=$2 seconds=$3 copy_to=$4
    # A machine lent afresh (the last one went back) has no run: say so at once, not after SECONDS.
    [ -d "$out" ] || { echo "no run in $out on this machine: it is a fresh one, start again" >&2; exit 3; }
    end=$((SECONDS + seconds))
    while :; do
        for f in "$out"/*.log "$out"/times.txt; do [ -f "$f" ] && cp "$f" "$copy_to/"; done
        [ -f "$out/DONE" ] && { tail -n 4 "$out"/*.log; exit 0; }
        [ $SECONDS -ge "$end" ] && { tail -n 2 "$out"/*.log; exit 2; }
        sleep 20
    done
    ;;
*)
    echo "usage: $0 start SRC OUT [STEP...] | wait OUT SECONDS COPY_TO | diag SRC" >&2
    exit 2
    ;;
esac
