"""The container engine: the only module that runs docker, buildx (through python-on-whales where it
serves) and nvidia-smi. One way to call each, one vocabulary for how they fail:

- the docker CLI missing: EngineError(NO_DOCKER);
- a daemon that cannot be reached, or buildx missing: EngineError(no_engine(detail));
- a bake whose targets failed: BakeFailed, with buildx's stderr, for the caller to attribute per cell.
"""

from __future__ import annotations

import functools
import os
import shutil
import subprocess
from pathlib import Path
from typing import Callable, Iterable, Mapping

from imagegen import interrupt
from imagegen.errors import BakeFailed, EngineError

NO_DOCKER = ("the docker CLI is not installed: install Docker with the buildx plugin (sudo imagegen setup engine"
             " does it on Debian and Ubuntu; imagegen doctor says what is missing), or build without Docker: imagegen"
             " build --native")


def no_engine(detail: str) -> str:
    return (f"no usable Docker engine with buildx ({detail.strip()[-200:]}): start the daemon (imagegen doctor"
            " checks it), or build without Docker: imagegen build --native")


def unreachable(text: str) -> bool:
    """``text`` (a docker command's output) says the daemon or buildx is not there."""
    low = text.lower()
    return "cannot connect to the docker daemon" in low or "is not a docker command" in low


# ---------------------------------------------------------------------------------------------
# docker CLI


def docker(*args: str, timeout: float | None = 3600, cwd: Path | None = None, env: Mapping[str, str] | None = None,
           stdout=subprocess.PIPE, require_engine: bool = False) -> subprocess.CompletedProcess:
    """``docker ARGS`` (output captured as text unless ``stdout`` is a file). With ``require_engine``, a
    daemon that cannot be reached raises EngineError instead of returning the failure."""
    try:
        proc = subprocess.run(["docker", *args], stdout=stdout,
                              stderr=subprocess.PIPE if stdout is subprocess.PIPE else subprocess.STDOUT,
                              text=True, timeout=timeout, cwd=cwd, env=dict(env) if env is not None else None)
    except FileNotFoundError:
        raise EngineError(NO_DOCKER) from None
    if require_engine and proc.returncode != 0 and unreachable((proc.stderr or "") + (proc.stdout or "")):
        raise EngineError(no_engine((proc.stderr or proc.stdout or "").strip().splitlines()[-1]))
    return proc


@functools.lru_cache(maxsize=1)
def contexts() -> frozenset[str]:
    """The docker contexts' names, asked once per run (every bake of every batch needs them)."""
    try:
        proc = docker("context", "ls", "--format", "{{.Name}}", timeout=60)
    except (EngineError, subprocess.SubprocessError):
        return frozenset()
    return frozenset(line.strip().rstrip(" *") for line in proc.stdout.splitlines()) if proc.returncode == 0 else frozenset()


def builder_or_context(builder: str | None) -> tuple[str | None, str | None]:
    """(docker context, buildx builder) for a ``--builder`` name. `docker buildx ls` lists every
    docker context as a builder (docker driver), but `buildx bake --builder CONTEXT` only works with
    --print: a build says "use `docker --context=CONTEXT buildx`". So a context name is run that way."""
    if not builder:
        return None, None
    return (builder, None) if builder in contexts() else (None, builder)


def builder_driver(builder: str | None) -> str:
    """The buildx driver of ``builder`` (the current one when None): docker, docker-container, ..."""
    try:
        proc = docker("buildx", "inspect", *([builder] if builder else []), timeout=60)
    except subprocess.SubprocessError:
        raise EngineError("docker buildx is not usable here (imagegen doctor checks it)") from None
    if proc.returncode != 0:
        raise EngineError(f"buildx builder {builder or '(current)'}: {(proc.stderr or proc.stdout).strip().splitlines()[-1:]}")
    return next((line.split(":", 1)[1].strip() for line in proc.stdout.splitlines()
                 if line.strip().startswith("Driver:")), "")


# ---------------------------------------------------------------------------------------------
# bake


