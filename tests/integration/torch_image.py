"""The test image whose system Python already has torch 2.11.0 (cu130), the build requirements and the
CUDA 13.0 toolkit from PyPI under /usr/local/cuda, as a user's air-gapped image or runpod's have theirs:
the fallback base image of test_engine_bases.py and the offline base image of test_engine_offline.py.
One image for both (each was its own torch install, minutes on 2 cores): the `torch_image` fixture of
tests/integration/conftest.py, session-scoped; both modules are in one worker group (tests/conftest.py).

Made online from the test base image (Debian's python3.11 with g++, git, make, its -dev and -venv
packages; no ccache), torch and the toolkit installed by a throwaway venv's uv (how the image gets its
torch is not what the tests look at; uv unpacks ~3 GB of wheels in parallel where pip takes minutes) into
/usr/local/lib/python3.11/dist-packages (Debian's python3.11 reads it), and /usr/local/cuda assembled by
the toolchain step's own code (imagegen_toolchain.assemble_cuda_home).

Kept across runs: the torch image proper (several GB) is tagged by a digest of what makes it (this
Dockerfile, imagegen_toolchain.py, the base image's id) and stays in the engine's image store, so a
warm machine does not install it again (the build cache alone did not keep it: scripts/test.sh prunes
the cache to a budget, and this layer, used first in a run, went first); another digest's image is
removed when a new one is made. Each run then tops it with a layer of its own (TORCH_IMAGE, removed
after the session): a build on that runs each step afresh, so its log shows what the toolchain step did."""

from __future__ import annotations

import hashlib
import os
import shutil
import subprocess
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

from imagegen.model import compat

ROOT = Path(__file__).resolve().parents[2]
BASE_IMAGE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
TORCH_REPO = "imagegen-test/python-torch"
TORCH_IMAGE = f"{TORCH_REPO}:3.11-torch2.11.0-cu130"  # this run's, topped by a layer of its own
KEPT_PREFIX = "3.11-torch2.11.0-cu130-kept-"  # the kept image's tag, before its digest
SYSTEM_CA = "/etc/ssl/certs/ca-certificates.crt"


def dockerfile() -> str:
    # The toolkit's parts imagegen's pypi flavor takes, at the release torch's own pins choose (torch 2.11.0
    # pins cuda-toolkit 13.0.2; one resolver run must agree with it).
    toolkit = f"cuda-toolkit[{','.join(compat.cuda_variant('13.0').pypi_extras)}]"
    return f"""\
FROM {BASE_IMAGE}
COPY imagegen_toolchain.py /tmp/
RUN --mount=type=cache,target=/root/.cache/pip,sharing=locked \\
    --mount=type=cache,target=/root/.cache/uv,sharing=locked \\
    --mount=type=secret,id=pip_cert \\
    if [ -s /run/secrets/pip_cert ]; then export PIP_CERT=/run/secrets/pip_cert SSL_CERT_FILE=/run/secrets/pip_cert; fi \\
    && python3 -m venv /tmp/pip-venv \\
    && /tmp/pip-venv/bin/pip install -q uv \\
    && UV_LINK_MODE=copy /tmp/pip-venv/bin/uv pip install -q --python /usr/bin/python3.11 \\
       --target /usr/local/lib/python3.11/dist-packages torch==2.11.0 '{toolkit}' setuptools wheel ninja packaging \\
    && rm -rf /tmp/pip-venv \\
    && cd /tmp && /usr/bin/python3.11 -c "import imagegen_toolchain as t; t.assemble_cuda_home('/usr/bin/python3.11', '/usr/local/cuda')" \\
    && rm /tmp/imagegen_toolchain.py \\
    && python3 -c "import torch; assert torch.__version__.startswith('2.11.0') and torch.version.cuda == '13.0'"
"""


def run_top(kept: str) -> str:
    # A new top layer on every run (a LABEL would not do: BuildKit keys a FROM by its layers).
    return f"FROM {kept}\nRUN echo {uuid.uuid4().hex} > /etc/imagegen-test-run\n"


def sh(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=3600)


@contextmanager
def built_image(tag: str, context: Path, text: str) -> Iterator[str]:
    """``text`` (a Dockerfile) built in ``context`` and loaded as ``tag`` (pip in it trusts this host's CA
    bundle); removed after."""
    context.mkdir(parents=True, exist_ok=True)
    (context / "Dockerfile").write_text(text)
    sh("docker", "image", "rm", tag)  # one a crashed run left: retagging would leave it dangling
    proc = sh("docker", "buildx", "build", "--load", "-t", tag, "--secret", f"id=pip_cert,src={SYSTEM_CA}", str(context))
    assert proc.returncode == 0, proc.stderr[-3000:]
    try:
        yield tag
    finally:
        sh("docker", "image", "rm", tag)


def kept_image(context: Path) -> str:
    """The kept torch image (built in ``context`` when this machine lacks it); stale ones removed."""
    toolchain = ROOT / "imagegen" / "shipped" / "builder" / "imagegen_toolchain.py"
    context.mkdir(parents=True, exist_ok=True)
    shutil.copy(toolchain, context)
    text = dockerfile()
    base_id = sh("docker", "image", "inspect", "--format", "{{.Id}}", BASE_IMAGE).stdout.strip()
    digest = hashlib.sha256(b"\0".join([text.encode(), toolchain.read_bytes(), base_id.encode()])).hexdigest()
    kept = f"{TORCH_REPO}:{KEPT_PREFIX}{digest[:16]}"
    if sh("docker", "image", "inspect", kept).returncode == 0:
        return kept
    listed = sh("docker", "image", "ls", TORCH_REPO, "--format", "{{.Repository}}:{{.Tag}}").stdout.split()
    for stale in listed:
        if stale.startswith(f"{TORCH_REPO}:{KEPT_PREFIX}"):
            sh("docker", "image", "rm", stale)
    (context / "Dockerfile").write_text(text)
    proc = sh("docker", "buildx", "build", "--load", "-t", kept, "--secret", f"id=pip_cert,src={SYSTEM_CA}", str(context))
    assert proc.returncode == 0, proc.stderr[-3000:]
    return kept


@contextmanager
def torch_image(context: Path) -> Iterator[str]:
    """TORCH_IMAGE: the kept torch image topped by this run's own layer, built in ``context`` (an empty
    folder); the top removed afterwards, the kept image left for the next run."""
    kept = kept_image(context / "kept")
    with built_image(TORCH_IMAGE, context / "top", run_top(kept)) as tag:
        yield tag
