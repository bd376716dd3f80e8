"""Windows: the native build as a cmd or PowerShell script (seed 002's one-liner, generated).

The script does what the in-build script does on Linux, with Windows tools: clone the pinned source,
load Visual Studio's x64 environment (vcvarsall), set the recipe's variables (arch knob, force-build,
local version, MAX_JOBS/NVCC_THREADS, DISTUTILS_USE_SDK) with ``set "NAME=value"`` so no trailing
space slips into a value, install the build requirements and run ``pip wheel --no-build-isolation``.
Windows machines are often short of RAM for nvcc, so MAX_JOBS and NVCC_THREADS default to 1 (seed
002's OOM workaround) unless given.
"""

from __future__ import annotations

import re

import jinja2

from imagegen import __version__
from imagegen.errors import UnsafeValueError
from imagegen.model.arch import ArchList
from imagegen.model.arch_format import format_for
from imagegen.model.jobs import split_extensions
from imagegen.model.recipes import Recipe, RecipeVersion

SHELLS = ("cmd", "powershell")
DEFAULT_VCVARS = r"C:\Program Files\Microsoft Visual Studio\2022\Community\VC\Auxiliary\Build\vcvarsall.bat"
# Characters cmd or PowerShell would interpret inside our quoting. PowerShell takes the typographic
# quotes for quotes too: U+2018-U+201B close a single-quoted string like ', U+201C-U+201E a
# double-quoted one like ".
PS_SINGLE_QUOTES = "'\u2018\u2019\u201a\u201b"
PS_DOUBLE_QUOTES = '"\u201c\u201d\u201e'
_CMD_UNSAFE = re.compile(r'["%!^&|<>\r\n\x00]')
_PS_UNSAFE = re.compile(r"[`$\r\n\x00]")
_PS_SINGLE = re.compile(f"([{PS_SINGLE_QUOTES}])")
_PS_ANY_QUOTE = re.compile(f"[{PS_SINGLE_QUOTES}{PS_DOUBLE_QUOTES}]")


def _shown(text: str) -> str:
    return ascii(text[:60])


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


def _psq(value: object) -> str:
    """A PowerShell single-quoted string: every single-quote character (' and its typographic
    forms, which PowerShell treats alike) is doubled, so none can end the string."""
    text = _printable(str(value), "PowerShell script")
    if _PS_UNSAFE.search(text):
        raise UnsafeValueError(f"{_shown(text)} cannot be placed in a PowerShell script ($, backtick or a newline)")
    return "'" + _PS_SINGLE.sub(r"\1\1", text) + "'"


def _env_value(value: str) -> str:
    # Used inside `set "N=V"`, PowerShell single quotes and (vcvars) a PowerShell double-quoted
    # `cmd /c "..."`: none of them may see these.
    if _CMD_UNSAFE.search(value) or _PS_UNSAFE.search(value) or _PS_ANY_QUOTE.search(value):
        raise UnsafeValueError(f"value {_shown(value)} cannot be set in a Windows script (quotes, $, %, ...)")
    return _printable(value, "Windows script")


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
    if knob.style != "fixed" and knob.env:
        env[knob.env] = format_for(archs, knob.style, **({"keep_variant": True} if knob.keep_variant and knob.style == "numeric" else {}))
    if recipe.jobs_env and recipe.jobs_env != "MAX_JOBS":
        env[recipe.jobs_env] = str(max_jobs)
    if recipe.threads_env and recipe.threads_env != "NVCC_THREADS":
        env[recipe.threads_env] = str(nvcc_threads)
    if recipe.local_version_env and local_version:
        env[recipe.local_version_env] = local_version
    return [(k, _env_value(v)) for k, v in env.items()]


def render_script(shell: str, recipe: Recipe, version: RecipeVersion, archs: ArchList, *, src: str, python: str,
                  vcvars: str = DEFAULT_VCVARS, max_jobs: int = 1, nvcc_threads: int = 1,
                  local_version: str | None = None, command: str = "") -> str:
    if shell not in SHELLS:
        raise UnsafeValueError(f"--shell {shell!r}: use cmd or powershell")
    if recipe.source_kind == "sdist":
        raise UnsafeValueError("a Windows script clones the recipe's git source: leave out --fetch sdist")
    if recipe.source_kind != "git":
        raise UnsafeValueError("a Windows script clones a git recipe; for a local project run pip wheel in it directly")
    env = jinja2.Environment(loader=jinja2.PackageLoader("imagegen", "templates"), undefined=jinja2.StrictUndefined,
                             trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True, autoescape=False)
    env.filters["cmdq"] = _cmdq
    env.filters["psq"] = _psq
    for what, value in (("--src-dir", src), ("--python-exe", python), ("--vcvars", vcvars)):
        _printable(value, f"Windows script ({what})")  # each also lands in a comment line
    src_build = src + ("\\" + recipe.subdir.replace("/", "\\") if recipe.subdir else "")
    template = "build.cmd.j2" if shell == "cmd" else "build.ps1.j2"
    if shell == "powershell":
        _env_value(vcvars)  # interpolated inside a cmd /c "..." string
    text = env.get_template(template).render(
        imagegen_version=__version__, command=re.sub(r"[^A-Za-z0-9 ._:/\\=+;,'-]", " ", " ".join(command.split())),
        recipe=recipe, version=version,
        src=src, src_build=src_build, python=python, vcvars=vcvars,
        env=build_env(recipe, version, archs, max_jobs, nvcc_threads, local_version),
        requires=list(recipe.build_requires),
    )
    return text.replace("\n", "\r\n") if shell == "cmd" else text
