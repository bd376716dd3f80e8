# block-sparse-attn 0.0.2.post1 for torch 2.8.0 (cu128), Python 3.12, archs 8.0;9.0;12.0
# Made by imagegen 0.1.0: imagegen bake --repo
#   source  https://github.com/mit-han-lab/Block-Sparse-Attention.git @ v0.0.2.post1 (b346156b69dc2f33911ba390d1867ee3de0f5402)
#   base    runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404 (runpod flavor)
#   venv    torch 2.8.0 (cu128) of the base image, reused
#
# Build the builder, then compile into ./out (the GPUs it sees are not needed: it compiles TORCH_CUDA_ARCH_LIST):
#   docker build -t imagegen-block-sparse-attn:0.0.2.post1-torch2.8-cu128-py312 -f Dockerfile .
#   docker run --rm --gpus all -v "$PWD/out:/out" imagegen-block-sparse-attn:0.0.2.post1-torch2.8-cu128-py312
# Or the wheels alone, without a container run:  docker build --target wheels -o out -f Dockerfile .
# Other archs: --build-arg TORCH_CUDA_ARCH_LIST="8.0;9.0+PTX" (or docker run -e TORCH_CUDA_ARCH_LIST=...).
# Behind a TLS-intercepting proxy add --secret id=pip_cert,src=/etc/ssl/certs/ca-certificates.crt (never a layer).

ARG BASE_IMAGE=runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404

# imagegen's build scripts, from ./imagegen-scripts/ (a named context of that name replaces this stage).
FROM scratch AS imagegen-scripts
COPY imagegen-scripts/ /

FROM ${BASE_IMAGE} AS os
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
ENV PYTHONUNBUFFERED=1 PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_INPUT=1 \
    DEBIAN_FRONTEND=noninteractive IMAGEGEN_CELL=/imagegen/cell.json \
    PATH=/opt/imagegen/venv/bin:${PATH}
# OS packages: a compiler, git, ccache and the interpreter's headers (only those the image lacks).
# hadolint ignore=DL3008,SC2016,SC2086
RUN --mount=type=cache,target=/var/cache/apt,sharing=locked --mount=type=cache,target=/var/lib/apt/lists,sharing=locked \
    missing=""; for p in ca-certificates ccache g++ git make python3.12-dev python3.12-venv; do \
        dpkg-query -W -f='${db:Status-Abbrev}' "$p" 2>/dev/null | grep -q '^ii' || missing="$missing $p"; done; \
    if [ -z "$missing" ]; then echo "the OS packages are all there"; \
    elif ! { rm -f /etc/apt/apt.conf.d/docker-clean && apt-get update \
             && apt-get install -y --no-install-recommends $missing; }; then \
        if [ "$missing" = " ccache" ]; then echo "imagegen: warning: ccache cannot be installed: building without it"; \
        else echo "cannot install$missing" >&2; exit 1; fi; \
    fi

# The source at its commit, beside the torch install
# (a source that cannot be fetched fails at once). No hook or config of the tree runs; credentials come only from the netrc secret.
FROM os AS fetch
COPY --from=imagegen-scripts imagegen_*.py /imagegen/
COPY bsa-0_0_2_post1-torch2_8-cu128-py312/ /imagegen/
RUN --mount=type=secret,id=pip_cert --mount=type=secret,id=pip_index_url --mount=type=secret,id=netrc \
    /usr/bin/python3.12 /imagegen/imagegen_build.py fetch --source-only

FROM os AS toolchain
LABEL org.opencontainers.image.title="imagegen builder for block-sparse-attn 0.0.2.post1" \
      org.opencontainers.image.source="https://github.com/mit-han-lab/Block-Sparse-Attention" org.opencontainers.image.version="0.0.2.post1" \
      org.opencontainers.image.revision="b346156b69dc2f33911ba390d1867ee3de0f5402" org.opencontainers.image.base.name="runpod/pytorch:1.0.2-cu1281-torch280-ubuntu2404" \
      io.imagegen.version="0.1.0" io.imagegen.recipe="block-sparse-attn" \
      io.imagegen.torch="2.8.0" io.imagegen.cuda="cu128" \
      io.imagegen.python="3.12" io.imagegen.flavor="runpod"
# torch 2.8.0 (cu128) in the venv /opt/imagegen/venv, asserted: the image's own torch, reused.
# No recipe in this step: every package built for this torch x CUDA x Python on this base shares the layer.
COPY --from=imagegen-scripts imagegen_toolchain.py /imagegen/
COPY <<'IMAGEGEN_TOOLCHAIN_JSON' /imagegen/toolchain.json
{
  "base_python": "/usr/bin/python3.12",
  "cuda_home": null,
  "schema": 1,
  "toolkit": {"kind": "image"},
  "torch": {"cuda": "cu128", "cuda_dotted": "12.8", "index_url": null, "reuse": "image", "version": "2.8.0"},
  "venv": "/opt/imagegen/venv"
}
IMAGEGEN_TOOLCHAIN_JSON

RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=pip_cert --mount=type=secret,id=pip_index_url --mount=type=secret,id=netrc \
    /usr/bin/python3.12 /imagegen/imagegen_toolchain.py --cell /imagegen/toolchain.json
COPY --from=imagegen-scripts imagegen_*.py /imagegen/
COPY bsa-0_0_2_post1-torch2_8-cu128-py312/ /imagegen/
# Build requirements (torch pinned: nothing may move it).
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \
    --mount=type=secret,id=pip_cert --mount=type=secret,id=pip_index_url --mount=type=secret,id=netrc \
    python /imagegen/imagegen_build.py pip install setuptools wheel ninja packaging psutil torch==2.8.0

