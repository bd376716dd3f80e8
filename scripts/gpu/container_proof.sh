#!/usr/bin/env bash
# Wheels built in containers, proven on the GPU device (docs/records/verification.md, "GPU in containers").
# The device has no network and no registry: the engine comes from scripts/gpu/engine.sh, the base image
# is the host's own root filesystem, and every build step runs with --network=none (imagegen --offline).
# One step per call (a call may run 10 minutes):
#   scripts/gpu/container_proof.sh base HOST_TAG TAG OUT
#       TAG: HOST_TAG with the host's environment (PATH, CUDA_HOME, LIBRARY_PATH) and the host's torch
#       venv visible to the system Python (a .pth), as a CUDA image with torch is: imagegen reuses it.
#   scripts/gpu/container_proof.sh bake TAG SRC ARCH OUT
#       imagegen build (docker buildx bake) --offline of the tree SRC for ARCH on TAG; the wheel is checked
#       on the GPU here (imagegen check: the recipe's numerical test against torch SDPA).
#   scripts/gpu/container_proof.sh runtime TAG SRC OUT
#       the cell's builder image, then `docker run` with the GPU visible (imagegen's GPU access flags for
#       this host) and no arch: it detects the GPU's arch, compiles, smoke-tests and writes to OUT;
#       imagegen collect records it, imagegen check runs it on the GPU.
#   scripts/gpu/container_proof.sh bakegpu TAG SRC ARCH OUT
#       the bake with the recipe's GPU check inside the build (--gpu-check-device nvidia.com/gpu=all: a
#       RUN --device step given the GPU through the CDI spec `imagegen cdi-spec` wrote); needs the engine
#       of .src/engine-c (Docker 28 with CDI on, buildx 0.29) and the labs Dockerfile frontend image
#       (scripts/gpu/container_proof.sh frontend). The exported wheel is checked here again.
#   scripts/gpu/container_proof.sh frontend BINARY TAG
#       a Dockerfile frontend image (RUN --device: labs) from a frontend binary, without a registry
#   scripts/gpu/container_proof.sh native SRC ARCH OUT
#       the same cell natively (imagegen build --native), for the wall-time comparison.
# Each step appends "STEP seconds" to OUT/../times.txt.
set -euo pipefail
here=$(cd "$(dirname "$0")/../.." && pwd)
export PATH=/opt/imagegen-engine/bin:$PATH PYTHONUNBUFFERED=1
export PYTHONPATH=$here:/tmp/site
py=python3
imagegen() { $py -m imagegen "$@"; }
CELL=(--torch 2.11 --cuda 13.0 --python 3.12)

timed() {  # timed NAME OUT CMD...: run CMD, append "NAME seconds rc" to OUT/../times.txt
    local name=$1 out=$2; shift 2
    local t0 rc=0; t0=$(date +%s%N)
    "$@" || rc=$?
    mkdir -p "$(dirname "$out")"
    local ms=$(( ($(date +%s%N) - t0) / 1000000 ))
    printf '%s %d.%03d %s\n' "$name" $((ms / 1000)) $((ms % 1000)) "$rc" >> "$(dirname "$out")/times.txt"
    return $rc
}

gpu_check() {  # gpu_check OUT: the recipe's numerical check on each wheel in OUT (no install)
    find "$1" -name '*.whl' -print0 | while IFS= read -r -d '' wheel; do
        imagegen verify "$wheel" --arch 9.0 && imagegen check "$wheel"
    done
}

