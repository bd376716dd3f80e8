"""Windows: the native build of one or many cells as a cmd or PowerShell script (a team's flash-attn matrix, a Windows user's builds; generated).

The cells come from the planner (imagegen.plan.matrix.windows_plan: expand on a WindowsHost, with the cell's CUDA
toolkit as nvcc), so a cell the plan rejects (nvcc 12.6 cannot build sm_120, a torch/CUDA pair torch never
shipped) is refused with the plan's reason, and an arch the package runs from another cubin (flash-attn's
8.6 on sm_80) is mapped as on Linux. One script builds every cell in turn and goes on past a failed one; it
exits non-zero at the end when any failed, and keeps the wheels of those that built.

Per cell the script selects the CUDA toolkit through ``CUDA_PATH_V<major>_<minor>`` (what NVIDIA's
installer sets; a team's flash-attn matrix picks toolkits the same way), makes a venv with ``py -X.Y`` and installs the
cell's torch from its index (or uses ``--python-exe`` as it is: its torch is checked, never replaced,
unless ``--install-torch``), installs the recipe's build requirements, loads Visual Studio's x64 environment (vcvarsall, unless already loaded), sets the recipe's
variables with ``set "NAME=value"`` (no trailing space can slip into a value) and runs ``pip wheel
--no-build-isolation``. A folder given as ``--src-dir`` is the user's and is never patched: a local tree
(a fork, local fixes; refs.at_tree) as it is, a checkout at the pin fetched into when missing; each cell
builds a copy of it, patched as the Linux build patches its copy, so the checkout stays at the pin and a
later render sees it there. The script's own clone (no ``--src-dir``) is patched where it lies.
What needs real work (the torch/nvcc check, the pinned source and the recipe's
patches, the local version, the cuobjdump arch check, the import test in a fresh venv, the atomic move
into the wheelhouse) is shipped/windows/imagegen_windows.py, a stdlib-only helper embedded in the
script with the modules it imports (HELPER_MODULES: its own, and the Linux build's imagegen_wheeltools.py
and imagegen_records.py, so that both builds patch, retag and record a wheel one way) and run with the
cell's Python, so that it is tested on any OS. Every native command's exit code is checked, in both
shells. Windows machines are often short of RAM for nvcc, so MAX_JOBS and NVCC_THREADS default to 1
(a Windows user's OOM workaround) unless given.
"""

from __future__ import annotations

import base64
import json
import re
from importlib import resources

from imagegen import __version__
from imagegen.plan.config import DEFAULT_OUT
from imagegen.errors import CompatError, UnsafeValueError, UsageError, printable
from imagegen.model import compat
from imagegen.model.arch import ArchList
from imagegen.model.arch_format import format_for
from imagegen.model.jobs import split_extensions
from imagegen.model.recipes import Recipe, RecipeVersion
from imagegen.model.cell import Cell
from imagegen.render import templating
from imagegen.render.dockerfile import source_document

SHELLS = ("cmd", "powershell")
DEFAULT_VCVARS = r"C:\Program Files\Microsoft Visual Studio\2022\Community\VC\Auxiliary\Build\vcvarsall.bat"
DEFAULT_WORK = "imagegen-windows"  # venvs, the build folders, the helper: beside where the script runs
HELPER = "imagegen_windows.py"
# The modules the helper imports, written beside it: its own (shipped/windows) and those it shares with the
# Linux build and imagegen verify (shipped/builder, which the Dockerfile carries too: dockerfile.BUILDER_FILES).
HELPER_MODULES = (("windows", "imagegen_windows_host.py"), ("windows", "imagegen_windows_archs.py"),
                  ("builder", "imagegen_wheeltools.py"), ("builder", "imagegen_records.py"),
                  ("builder", "imagegen_sdist.py"))
# Characters cmd or PowerShell would interpret inside our quoting. PowerShell takes the typographic
# quotes for quotes too: U+2018-U+201B close a single-quoted string like ', U+201C-U+201E a
# double-quoted one like ".
PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
PS_DOUBLE_QUOTES = '"\u201c\u201d\u201e'
_CMD_UNSAFE = re.compile(r'["%!^&|<>\r\n\x00]')
_PS_UNSAFE = re.compile(r"[`$\r\n\x00]")
_PS_SINGLE = re.compile(f"([{PS_SINGLE_QUOTES}])")
_PS_ANY_QUOTE = re.compile(f"[{PS_SINGLE_QUOTES}{PS_DOUBLE_QUOTES}]")
# A pip requirement inside double quotes in cmd: < and > are literal there (no redirection), so a
# version range is allowed; nothing that cmd expands inside quotes (%, !, ^, ") is.
_REQUIREMENT = re.compile(r"[A-Za-z0-9][A-Za-z0-9._\-\[\],<>=~ ]{0,199}")
B64_LINE = 76  # characters per echoed base64 line in cmd (far below its 8191-character line limit)


