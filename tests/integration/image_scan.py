"""Which of some byte strings an image holds anywhere: its history, its config, the files of every layer
(a helper for the engine tests that prove a secret never reached an image, not a test file).

`docker save` would do, but it first writes the whole image (the builder images are ~9 GB: the torch and
CUDA layer) as a tar under the engine's data-root, then streams it: minutes and as much free disk as the
image is big. On the overlay2 storage driver the layers are folders already (`docker image inspect`'s
GraphDriver: the UpperDir of the top layer and the LowerDir chain), so GNU grep reads their files in place:
regular files only (`-D skip`: no FIFO or device is opened; links are not followed), as binary text (`-a`),
fixed strings. Another storage driver falls back to `docker save`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path


def _sh(*cmd: str, timeout: int = 600) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, timeout=timeout)


def _layer_dirs(image: str) -> list[Path] | None:
    proc = _sh("docker", "image", "inspect", "--format", "{{json .GraphDriver}}", image)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    driver = json.loads(proc.stdout)
    if driver.get("Name") != "overlay2":
        return None
    data = driver.get("Data") or {}
    dirs = [data.get("UpperDir") or ""] + (data.get("LowerDir") or "").split(":")
    found = [Path(d) for d in dirs if d]
    assert found and all(d.is_dir() for d in found), data
    return found


def _grep(dirs: list[Path], needles: list[bytes]) -> set[bytes]:
    args = ["grep", "-r", "-a", "-F", "-o", "-h", "-D", "skip", "--no-messages"]
    for needle in needles:
        args += ["-e", needle.decode()]
    proc = subprocess.run([*args, *map(str, dirs)], capture_output=True, timeout=1800)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: nothing found
    return {needle for needle in needles if needle in proc.stdout}


def _stream(cmd: list[str], needles: list[bytes]) -> set[bytes]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    found: set[bytes] = set()
    keep = max(len(n) for n in needles)
    tail = b""
    assert proc.stdout is not None
    for chunk in iter(lambda: proc.stdout.read(1 << 22), b""):
        window = tail + chunk
        found |= {n for n in needles if n in window}
        tail = window[-keep:]
    proc.stdout.close()
    assert proc.wait() == 0
    return found


def find_in_image(image: str, needles: list[bytes]) -> set[bytes]:
    """The ``needles`` found in ``image``'s history, config or any layer's files."""
    history = _sh("docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    config = _sh("docker", "image", "inspect", image).stdout
    found = {needle for needle in needles if needle in history or needle in config}
    dirs = _layer_dirs(image)
    if dirs is None:
        return found | _stream(["docker", "save", image], needles)
    return found | _grep(dirs, needles)
