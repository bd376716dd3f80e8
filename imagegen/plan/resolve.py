"""Resolve a cell's installs for its platform and Python before anything builds (`plan --resolve`).

The builder installs torch (from the cell's index), the PyPI CUDA toolkit (pypi flavor) and the
recipe's build requirements (imagegen_toolchain.py / imagegen_build.py). The plan's tables say
whether those exist for the cell; this asks the indexes. uv resolves exactly those requirements for
the cell's platform (``--python-platform``: environment markers are evaluated for the target, which
``pip install --platform`` does not do: on x86_64 it asks for torch's x86_64-only CUDA packages) and
Python, downloading metadata only and building nothing (``--no-build``: a stranger's sdist never
runs on this host). A cell is refused when the resolution fails (a pin with no wheel for that Python
or platform, a toolkit pin that conflicts with torch's own) or when its torch resolves to a CPU-only
build there (torch 2.10 on aarch64 from PyPI).

uv is found on PATH or as the `uv` Python package (``pip install uv``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass, field, replace

from imagegen.errors import UsageError, bounded
from imagegen.model.cell import BUILDABLE, REJECTED, Cell, Plan

# The platform uv resolves for, per cell platform, at the glibc of the cell's base image (a wheel
# tagged for a newer glibc does not install there); base_images.yaml's `glibc` per flavor.
_UV_ARCH = {"linux/amd64": "x86_64", "linux/arm64": "aarch64"}
DEFAULT_GLIBC = "2.28"
RESOLVE_TIMEOUT_S = 300
# A torch wheel is a CUDA build when it depends on NVIDIA's CUDA wheels (PyPI's default variant)
# or carries a CUDA local label (+cu128: the PyTorch index).
_CUDA_DEP = re.compile(r"(nvidia-.*|cuda-toolkit|cuda-bindings|cuda-runtime)")
# uv's words for an index it could not reach (as opposed to an index that answered "no").
_NETWORK = re.compile(r"dns error|failed to lookup address|error sending request|client error \(Connect\)"
                      r"|operation timed out|connection refused|network is unreachable", re.I)
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)(?:\[[^\]]*\])?==(\S+)")


def uv_binary() -> str:
    """uv's executable: on PATH, else the `uv` package's own; a one-line error when neither is there."""
    found = shutil.which("uv")
    if found:
        return found
    try:
        from uv import find_uv_bin  # type: ignore[import-not-found]

        return find_uv_bin()
    except (ImportError, FileNotFoundError):
        raise UsageError("--resolve needs uv, which resolves for another platform than this machine's:"
                         " pip install uv") from None


def python_platform(cell: Cell) -> str:
    """uv's --python-platform for ``cell``: x86_64-manylinux_2_28, aarch64-manylinux_2_35 ..."""
    glibc = DEFAULT_GLIBC
    if cell.base is not None:
        glibc = str(cell.base.flavor.raw.get("glibc") or DEFAULT_GLIBC)
    return f"{_UV_ARCH[cell.platform]}-manylinux_{glibc.replace('.', '_')}"


@dataclass(frozen=True)
class Step:
    """One pip install of the builder: what it names, and the extra index it reads (the torch index)."""

    what: str
    requirements: tuple[str, ...]
    extra_index: str | None = None


def install_steps(cell: Cell) -> list[Step]:
    """The builder's pip installs for ``cell``, one resolution each as the builder runs them one after
    another (imagegen_toolchain.py, imagegen_build.cmd_deps): torch from its index unless the image's
    own is reused; the PyPI CUDA toolkit where the flavor takes it from PyPI (installed over torch's
    own pin of it, same CUDA minor); the recipe's build requirements with torch pinned."""
    steps: list[Step] = []
    if cell.offline:
        return steps  # pip has no index: everything comes from the image (plan.offline_problems)
    if cell.torch_from != "image":
        steps.append(Step("torch", (f"torch=={cell.torch_version}",), cell.torch_index_url))
    if cell.base is not None and cell.base.toolkit == "pypi" and cell.cuda.pypi_toolkit:
        steps.append(Step("the CUDA toolkit", (f"cuda-toolkit[{','.join(cell.cuda.pypi_extras)}]=={cell.cuda.pypi_toolkit}",)))
    if cell.recipe.build_requires:
        steps.append(Step("the build requirements", (*cell.recipe.build_requires, f"torch=={cell.torch_version}"),
                          cell.torch_index_url))
    return steps


@dataclass
class Resolution:
    """What uv resolved for one install step: the pins (name -> version), each pin's dependents, or why
    it failed."""

    platform: str
    pins: dict[str, str] = field(default_factory=dict)
    via: dict[str, set[str]] = field(default_factory=dict)
    error: str | None = None
    # The index could not be reached (a network failure, not an answer): the cell is not judged.
    unreachable: bool = False

    def torch_is_cuda(self) -> bool | None:
        """Whether the resolved torch is a CUDA build (None: torch is not in the resolution)."""
        version = self.pins.get("torch")
        if version is None:
            return None
        if "+cu" in version:
            return True
        return any(_CUDA_DEP.fullmatch(name) and "torch" in parents for name, parents in self.via.items())


