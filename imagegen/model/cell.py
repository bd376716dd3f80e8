"""A cell and a plan as data: one (recipe version, torch, CUDA variant, Python, arch list, flavor), what
became of it, and the request and plan that hold cells. The plan step (imagegen.plan.matrix) makes and
decides them; every later step reads them.

A cell is ``buildable``, ``rejected`` (with every reason, each naming its fix) or ``skipped`` (buildable but
redundant, e.g. a Python-independent abi3 wheel already built for another Python).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from functools import cached_property
from pathlib import Path
from typing import Callable, Sequence

from packaging.version import Version

from imagegen.model import base_images
from imagegen.model.arch import ArchList
from imagegen.model.cell_rules import FLAGS, FixWords, compiled_targets, expected_archs, smoke_for
from imagegen.model.base_images import BaseImage
from imagegen.model.compat import CudaVariant, TorchSeries
from imagegen.model.layout import DEFAULT_LAYOUT
from imagegen.model.recipes import Recipe, RecipeVersion, SmokeTest


BUILDABLE, REJECTED, SKIPPED = "buildable", "rejected", "skipped"

DEFAULT_PLATFORM = "linux/amd64"
PLATFORMS = ("linux/amd64", "linux/arm64")


@dataclass(frozen=True)
class Cell:
    recipe: Recipe
    version: RecipeVersion
    torch: TorchSeries
    torch_version: str
    cuda: CudaVariant
    python: str
    archs: ArchList  # what the package compiles for the request (compiled_archs)
    # What the user asked for: ``archs`` itself, or the list it became (8.0;8.6;8.9;9.0 -> 8.0;9.0 for
    # flash-attn, whose 8.x GPUs run the sm_80 cubin).
    requested_archs: ArchList
    flavor: str
    base: BaseImage | None
    torch_index_url: str | None
    problems: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    status: str = BUILDABLE
    # The wheelhouse layout (validate_layout): a team's flash-attn matrix keeps its fa<v>/torch<s>/cu<x>/.
    layout: str = DEFAULT_LAYOUT
    # --offline: no build step reaches a network (RUN --network=none, pip without an index); the
    # source, torch, nvcc and the build requirements all come from the machine and the base image.
    offline: bool = False
    # --gpu-check-device: the recipe's smoke.gpu_check runs inside the build, on this CDI device
    # (`RUN --device=...`), and only wheels that pass it are exported; the Dockerfile then names a
    # Dockerfile frontend with `RUN --device` (labs channel, 1.14+).
    gpu_check_device: str | None = None
    dockerfile_frontend: str | None = None
    # The host platform the wheel is for (--platform): linux/amd64, or linux/arm64 (GH200, GB200,
    # DGX Spark, Jetson), built in an arm64 image (natively on an arm64 host, under QEMU elsewhere).
    platform: str = DEFAULT_PLATFORM

    @property
    def buildable(self) -> bool:
        return self.status == BUILDABLE

    @property
    def name(self) -> str:
        """Bake target name: only [a-zA-Z0-9_-] (bake rejects dots)."""
        ver = "".join(c if c.isalnum() else "_" for c in self.version.version)
        short = min((self.recipe.name, *self.recipe.aliases), key=len)  # sage, fa2, bsa, natten
        suffix = "" if self.platform == DEFAULT_PLATFORM else "-" + self.platform.split("/")[-1]
        return (f"{short}-{ver}-torch{self.torch.series.replace('.', '_')}-{self.cuda.name}"
                f"-py{self.python.replace('.', '')}{suffix}")

    @property
    def local_version(self) -> str:
        """PEP 440 local version label added to the wheel: ``cu128torch2.8``."""
        return f"{self.cuda.name}torch{self.torch.series}"

    @property
    def wheel_dir(self) -> str:
        """Where the wheel lands under the output folder: the layout (default <pkg>-<ver>/torch<X.Y>/cu<XYZ>/)."""
        return self.layout.format(package=self.recipe.name, short=min((self.recipe.name, *self.recipe.aliases), key=len),
                                  version=self.version.version, torch=self.torch.series, cuda=self.cuda.name,
                                  python=self.python, py=self.python.replace(".", ""))

    @property
    def nvcc(self) -> Version:
        """The nvcc the build compiles with: the base image's own where it is known, else the CUDA asked for."""
        base = self.base
        return base.nvcc if base is not None and base.nvcc is not None else self.cuda.version

    @cached_property  # mapped once per cell: the audit, verify and the manifest read it
    def expected_archs(self) -> ArchList:
        """What the built .so must carry: the request mapped through the recipe's ``emits``."""
        return expected_archs(self.version, self.archs, self.nvcc)

    @cached_property  # resolved once per cell: every smoke step (the builder's, native, Windows) takes it
    def smoke(self) -> SmokeTest:
        """The recipe's smoke test with only the modules this cell's arch list builds (a routed
        extension the list leaves out, such as SageAttention's _qattn_sm90 for 12.0, is not imported)."""
        return smoke_for(self.version, self.recipe.smoke, self.expected_archs)

    @property
    def gencode_targets(self) -> int:
        """How many -gencode outputs the build compiles: what sizes nvcc's threads and prices the build."""
        return compiled_targets(self.version, self.archs, self.nvcc)

    @property
    def torch_from(self) -> str | None:
        """Where the builder's torch comes from: ``image`` (the base image's own, reused: no download),
        ``venv`` (installed into a venv), ``image-or-venv`` (a custom image whose contents imagegen does
        not know: the build reuses its torch when it is exactly the one asked for), ``host`` (native)."""
        base = self.base
        if base is None:
            return None
        if base.flavor.name == "native":
            return "host"
        if base.image_torch == self.torch_version and base.image_torch_cuda == self.cuda.name:
            return "image"
        if base.custom and base.image_torch is None:
            return "image-or-venv"
        return "venv"

    def torch_from_text(self) -> str:
        """``torch_from`` in words, for the plan and the Dockerfile's header."""
        what = f"torch {self.torch_version} ({self.cuda.name})"
        return {
            "image": f"{what} of the base image, reused",
            "venv": f"{what} into a venv",
            "image-or-venv": f"{what}: the image's own if it has exactly that, else into a venv",
            "host": f"{what} of this host",
        }.get(self.torch_from or "", what)

    def describe(self) -> str:
        asked = self.requested_archs
        archs = f"{asked} (compiled as {self.archs})" if asked != self.archs else str(self.archs)
        return (f"{self.recipe.name} {self.version.version} torch {self.torch_version} {self.cuda.name}"
                f" py{self.python} arch {archs} [{self.flavor}]")