def _shown(text: str) -> str:
    return ascii(text[:60])


# What cmd acts on even in a `rem` line (% expands, ^ at the end joins the next line, ! with delayed
# expansion) or could read as a redirection or the end of a string: escaped in the comment line.
_COMMENT_INERT = frozenset('%!^&|<>"`')


def comment_line(command: str) -> str:
    """``command`` for the scripts' "Re-render with" comment (a cmd `rem` line, a PowerShell `#` line),
    readable as typed: letters of any script stay (café, 日本); a control, format or line-separator
    character, and what cmd acts on even in a comment (_COMMENT_INERT), is written as an escape
    (\\x25, \\u2028), so the line stays one inert line."""
    return "".join(f"\\x{ord(c):02x}" if c in _COMMENT_INERT else c for c in printable(command))


def _printable(text: str, where: str) -> str:
    # A line break of any kind (or another control character) would end the line it is on.
    if not all(c.isprintable() for c in text):
        raise UnsafeValueError(f"{_shown(text)} cannot be placed in a {where} (control character or line break)")
    return text


def _cmdq(value: object) -> str:
    text = _printable(str(value), "cmd script")
    if _CMD_UNSAFE.search(text):
        raise UnsafeValueError(f"{_shown(text)} cannot be placed in a cmd script (quotes, %, !, ^, &, |, <, >)")
    return f'"{text}"'


def _cmd_requirement(value: object) -> str:
    text = _printable(str(value), "cmd script")
    if not _REQUIREMENT.fullmatch(text):
        raise UnsafeValueError(f"build requirement {_shown(text)} cannot be placed in a cmd script")
    return f'"{text}"'


def _psq(value: object) -> str:
    """A PowerShell single-quoted string: every single-quote character (' and its typographic
    forms, which PowerShell treats alike) is doubled, so none can end the string."""
    text = _printable(str(value), "PowerShell script")
    if _PS_UNSAFE.search(text):
        raise UnsafeValueError(f"{_shown(text)} cannot be placed in a PowerShell script ($, backtick or a newline)")
    return "'" + _PS_SINGLE.sub(r"\1\1", text) + "'"


def validate_value(shell: str, value: str) -> str:
    """``value`` as the ``shell`` script would quote it (UnsafeValueError, one line, where it cannot be): checked
    before anything uses it (render --shell runs --python-exe's interpreter to read its torch)."""
    return _psq(value) if shell == "powershell" else _cmdq(value)


def _env_value(value: str) -> str:
    # Used inside `set "N=V"`, PowerShell single quotes and (vcvars) a PowerShell double-quoted
    # `cmd /c "..."`: none of them may see these.
    if _CMD_UNSAFE.search(value) or _PS_UNSAFE.search(value) or _PS_ANY_QUOTE.search(value):
        raise UnsafeValueError(f"value {_shown(value)} cannot be set in a Windows script (quotes, $, %, ...)")
    return _printable(value, "Windows script")


def _here_string(text: str, what: str) -> str:
    """``text`` for a PowerShell single-quoted here-string (@'...'@): taken verbatim, ended only by a
    line that starts with '@, which ``text`` must not have."""
    if any(line.lstrip().startswith(("'@", "\u2018@", "\u2019@", "\u201a@", "\u201b@")) for line in text.splitlines()):
        raise UnsafeValueError(f"{what} has a line starting with '@, which would end a PowerShell here-string")
    if not text.isascii():
        raise UnsafeValueError(f"{what} is not ASCII")
    return text