case ${1:-} in
base)
    host=$2 tag=$3 out=$4
    site=$(/opt/torch/.venv/bin/python -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    dir=$(mktemp -d)
    cat > "$dir/Dockerfile" <<EOF
FROM $host
ENV PATH=/usr/local/nvidia/bin:/usr/local/cuda/bin:/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \\
    CUDA_HOME=/usr/local/cuda \\
    LIBRARY_PATH=/usr/local/cuda/lib64/stubs \\
    LD_LIBRARY_PATH=/usr/local/nvidia/lib64:/usr/local/nvidia/lib
COPY wheels/ /tmp/wheels/
RUN --network=none echo "$site" > /usr/lib/python3/dist-packages/imagegen-host-torch.pth \\
    && { /usr/bin/python3.12 -c "import psutil" 2>/dev/null \\
         || /usr/bin/python3.12 -m pip install --no-index --no-deps --target "$site" /tmp/wheels/psutil-*.whl; } \\
    && rm -rf /tmp/wheels \\
    && /usr/bin/python3.12 -c "import torch, psutil, ninja; print('torch', torch.__version__, torch.version.cuda)"
EOF
    # What a build requirement the host lacks needs (the recipes' psutil), from the wheels carried in.
    mkdir -p "$dir/wheels" && cp "$here"/.whl/psutil-*.whl "$dir/wheels/"
    timed base "$out" docker buildx build --progress plain --load -t "$tag" "$dir"
    ;;
bake)
    tag=$2 src=$3 arch=$4 out=$5
    timed bake "$out" imagegen build --source "$src" "${CELL[@]}" --arch "$arch" --base-image "$tag" --offline \
        --out "$out" --work "$out.work" --no-audit
    gpu_check "$out"
    ;;
frontend)
    binary=$2 tag=$3
    dir=$(mktemp -d)
    cp "$binary" "$dir/dockerfile-frontend"
    # As moby/buildkit's frontend/dockerfile/cmd/dockerfile-frontend/Dockerfile makes its release image.
    cat > "$dir/Dockerfile" <<'EOF'
FROM scratch
LABEL moby.buildkit.frontend.network.none="true"
LABEL moby.buildkit.frontend.caps="moby.buildkit.frontend.inputs,moby.buildkit.frontend.subrequests,moby.buildkit.frontend.contexts"
COPY dockerfile-frontend /bin/dockerfile-frontend
ENTRYPOINT ["/bin/dockerfile-frontend"]
EOF
    docker buildx build --progress plain --load -t "$tag" "$dir"
    ;;
bakegpu)
    tag=$2 src=$3 arch=$4 out=$5
    imagegen cdi-spec -o /etc/cdi/imagegen-nvidia.json
    docker buildx inspect | sed -n '/^Devices:/,/^GC/p'
    timed bakegpu "$out" imagegen build --source "$src" "${CELL[@]}" --arch "$arch" --base-image "$tag" --offline \
        --out "$out" --work "$out.work" --no-audit --gpu-check-device nvidia.com/gpu=all \
        --dockerfile-frontend "${IMAGEGEN_FRONTEND:-imagegen-gpu/dockerfile:labs}"
    find "$out.work" -name gpu_check.json -exec cat {} + || true
    find "$out" -name '*.imagegen.json' -exec $py -c 'import json, sys; [print(p, json.load(open(p)).get("gpu_check")) for p in sys.argv[1:]]' {} +
    gpu_check "$out"
    ;;
runtime)
    tag=$2 src=$3 out=$4
    dir=$(mktemp -d)
    imagegen render --source "$src" "${CELL[@]}" --arch 9.0 --base-image "$tag" --offline -o "$dir/Dockerfile"
    timed runtime-image "$out" docker buildx build --progress plain --build-context imagegen-scripts="$dir/imagegen-scripts" \
        --build-context source="$src" --target builder --load -t imagegen-gpu/builder:proof "$dir"
    read -r -a flags < <($py -c 'from imagegen.executors import gpu_access; from imagegen import engine
print(" ".join(gpu_access.choose("auto", driver_works=engine.driver_works).flags))')
    echo "gpu flags: ${flags[*]}"
    mkdir -p "$out"
    timed runtime "$out" docker run --rm --network none "${flags[@]}" -v "$(cd "$out" && pwd):/out" imagegen-gpu/builder:proof
    imagegen collect "$out"
    gpu_check "$out"
    ;;
native)
    src=$2 arch=$3 out=$4
    timed native "$out" imagegen build --native --source "$src" --arch "$arch" --out "$out" --work "$out.work" --no-audit
    gpu_check "$out"
    ;;
*)
    echo "usage: $0 base HOST_TAG TAG OUT | bake TAG SRC ARCH OUT | runtime TAG SRC OUT | native SRC ARCH OUT" >&2
    exit 2
    ;;
esac