# The base of a Windows cell (WindowsHost.base): a native build whose compiler is MSVC.
WINDOWS_BASE_REF = "windows"


@dataclass(frozen=True)
class HostToolchain:
    """This host's toolchain, as imagegen.executors.host.probe found it: what a native build's cell is
    planned for (imagegen.plan.matrix.preflight)."""

    python_exe: str
    python: str  # "3.12"
    torch: str | None  # "2.11.0"
    torch_cuda: str | None  # "13.0"
    cuda_home: str | None
    nvcc: Version | None
    gpus: tuple[str, ...]  # "NVIDIA H100 80GB HBM3 (9.0)"

    @property
    def ccs(self) -> list[str]:
        """Compute capabilities of the visible GPUs ("9.0"), from their 'NAME (X.Y)' entries."""
        return sorted({m.group(1) for g in self.gpus for m in [re.search(r"\((\d+\.\d+)\)$", g)] if m})

    def describe(self) -> str:
        return (f"Python {self.python}, torch {self.torch or 'missing'} (CUDA {self.torch_cuda or '-'}),"
                f" nvcc {self.nvcc or 'missing'}" + (f", GPUs: {', '.join(self.gpus)}" if self.gpus else ", no GPU"))


@dataclass(frozen=True)
class WindowsHost:
    """Where the cells of a Windows script compile (render --shell, and each job of ci github --windows):
    no image, MSVC as the host compiler, and per CUDA variant a toolkit whose nvcc is ``toolkits[cu128]``
    (a CI job's installer has its own patch releases), else the variant's own toolkit (the script selects
    it through CUDA_PATH_V<major>_<minor>). ``fixes``: how a reason names the flag that changes it. The
    cells are planned by expand and choose_cell as every other cell is: the same policy for an open axis,
    the same rules, the same arch mapping (flash-attn's 8.6 runs the sm_80 cubin)."""

    toolkits: tuple[tuple[str, str], ...] = ()  # (cu128, "12.8.1"), ...
    fixes: FixWords = FLAGS

    def base(self, cuda: CudaVariant, python: str) -> BaseImage:
        nvcc = dict(self.toolkits).get(cuda.name) or str(cuda.version)
        return BaseImage(ref=WINDOWS_BASE_REF, flavor=base_images.flavor("native"), python=f"py -{python}", toolkit="host",
                         nvcc=Version(nvcc), image_torch_cuda=None)



