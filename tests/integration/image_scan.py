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


def layer_folders(image: str) -> list[tuple[str, Path]] | None:
    """(diff id, folder) of each layer of ``image``, bottom first: with the overlay2 storage driver each
    layer's files are a folder of their own (GraphDriver), the files `docker save` would tar for that
    layer. None on another storage driver."""
    proc = _sh("docker", "image", "inspect", image)
    assert proc.returncode == 0, proc.stderr.decode(errors="replace")
    (info,) = json.loads(proc.stdout)
    driver = info["GraphDriver"]
    if driver.get("Name") != "overlay2":
        return None
    data = driver.get("Data") or {}
    folders = [data["UpperDir"], *(data["LowerDir"].split(":") if data.get("LowerDir") else [])][::-1]
    assert len(folders) == len(info["RootFS"]["Layers"]), (folders, info["RootFS"]["Layers"])
    assert all(Path(f).is_dir() for f in folders), data
    return list(zip(info["RootFS"]["Layers"], map(Path, folders)))


def overlay2_layers() -> set[Path] | None:
    """Every layer folder of the engine's overlay2 store now (images' and BuildKit's snapshots alike: with
    the docker driver, a build's steps are layers there); None on another storage driver."""
    proc = _sh("docker", "info", "--format", "{{.Driver}} {{.DockerRootDir}}")
    driver, _, root = proc.stdout.decode().strip().partition(" ")
    if proc.returncode or driver != "overlay2":
        return None
    return {p for p in (Path(root) / "overlay2").iterdir() if p.name != "l"}


def find_in_layers_made_since(before: set[Path], needles: list[bytes]) -> tuple[set[bytes], int]:
    """The ``needles`` in the files of every overlay2 layer made since ``before`` (overlay2_layers()), and
    how many layers that was: what a build wrote, cached steps and images that existed before left out."""
    now = overlay2_layers() or set()
    made = [p / "diff" for p in sorted(now - before) if (p / "diff").is_dir()]
    return (_grep(made, needles) if made else set()), len(made)


def _grep(dirs: list[Path], needles: list[bytes]) -> set[bytes]:
    args = ["grep", "-r", "-a", "-F", "-o", "-h", "-D", "skip", "--no-messages"]
    for needle in needles:
        args += ["-e", needle.decode()]
    proc = subprocess.run([*args, *map(str, dirs)], capture_output=True, timeout=1800)
    assert proc.returncode in (0, 1), proc.stderr[-2000:]  # 1: nothing found
    return {needle for needle in needles if needle in proc.stdout}


def find_in_chunks(chunks, needles: list[bytes]) -> set[bytes]:
    """The ``needles`` found in a stream of byte chunks (a needle split across two chunks too)."""
    found: set[bytes] = set()
    keep = max(len(n) for n in needles)
    tail = b""
    for chunk in chunks:
        window = tail + chunk
        found |= {n for n in needles if n in window}
        tail = window[-keep:]
    return found


def _stream(cmd: list[str], needles: list[bytes]) -> set[bytes]:
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE)
    assert proc.stdout is not None
    found = find_in_chunks(iter(lambda: proc.stdout.read(1 << 22), b""), needles)
    proc.stdout.close()
    assert proc.wait() == 0
    return found


def find_in_image(image: str, needles: list[bytes]) -> set[bytes]:
    """The ``needles`` found in ``image``'s history, config or any layer's files."""
    history = _sh("docker", "history", "--no-trunc", "--format", "{{.CreatedBy}}", image).stdout
    config = _sh("docker", "image", "inspect", image).stdout
    found = {needle for needle in needles if needle in history or needle in config}
    layers = layer_folders(image)
    if layers is None:
        return found | _stream(["docker", "save", image], needles)
    return found | _grep([folder for _, folder in layers], needles)
