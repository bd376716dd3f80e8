#!/usr/bin/env bash
# The container proof (scripts/gpu/container_proof.sh) in one lease of the GPU device, whose calls last at
# most 10 minutes and whose machine goes back 30 s after a call ends: the steps run in the background and
# each call waits on them, copying the logs back as they grow.
#   scripts/gpu/container_proof_bg.sh start SRC OUT [STEP...]   (after `engine.sh unpack .src/engine-a`
#       in an earlier call; carry .src/engine-b and .whl): engine, host image, base image, then the steps
#       (default: diag native runtime bake), each logged to OUT/STEP.log, times in OUT/times.txt
#   scripts/gpu/container_proof_bg.sh wait OUT SECONDS COPY_TO   waits up to SECONDS, copying OUT's logs to
#       COPY_TO every 20 s; exit 0 once every step has ended, 2 while they still run
# diag: one SageAttention kernel file (csrc/fused/fused.cu) compiled by nvcc for sm_90a on the host and
# in a container of the base image, the same command and flags, timed: is the container slower?
set -uo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export PATH=/opt/imagegen-engine/bin:$PATH

diag() {  # diag SRC
    local src=$1 inc
    inc=$(python3 -c 'from torch.utils.cpp_extension import include_paths; print(" ".join("-I" + p for p in include_paths()))')
    local cmd="nvcc -c $src/csrc/fused/fused.cu -o /tmp/fused.o $inc -I/usr/include/python3.12 -std=c++17 -O3 -gencode arch=compute_90a,code=sm_90a -DTORCH_EXTENSION_NAME=_fused -D_GLIBCXX_USE_CXX11_ABI=1"
    echo "host:"; ( time bash -c "$cmd" ) 2>&1 | tail -3
    echo "container:"; ( time docker run --rm --network none -v "$src:$src:ro" imagegen-gpu/base:1 bash -c "$cmd" ) 2>&1 | tail -3
    nproc; docker info --format '{{.NCPU}} CPUs, cgroup {{.CgroupVersion}} {{.CgroupDriver}}'
}

case ${1:-} in
start)
    src=$2 out=$3; shift 3
    steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(diag native runtime bake)
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
        for step in "$@"; do
            case $step in
                diag) bash scripts/gpu/container_proof_bg.sh diag "$src" ;;
                native) bash scripts/gpu/container_proof.sh native "$src" 9.0 "$out/native" ;;
                runtime) bash scripts/gpu/container_proof.sh runtime imagegen-gpu/base:1 "$src" "$out/runtime" ;;
                bake) bash scripts/gpu/container_proof.sh bake imagegen-gpu/base:1 "$src" 9.0 "$out/bake" ;;
            esac > "$out/$step.log" 2>&1
            echo "exit=$?" >> "$out/$step.log"
        done
        touch "$out/DONE"
    ' _ "$here" "$src" "$out" "${steps[@]}" < /dev/null > /dev/null 2>&1 &
    echo "started: ${steps[*]} (logs in $out)"
    ;;
diag)
    diag "$2"
    ;;
wait)
    out=$2 seconds=$3 copy_to=$4
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