def build_env(recipe: Recipe, version: RecipeVersion, archs: ArchList, max_jobs: int, nvcc_threads: int,
              local_version: str | None) -> list[tuple[str, str]]:
    env: dict[str, str] = {"MAX_JOBS": str(max_jobs), "NVCC_THREADS": str(nvcc_threads), "DISTUTILS_USE_SDK": "1"}
    ext_env, ext_max = recipe.ext_parallel_for(version)
    if ext_env:
        parallel, max_jobs = split_extensions(max_jobs, ext_max)
        env.update({ext_env: str(parallel), "MAX_JOBS": str(max_jobs)})
    env.update(recipe.env)
    env.update(version.env)
    env.update(recipe.force_env)
    knob = version.arch
    if knob.style != "fixed":
        env["TORCH_CUDA_ARCH_LIST"] = str(archs)  # as on Linux: torch's own default (the visible GPUs) never applies
    if knob.style != "fixed" and knob.env:
        env[knob.env] = format_for(archs, knob.style, **({"keep_variant": True} if knob.keep_variant and knob.style == "numeric" else {}))
    if recipe.jobs_env and recipe.jobs_env != "MAX_JOBS":
        env[recipe.jobs_env] = str(max_jobs)
    if recipe.threads_env and recipe.threads_env != "NVCC_THREADS":
        env[recipe.threads_env] = str(nvcc_threads)
    if recipe.local_version_env and local_version:
        env[recipe.local_version_env] = local_version
    return [(k, _env_value(v)) for k, v in env.items()]


# --------------------------------------------------------------------------------------------
# The cells (planned by imagegen.plan.matrix.windows_plan, as every other cell)


def torch_index(cell: Cell, override: str | None = None) -> str:
    """Where the cell's torch comes from on Windows: PyPI's torch wheels for Windows are CPU-only, so
    a cell the plan would take from PyPI (its series' default CUDA) takes the PyTorch index of its
    CUDA variant, as every other variant does."""
    return compat.torch_index_url(cell.torch, cell.cuda, override) or f"https://download.pytorch.org/whl/{cell.cuda.name}"


def cuda_path_var(cell: Cell) -> str:
    """The variable NVIDIA's Windows installer sets to a toolkit's folder: CUDA_PATH_V12_8."""
    return f"CUDA_PATH_V{cell.cuda.major}_{cell.cuda.minor}"


# --------------------------------------------------------------------------------------------
# The build document the helper reads


def _shipped(folder: str, name: str) -> str:
    return (resources.files("imagegen") / "shipped" / folder / name).read_text(encoding="utf-8")


def helper_script() -> str:
    return _shipped("windows", HELPER)


def helper_modules() -> dict[str, str]:
    """The text of each module the helper imports, by file name, in the order the scripts write them."""
    return {name: _shipped(folder, name) for folder, name in HELPER_MODULES}


def _expected(archs: ArchList) -> list[dict]:
    return [{"cc": a.cc, "sass": a.sm if a.sass else None, "ptx": a.compute if a.ptx else None} for a in archs]


def build_document(recipe: Recipe, version: RecipeVersion, cells: list[Cell], index_override: str | None = None) -> dict:
    """What imagegen_windows.py needs to know: the source and the patches and, per cell, the torch, the
    toolkit, the local version, the wheelhouse folder, the archs to verify and the modules to import."""
    return {
        "schema": 1,
        "kind": "imagegen-windows-build",
        "imagegen": __version__,
        "recipe": recipe.name,
        "distribution": recipe.distribution,
        "version": version.version,
        "source": source_document(recipe, version),
        "patches": [{"name": p.name, "reason": p.reason, "text": p.text} for p in version.patches],
        "extension_archs": {module: sorted({a.cc for a in archs}) for module, archs in version.extensions.items()},
        "cells": [{
            "name": c.name, "torch": c.torch_version, "torch_series": c.torch.series, "cuda": c.cuda.name,
            "cuda_dotted": c.cuda.dotted, "toolkit": str(c.cuda.version), "cuda_path_var": cuda_path_var(c),
            "python": c.python, "torch_index_url": torch_index(c, index_override), "local_version": c.local_version,
            "wheel_dir": c.wheel_dir, "archs": str(c.archs), "expected": _expected(c.expected_archs),
            # the modules this cell's list builds (Cell.smoke: a routed extension it leaves out is not imported)
            "smoke_imports": list(c.smoke.imports), "smoke_driver_imports": list(c.smoke.driver_imports),
        } for c in cells],
    }


def _patched_alike(recipe: Recipe, version: RecipeVersion, cells: list[Cell]) -> RecipeVersion:
    """The version as ``cells`` build it (each cell's torch picks the recipe's by_torch patches). One
    script fetches and patches one source tree for all its cells, so they must need the same patches."""
    sets: dict[tuple[str, ...], list[Cell]] = {}
    for c in cells:
        sets.setdefault(tuple(p.name for p in c.version.patches), []).append(c)
    if len(sets) > 1:
        common = set.intersection(*(set(names) for names in sets))
        shown = "; ".join(f"torch {','.join(sorted({c.torch.series for c in group}, key=compat.major_minor))}:"
                          f" {', '.join(n for n in names if n not in common) or 'none'}" for names, group in sets.items())
        raise UsageError(f"{recipe.name} {version.version}: the cells need different recipe patches ({shown}) and one"
                         " script patches one source tree: render one script per group of --torch values")
    return cells[0].version if cells else version