@dataclass(frozen=True)
class MatrixRequest:
    recipes: Sequence[tuple[Recipe, RecipeVersion]]
    # The values given per axis (flags, else the config's matrix); empty: filled by the default policy.
    torch: Sequence[str]
    cuda: Sequence[str]
    python: Sequence[str]
    archs: Sequence[ArchList]
    flavor: str
    base_image: str | dict[str, str] | None = None  # per CUDA variant: {"cu128": IMAGE, "*": IMAGE}
    torch_index_override: str | None = None
    # False: nobody named the flavor, so a cell the default flavor cannot build may use a fallback one.
    flavor_given: bool = True
    # A Windows script's cells (render --shell, ci github --windows): compiled on that host, no image.
    windows: WindowsHost | None = None
    # The --platform values: a fallback flavor must build on each of them.
    platforms: Sequence[str] = ()


@dataclass
class Plan:
    cells: list[Cell] = field(default_factory=list)

    def each(self, change: Callable[[Cell], Cell]) -> "Plan":
        """The plan with ``change`` (a per-cell transform, Cell -> Cell) applied to every cell."""
        return replace(self, cells=[change(c) for c in self.cells])

    @property
    def buildable(self) -> list[Cell]:
        return [c for c in self.cells if c.status == BUILDABLE]

    @property
    def rejected(self) -> list[Cell]:
        return [c for c in self.cells if c.status == REJECTED]

    @property
    def skipped(self) -> list[Cell]:
        return [c for c in self.cells if c.status == SKIPPED]



@dataclass
class CellResult:
    """What became of one cell, whichever way it was built (bake, a prebuilt image, native)."""

    cell: Cell
    status: str  # built | up-to-date | failed | refused (nothing built or placed, nothing replaced: RefusedError)
    wheel: Path | None = None
    log: Path | None = None
    seconds: float = 0.0
    error: str = ""
    log_tail: list[str] = field(default_factory=list)
    verify: dict | None = None
    smoke: dict | None = None
    ccache: dict | None = None  # {"hits", "misses", "hit_rate"} of the compile step
    audit: dict | None = None  # the gencode audit's verdict and table (imagegen.model.audit_report.Verdict.as_dict)

    def as_dict(self) -> dict:
        return {"cell": self.cell.name, "status": self.status, "wheel": str(self.wheel) if self.wheel else None,
                "log": str(self.log) if self.log else None, "seconds": round(self.seconds, 1), "error": self.error,
                "verify": self.verify, "smoke": self.smoke, "ccache": self.ccache, "audit": self.audit}


# A built cell's next step (imagegen.finish.finisher.finish's signature): staged wheels in, a CellResult out.
# The command hands it to whichever executor builds (they never import the finish step).
Finisher = Callable[..., CellResult]
