"""Which of some byte strings an image holds anywhere: its history, its config, the files of every layer
(a helper for the engine tests that prove a secret never reached an image, not a test file).

`docker save` would do, but it first writes the whole image (the builder images are ~9 GB: the torch and
CUDA layer) as a tar under the engine's data-root, then streams it: minutes and as much free disk as the
image is big. On the overlay2 storage driver the layers are folders already (`docker image inspect`'s
GraphDriver: the UpperDir of the top layer and the LowerDir chain), so GNU grep reads their files in place:
regular files only (`-D skip`: no FIFO or device is opened; links are not followed), as binary text (`-a`),
fixed strings. Another storage driver falls back to `docker save`. Other builds on the engine change its
layers meanwhile (a test worker's build, a prune): a file or layer that vanishes mid-scan is scanned again
or dropped, never a silent pass and never a hidden grep error (`_grep`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
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
    how many layers were scanned: what a build wrote, cached steps and images that existed before left
    out. Other builds on the engine (another test worker's) add and remove layers meanwhile: one that
    vanished before or during the scan is not counted (the build under test's own stay: its steps'
    snapshots are kept until pruned)."""
    now = overlay2_layers() or set()
    made = [p / "diff" for p in sorted(now - before) if (p / "diff").is_dir()]
    if not made:
        return set(), 0
    found, vanished = _grep(made, needles)
    return found, len(made) - len(vanished)


GREP = "grep"
_VANISHED = re.compile(r"^grep: (.+): No such file or directory$")


def _grep(dirs: list[Path], needles: list[bytes], attempts: int = 8) -> tuple[set[bytes], set[Path]]:
    """The ``needles`` found in the files under ``dirs`` and the ``dirs`` that vanished meanwhile.

    GNU grep over folders the engine may change under it (another build's layers): grep's exit 2 with
    only "No such file or directory" lines, each for a path that is gone now, is a file or layer that
    vanished mid-scan: the folders that held them are scanned again (a folder gone whole is dropped),
    up to ``attempts`` times, waiting longer each time (0.2 s, doubling: a removal under way ends). Any
    other error fails with grep's own lines (never hidden)."""
    found: set[bytes] = set()
    vanished: set[Path] = set()
    todo = list(dirs)
    for attempt in range(attempts):
        if attempt:
            time.sleep(0.2 * 2 ** (attempt - 1))
        gone = {d for d in todo if not d.is_dir()}
        vanished |= gone
        todo = [d for d in todo if d not in gone]
        if not todo:
            return found, vanished
        args = [GREP, "-r", "-a", "-F", "-o", "-h", "-D", "skip"]
        for needle in needles:
            args += ["-e", needle.decode()]
        proc = subprocess.run([*args, "--", *map(str, todo)], capture_output=True, timeout=1800)
        found |= {needle for needle in needles if needle in proc.stdout}
        if proc.returncode in (0, 1):  # 1: nothing found
            return found, vanished
        lines = proc.stderr.decode(errors="replace").splitlines()
        missing = [m.group(1) for m in map(_VANISHED.match, lines) if m]
        assert proc.returncode == 2 and lines and len(missing) == len(lines) and not any(
            os.path.lexists(p) for p in missing), (proc.returncode, proc.stderr[-2000:])
        todo = [d for d in todo if any(p == str(d) or p.startswith(str(d) + "/") for p in missing)]
    raise AssertionError(f"the layers kept changing under the scan ({attempts} attempts): {proc.stderr[-2000:]!r}")


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
    found_in_layers, vanished = _grep([folder for _, folder in layers], needles)
    assert not vanished, f"layers of {image} vanished while it was scanned: {sorted(map(str, vanished))}"
    return found | found_in_layers