def parse_compile_output(text: str, platform: str) -> Resolution:
    """``uv pip compile``'s requirements output (split annotations) as a Resolution."""
    res = Resolution(platform)
    current: str | None = None
    listing = False
    for line in text.splitlines():
        if not line.strip():
            continue
        if not line[0].isspace():
            m = _PIN.match(line.strip())
            current = _normal(m.group(1)) if m else None
            if current is not None and m is not None:
                res.pins[current] = m.group(2)
                res.via.setdefault(current, set())
            listing = False
            continue
        comment = line.strip()
        if current is None or not comment.startswith("#"):
            continue
        body = comment.lstrip("#").strip()
        if body.startswith("via"):
            rest = body[3:].strip()
            listing = not rest
            if rest:
                res.via[current].add(_normal(rest.split()[0]))
        elif listing and body:
            res.via[current].add(_normal(body.split()[0]))
    return res


def _normal(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def resolve(step: Step, platform: str, python: str, *, uv: str | None = None,
            timeout: float = RESOLVE_TIMEOUT_S) -> Resolution:
    """Resolve one install ``step`` with uv for ``platform`` (python_platform's form) and ``python``."""
    uv = uv or uv_binary()
    cmd = [uv, "pip", "compile", "-", "--python-platform", platform, "--python-version", python,
           "--no-header", "--no-build", "--quiet", "--annotation-style", "split",
           # pip merges its indexes and takes the best match (a +cu126 build over PyPI's plain one):
           # uv does so only when told.
           "--index-strategy", "unsafe-best-match"]
    index = os.environ.get("PIP_INDEX_URL")
    if index:
        cmd += ["--index-url", index]
    if step.extra_index:
        cmd += ["--extra-index-url", step.extra_index]
    env = dict(os.environ, UV_PYTHON_DOWNLOADS="never", UV_NO_CONFIG="1")
    if not env.get("SSL_CERT_FILE") and env.get("PIP_CERT"):
        env["SSL_CERT_FILE"] = env["PIP_CERT"]  # a proxy's CA, as pip is given it
    try:
        proc = subprocess.run(cmd, input="\n".join(step.requirements) + "\n", capture_output=True, text=True,
                              timeout=timeout, env=env)
    except subprocess.TimeoutExpired:
        return Resolution(platform, error=f"uv did not resolve within {int(timeout)} s")
    except OSError as exc:
        raise UsageError(f"--resolve: cannot run uv ({uv}): {exc.strerror or exc}") from None
    if proc.returncode != 0:
        text = proc.stderr or proc.stdout
        return Resolution(platform, error=_reason(text), unreachable=bool(_NETWORK.search(text)))
    return parse_compile_output(proc.stdout, platform)


def _reason(text: str) -> str:
    """uv's own words for a failed resolution: its `cause:` (or error) line, one line."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    pick = [line for line in lines if line.startswith(("cause:", "╰─▶", "error:"))]
    hint = [line for line in lines if line.startswith("hint:")]
    why = (pick[-1] if pick else lines[-1] if lines else "no output").removeprefix("cause:").removeprefix("╰─▶")
    why = why.removeprefix("error:").strip()
    if hint and "python abi" in why.lower():
        why += " (" + hint[0].removeprefix("hint:").strip() + ")"
    return bounded(" ".join(why.split()), 400)


def step_problems(cell: Cell, step: Step, res: Resolution) -> list[str]:
    """Why ``cell`` cannot build, by one step's resolution (empty: it resolves, with a CUDA torch)."""
    where = f"{cell.platform} (Python {cell.python}, {res.platform})"
    if res.error and not res.unreachable:
        return [f"--resolve: {step.what} ({' '.join(step.requirements)}) cannot be installed for {where}: {res.error}"]
    if step.what == "torch" and res.torch_is_cuda() is False:
        source = step.extra_index or "PyPI"
        return [f"--resolve: torch {cell.torch_version} from {source} is a CPU-only build for {where}: no CUDA"
                " extension can build against it; use a torch with a CUDA build there"]
    return []


def with_resolution(plan: Plan, *, say=lambda m: print(m, file=sys.stderr, flush=True)) -> Plan:
    """``plan`` with each buildable cell's installs resolved for its platform: a cell whose installs do
    not resolve, or whose torch is CPU-only there, is rejected with uv's reason; an index that cannot
    be reached leaves the cell as it was, with a note saying what was not checked. One uv call per
    distinct install (cells differing only in arch, or sharing a toolkit, share it)."""
    uv = uv_binary()
    done: dict[tuple, Resolution] = {}
    cells = []
    for c in plan.cells:
        if c.status != BUILDABLE:
            cells.append(c)
            continue
        platform = python_platform(c)
        problems: list[str] = []
        unchecked: list[str] = []
        torch = None
        steps = install_steps(c)
        for step in steps:
            key = (step, platform, c.python)
            if key not in done:
                say(f"resolving {' '.join(step.requirements)} for {platform}, Python {c.python}")
                done[key] = resolve(step, platform, c.python, uv=uv)
            res = done[key]
            problems += step_problems(c, step, res)
            if res.unreachable:
                unchecked.append(f"--resolve: {step.what} not checked: an index could not be reached ({res.error})")
            if step.what == "torch":
                torch = res.pins.get("torch")
            if problems:
                break  # the builder stops at the first install that fails; later ones would repeat its reason
        if unchecked:
            notes = tuple(unchecked)
        elif not steps:
            notes = ("--resolve: nothing to resolve: this cell's builder installs nothing from an index",)
        else:
            notes = (f"--resolve: the builder's installs resolve for {platform}"
                     + (f" (torch {torch}, a CUDA build)" if torch else ""),)
        cells.append(replace(c, problems=c.problems + tuple(problems), status=REJECTED if problems else c.status,
                             notes=c.notes if problems else c.notes + notes))
    return Plan(cells=cells)


__all__ = ["Resolution", "Step", "install_steps", "parse_compile_output", "python_platform", "resolve", "step_problems",
           "uv_binary", "with_resolution"]