# The toolchain with the fetched, patched source: every later stage starts here.
FROM toolchain AS base
COPY --from=fetch /imagegen/src /imagegen/src
# The base image goes into each wheel's build record (beside the wheel: `imagegen collect` reads it).
ARG BASE_IMAGE
ENV CCACHE_DIR=/root/.cache/ccache IMAGEGEN_BASE_IMAGE=${BASE_IMAGE} IMAGEGEN_RESUME_DIR=/imagegen/resume

# The gencode audit: the package's own build with stand-in compilers (seconds; `imagegen build` reads it first).
FROM base AS audit
ARG TORCH_CUDA_ARCH_LIST=8.0;9.0;12.0
ARG IMAGEGEN_AUDIT_PROBE=
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} IMAGEGEN_AUDIT_PROBE=${IMAGEGEN_AUDIT_PROBE}
RUN python /imagegen/imagegen_build.py audit --out /imagegen/audit/audit.json
FROM scratch AS audit-report
COPY --from=audit /imagegen/audit/ /

# The compile: the package's own build (pip wheel --no-build-isolation) with its arch knob from TORCH_CUDA_ARCH_LIST.
# MAX_JOBS and NVCC_THREADS empty: sized from this machine's cores and RAM (3.2 GB per nvcc thread here).
FROM base AS compile
ARG TORCH_CUDA_ARCH_LIST=8.0;9.0;12.0
ARG MAX_JOBS=
ARG NVCC_THREADS=
# a budget in seconds: a build still compiling then stops and keeps its state for the next run; the ccache mount's id
ARG IMAGEGEN_BUILD_BUDGET=
ARG IMAGEGEN_CCACHE_ID=imagegen-ccache
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} MAX_JOBS=${MAX_JOBS} NVCC_THREADS=${NVCC_THREADS} \
    IMAGEGEN_BUILD_BUDGET=${IMAGEGEN_BUILD_BUDGET} IMAGEGEN_PLANNED_ARCHS=8.0;9.0;12.0 IMAGEGEN_INPUTS=aee87ab1f1b44d2e
RUN --mount=type=cache,target=/root/.cache/ccache,id=${IMAGEGEN_CCACHE_ID},sharing=shared \
    --mount=type=cache,target=/imagegen/resume,id=imagegen-resume,sharing=shared \
    --mount=type=secret,id=imagegen_ccache_remote --mount=type=secret,id=pip_cert --mount=type=secret,id=imagegen_jobs \
    python /imagegen/imagegen_build.py build --out /imagegen/wheelhouse
LABEL io.imagegen.archs="8.0;9.0;12.0" io.imagegen.inputs="aee87ab1f1b44d2e"

# The wheel installed alone into a fresh copy of base (no source, no build folder) and its modules imported.
FROM base AS smoke
COPY --from=compile /imagegen/wheelhouse/ /imagegen/wheelhouse/
WORKDIR /
RUN python /imagegen/imagegen_build.py smoke --wheels /imagegen/wheelhouse

# A build stopped at its budget, carried from one CI runner to the next (`imagegen ci github` runs these).
FROM os AS resume-in
ARG IMAGEGEN_RESUME_NONCE=
RUN --mount=type=cache,target=/imagegen/resume,id=imagegen-resume,sharing=shared --mount=type=bind,from=resume,target=/imagegen/resume-in \
    cp /imagegen/resume-in/aee87ab1f1b44d2e.tar /imagegen/resume-in/aee87ab1f1b44d2e.tar.json /imagegen/resume/ \
    && echo "the stopped build's state is in the builder (${IMAGEGEN_RESUME_NONCE})"
FROM os AS resume-out
ARG IMAGEGEN_RESUME_NONCE=
RUN --mount=type=cache,target=/imagegen/resume,id=imagegen-resume,sharing=shared mkdir -p /imagegen/resume-out \
    && cp /imagegen/resume/aee87ab1f1b44d2e.tar /imagegen/resume/aee87ab1f1b44d2e.tar.json /imagegen/resume-out/ \
    && echo "the stopped build's state is out of the builder (${IMAGEGEN_RESUME_NONCE})"
FROM scratch AS resume-state
COPY --from=resume-out /imagegen/resume-out/ /

# The build log and the smoke report (--target buildlog).
FROM scratch AS buildlog
COPY --from=compile /imagegen/logs/ /
COPY --from=smoke /imagegen/logs/smoke.json /

# The wheels, once they passed the smoke test, each with its build record (--target wheels -o out).
FROM scratch AS wheels
COPY --from=smoke /imagegen/wheelhouse/ /

# The builder (the default target): `docker run` compiles into /out, as `imagegen push` publishes it.
FROM base AS builder
ARG TORCH_CUDA_ARCH_LIST=8.0;9.0;12.0
ARG MAX_JOBS=
ARG NVCC_THREADS=
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} MAX_JOBS=${MAX_JOBS} NVCC_THREADS=${NVCC_THREADS} \
    IMAGEGEN_PLANNED_ARCHS=8.0;9.0;12.0 IMAGEGEN_INPUTS=aee87ab1f1b44d2e
VOLUME ["/out"]
ENTRYPOINT ["/opt/imagegen/venv/bin/python", "/imagegen/imagegen_build.py"]
CMD ["build", "--out", "/out", "--smoke"]
