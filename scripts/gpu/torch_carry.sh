#!/usr/bin/env bash
# A newer torch on the GPU machine, which has no network and takes 64 MiB per call: the proofs at the
# frontier (docs/records/verification.md, "torch 2.14 on the GPU").
#   pack TORCH PYTHON DIR [EXTRA_WHEEL_SPEC...]   here (PyPI reachable): download torch==TORCH for cpPYTHON
#       (manylinux x86_64) and the extra wheels named (a newer library torch links that the machine's own is too
#       old for, e.g. nvidia-nccl-cu13==2.30.7; torch 2.15: nvidia-nvshmem-cu13==3.7.2 too), unpack them into one site-packages tree, xz it and split it
#       into DIR/pNN parts of 53 MiB (PART_MIB; DIR git-ignored); prints the sha256 `venv` checks.
#   venv PARTS SHA256 VENV   on the GPU machine, after one call per part moved it to PARTS: join, check,
#       and make VENV whose own site-packages hold that tree and which also sees the machine's packages (its
#       CUDA libraries, setuptools, ninja) through a .pth line; prints torch's version and the GPU.
# Then IMAGEGEN_ARGS="--python-exe VENV/bin/python" PROOF_PYTHON=VENV/bin/python scripts/gpu/proof_multiarch.sh ...
set -euo pipefail

case ${1:-} in
  pack)
    torch=$2 py=$3 dir=$4; shift 4
    work=$(mktemp -d); trap 'rm -rf "$work"' EXIT
    plat=(--platform manylinux_2_28_x86_64 --platform manylinux_2_18_x86_64 --platform manylinux_2_17_x86_64
          --platform manylinux2014_x86_64)
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version "$py" --implementation cp "${plat[@]}" \
      -d "$work/wheels" "torch==$torch" "$@"
    mkdir "$work/site"
    for w in "$work"/wheels/*.whl; do (cd "$work/site" && unzip -q -o "$w"); done
    rm -f "$work"/site/torch/bin/protoc*  # protobuf's compiler: no build or check runs it
    # NVSHMEM's device bitcode, static library and headers (~150 MB) are for compiling NVSHMEM device code;
    # torch loads only libnvshmem_host.so (torch 2.15 needs 3.7's: the machine's 3.4.5 lacks
    # nvshmem_selected_device_transport, and `import torch` fails on it).
    rm -rf "$work"/site/nvidia/nvshmem/lib/*.bc "$work"/site/nvidia/nvshmem/lib/*.a "$work"/site/nvidia/nvshmem/include
    mkdir -p "$dir" && rm -f "$dir"/p[0-9][0-9]
    tar -C "$work/site" -cf - . | xz -T0 -6 > "$work/site.tar.xz"
    # A call carries the working tree (~8 MiB of tracked and untracked files) beside one part, 64 MiB in all:
    # 56 MiB parts left under 0.5 MiB to spare (2026-12-02), so 53 unless PART_MIB says otherwise.
    split -b "${PART_MIB:-53}M" -d -a 2 "$work/site.tar.xz" "$dir/p"
    ls "$dir"/p[0-9][0-9] | wc -l | xargs echo "parts:"
    sha256sum "$work/site.tar.xz" | cut -d' ' -f1
    ;;
  venv)
    parts=$2 sha=$3 venv=$4
    cat "$parts"/p[0-9][0-9] > "$parts/site.tar.xz"
    echo "$sha  $parts/site.tar.xz" | sha256sum -c --quiet
    rm -rf "$venv" && python3 -m venv "$venv"
    site=$("$venv/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
    tar -xJf "$parts/site.tar.xz" -C "$site"
    python3 -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])' > "$site/zz_machine.pth"
    "$venv/bin/python" -c 'import torch, setuptools, ninja; print(torch.__version__, torch.version.cuda, torch.cuda.get_device_name())'
    ;;
  *) echo "usage: $0 pack TORCH PYTHON DIR [WHEEL_SPEC...] | venv PARTS SHA256 VENV"; exit 64 ;;
esac