def bake_print(file: Path, cwd: Path, targets: Iterable[str] = (), env: Mapping[str, str] | None = None
               ) -> subprocess.CompletedProcess:
    """``docker buildx bake --print`` of ``file`` as buildx resolves it (no daemon needed)."""
    return docker("buildx", "bake", "--print", "-f", str(file), *targets, timeout=120, cwd=cwd, env=env)


def bake(file: Path, targets: list[str], *, on_line: Callable[[str], None], builder: str | None = None,
         variables: Mapping[str, str] | None = None, metadata_file: Path | None = None) -> None:
    """Run one bake of ``targets``, every output line (stdout and stderr, as they come) to ``on_line``.
    A docker context given as ``builder`` runs as `docker --context X buildx bake`. Raises BakeFailed
    when a target failed, EngineError when there is no docker, daemon or buildx to run it."""
    try:
        from python_on_whales import DockerClient
        from python_on_whales.exceptions import DockerException
    except ImportError as exc:  # pragma: no cover - a broken install
        raise EngineError(f"python-on-whales is not importable: {exc}") from None
    context, builder = builder_or_context(builder)
    client = DockerClient(context=context) if context else DockerClient()
    try:
        stream = client.buildx.bake(targets=targets, files=[str(file)], progress="plain",
                                    stream_logs=True, builder=builder, variables=dict(variables or {}),
                                    metadata_file=metadata_file)
        for raw in stream:  # decoded lines, stdout and stderr interleaved
            on_line(raw.rstrip("\n"))
    except DockerException as exc:
        stderr = exc.stderr or ""
        if unreachable(stderr):
            raise EngineError(no_engine(stderr.strip().splitlines()[-1] if stderr.strip() else "docker failed")) from None
        raise BakeFailed(stderr) from None
    except FileNotFoundError:
        raise EngineError(NO_DOCKER) from None
    except Exception as exc:  # python-on-whales raises ClientNotFoundError for a missing binary
        if exc.__class__.__name__ == "ClientNotFoundError":
            raise EngineError(NO_DOCKER) from None
        raise


# ---------------------------------------------------------------------------------------------
# containers


def run_container(args: list[str], log_path: Path) -> subprocess.CompletedProcess:
    """`docker run ARGS` (which must name the container: --name) with its output in ``log_path``; when
    imagegen is stopped meanwhile, the container goes too."""
    name = args[args.index("--name") + 1]
    with interrupt.cleanup(lambda: remove_container(name)):
        with log_path.open("w", encoding="utf-8") as log:
            return docker("run", *args, timeout=None, stdout=log)


def remove_container(name: str) -> None:
    try:
        docker("rm", "-f", name, timeout=60)
    except (EngineError, subprocess.SubprocessError):
        pass


# ---------------------------------------------------------------------------------------------
# GPUs


def nvidia_smi() -> str | None:
    """nvidia-smi's path: on PATH, or where the NVIDIA container runtime mounts it."""
    smi = shutil.which("nvidia-smi")
    if smi:
        return smi
    mounted = "/usr/local/nvidia/bin/nvidia-smi"
    return mounted if os.path.exists(mounted) else None


def gpus() -> tuple[str, ...]:
    """'NAME (X.Y)' for each GPU nvidia-smi sees; empty without a driver."""
    exe = nvidia_smi()
    if not exe:
        return ()
    try:
        out = subprocess.run([exe, "--query-gpu=name,compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=60).stdout
    except (OSError, subprocess.SubprocessError):
        return ()
    return tuple(f"{name.strip()} ({cap.strip()})" for name, cap in
                 (line.rsplit(",", 1) for line in out.strip().splitlines() if "," in line))


def driver_works() -> bool:
    """nvidia-smi is there and lists a GPU (a working driver)."""
    exe = nvidia_smi()
    if not exe:
        return False
    try:
        return subprocess.run([exe, "-L"], capture_output=True, timeout=60).returncode == 0
    except (OSError, subprocess.SubprocessError):
        return False