def _base64_lines(text: str) -> list[str]:
    data = base64.b64encode(text.encode("ascii")).decode("ascii")
    return [data[i:i + B64_LINE] for i in range(0, len(data), B64_LINE)]


# --------------------------------------------------------------------------------------------
# The script


def render_script(shell: str, recipe: Recipe, version: RecipeVersion, cells: list[Cell], *, src: str,
                  src_given: bool = False, python_exe: str | None = None, install_torch: bool = False,
                  vcvars: str = DEFAULT_VCVARS, max_jobs: int = 1, nvcc_threads: int = 1, out: str = DEFAULT_OUT, command: str = "",
                  index_override: str | None = None) -> str:
    """The script that builds ``cells`` (buildable cells of ``recipe`` ``version``) in turn; ``src_given``:
    ``src`` is the user's folder (--src-dir), which the cells build a copy of."""
    if shell not in SHELLS:
        raise UnsafeValueError(f"--shell {shell!r}: use cmd or powershell")
    if recipe.source_kind not in ("git", "sdist", "local"):
        raise UnsafeValueError("a Windows script builds a git or sdist source or a local tree,"
                               f" not a {recipe.source_kind} source")
    if not cells:
        raise CompatError(f"no cell of {recipe.name} {version.version} to build")
    if python_exe is not None and len(cells) > 1:
        raise UnsafeValueError("--python-exe builds with that interpreter's torch as it is: one cell only (leave it"
                               " out to get a venv per cell)")
    env = templating.environment(filters={
        "cmdq": _cmdq, "psq": _psq, "cmdreq": _cmd_requirement,
        "cmdv": lambda value: _cmdq(value)[1:-1],  # a value inside set "NAME=...": checked, unquoted
    })
    for what, value in (("--src-dir", src), ("--python-exe", python_exe or ""), ("--vcvars", vcvars), ("--out", out)):
        _printable(value, f"Windows script ({what})")  # each also lands in a comment line
    version = _patched_alike(recipe, version, cells)
    doc = build_document(recipe, version, cells, index_override)
    doc_text = json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=True) + "\n"
    helper = helper_script()
    modules = helper_modules()
    template = "build.cmd.j2" if shell == "cmd" else "build.ps1.j2"
    if shell == "powershell":
        _env_value(vcvars)  # interpolated inside a cmd /c "..." string
        for name, module in {HELPER: helper, **modules}.items():
            _here_string(module, name)
        _here_string(doc_text, "the build document")
    subdir = recipe.subdir.replace("/", "\\") if recipe.subdir else ""
    text = env.get_template(template).render(
        imagegen_version=__version__, command=comment_line(command),
        recipe=recipe, version=version, src=src, subdir=subdir, python_exe=python_exe or "", vcvars=vcvars, out=out,
        python_exe_is_path=bool(python_exe and re.search(r"[\\/]", python_exe)),
        # never a torch into the user's interpreter unless asked (--install-torch): it is checked instead
        install_torch=bool(python_exe is None or install_torch), local=recipe.source_kind == "local",
        build_copy=src_given or recipe.source_kind == "local",
        work=DEFAULT_WORK, helper_name=HELPER,
        requires=list(recipe.build_requires),
        cells=[{"cell": c, "name": c.name, "torch": c.torch_version, "cuda": c.cuda.name, "toolkit": str(c.cuda.version),
                "cuda_path_var": cuda_path_var(c), "python": c.python, "index_url": torch_index(c, index_override),
                "local_version": c.local_version, "archs": str(c.archs), "wheel_dir": c.wheel_dir.replace("/", "\\"),
                "env": build_env(recipe, c.version, c.archs, max_jobs, nvcc_threads, c.local_version)} for c in cells],
        toolkits=sorted({str(c.cuda.version) for c in cells}, key=lambda v: tuple(map(int, v.split(".")))),
        pythons=sorted({c.python for c in cells}, key=lambda v: tuple(map(int, v.split(".")))),
        helper=helper, helper_b64=_base64_lines(helper),
        modules=[{"name": name, "text": text, "b64": _base64_lines(text)} for name, text in modules.items()],
        doc=doc_text, doc_b64=_base64_lines(doc_text),
    )
    return text.replace("\n", "\r\n") if shell == "cmd" else text
