"""The gencode audit's report and verdict as data: what the in-build script's ``audit`` step
(shipped/builder/imagegen_audit.py) reports per extension (SASS and PTX targets, nvcc flags, the C++
standards its compiles pass, the header probe, the link lookup), read bounded since a stranger's build
wrote it, and the verdict imagegen.model.audit judges from it (refusals, warnings, notes, the table and the
record the manifest and `plan --audit --json` keep)."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Mapping

from imagegen.errors import BuildError
from imagegen.model.arch import CudaArch
from imagegen.model.cxx_std import CxxStd, effective

# Bounds on what a report (written by a stranger's build) may make us hold or print.
_MAX_EXTENSIONS = 500
_MAX_TARGETS = 200
MAX_TEXT = 300

_TARGET = re.compile(r"(sm|compute)_(\d{1,2})(\d)([af]?)")


def parse_target(text: str) -> CudaArch | None:
    """``sm_90a`` -> SASS 9.0a; ``compute_120`` -> PTX 12.0; None for anything else."""
    m = _TARGET.fullmatch(text.strip())
    if not m:
        return None
    try:
        sass = m.group(1) == "sm"
        return CudaArch(int(m.group(2)), int(m.group(3)), m.group(4), sass=sass, ptx=not sass)
    except Exception:  # out of range: not a target nvcc knows either
        return None


def _text(value: Any) -> str:
    return " ".join(str(value).split())[:MAX_TEXT]


def _strs(value: Any, limit: int = _MAX_TARGETS) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(_text(v) for v in value[:limit] if isinstance(v, (str, int, float)))


@dataclass(frozen=True)
class ProbeRun:
    """One header probe of an extension: torch's headers through ``compiler`` with its flags."""

    compiler: str  # g++, nvcc
    tool: str  # cxx, cc, nvcc (the stand-in that recorded the flags)
    what: str  # preprocess, parse
    ok: bool | None  # None: the probe could not run (no compiler, timed out)
    error: str
    seconds: float

    @classmethod
    def from_json(cls, data: Any) -> "ProbeRun | None":
        if not isinstance(data, dict):
            return None
        ok = data.get("ok")
        seconds = data.get("seconds")
        return cls(compiler=_text(data.get("compiler") or data.get("tool") or "?"), tool=_text(data.get("tool") or "?"),
                   what=_text(data.get("what") or "preprocess"), ok=ok if isinstance(ok, bool) else None,
                   error=_text(data.get("error") or ""),
                   seconds=float(seconds) if isinstance(seconds, (int, float)) else 0.0)


@dataclass(frozen=True)
class MissingInclude:
    """An include folder an extension's compiles ask for, inside the package's tree, that is missing or
    empty; ``submodule`` is the .gitmodules path it lies in ("" where it lies in none)."""

    path: str
    state: str  # missing, empty
    submodule: str

    @classmethod
    def from_json(cls, data: Any) -> "MissingInclude | None":
        if not isinstance(data, dict) or not isinstance(data.get("path"), str) or not data["path"]:
            return None
        state = data.get("state") if data.get("state") in ("missing", "empty") else "missing"
        submodule = data.get("submodule") if isinstance(data.get("submodule"), str) else ""
        return cls(path=_text(data["path"]), state=state, submodule=_text(submodule))


def _items(value: Any, parse: Callable[[Any], Any]) -> tuple:
    """The first 20 entries of a report's list that ``parse`` reads (ProbeRun.from_json, ...); () for no list."""
    if not isinstance(value, list):
        return ()
    return tuple(item for item in (parse(v) for v in value[:20]) if item is not None)


@dataclass(frozen=True)
class ExtensionAudit:
    """One extension the build links: its module name and what nvcc was asked to produce for it."""

    module: str
    sass: tuple[str, ...]  # sm_80, sm_90a
    ptx: tuple[str, ...]  # compute_120
    other: tuple[str, ...]  # "default:" (no arch flag: nvcc's own default), "special:native"
    sources: int
    cuda_sources: int
    nvcc_flags: tuple[str, ...]
    # (tool, the arguments that choose the C++ standard) per kind of compile: ("nvcc", ("-std=c++17",)).
    std_args: tuple[tuple[str, tuple[str, ...]], ...] = ()
    # The header probe's runs for its flag sets (() when the probe was off or the report predates it).
    probe: tuple[ProbeRun, ...] = ()
    # The -l libraries its link asks for that the linker would not find (the in-build script's check).
    link_missing: tuple[str, ...] = ()
    # Its include folders inside the tree that are missing or empty (the in-build script's check).
    include_missing: tuple[MissingInclude, ...] = ()

    @property
    def lowest_std(self) -> CxxStd | None:
        """The oldest C++ standard any of its compiles uses (None where none names one)."""
        found = [s for s in (effective(args) for _, args in self.std_args) if s is not None]
        return min(found, key=lambda s: s.year) if found else None

    @property
    def targets(self) -> list[CudaArch]:
        return [t for t in (parse_target(x) for x in (*self.sass, *self.ptx)) if t is not None]

    @property
    def compiles_cuda(self) -> bool:
        return bool(self.sass or self.ptx or self.other)


def _std_args(value: Any) -> tuple[tuple[str, tuple[str, ...]], ...]:
    """The report's ``std_args`` ([{tool, args}, ...]); () from a report written before it had them."""
    if not isinstance(value, list):
        return ()
    out = []
    for item in value[:20]:
        if isinstance(item, dict) and isinstance(item.get("tool"), str):
            out.append((_text(item["tool"]), _strs(item.get("args"), 20)))
    return tuple(out)


def _phases(value: Any) -> dict:
    if not isinstance(value, dict):
        return {}
    return {k: float(value[k]) for k in ("before", "compiles", "after", "records")
            if isinstance(value.get(k), (int, float)) and not isinstance(value.get(k), bool)}


@dataclass(frozen=True)
class AuditReport:
    ok: bool
    exit: int
    seconds: float
    env: Mapping[str, str]
    error_lines: tuple[str, ...]
    extensions: tuple[ExtensionAudit, ...]
    unlinked: int  # nvcc compiles no extension links (a custom build step): their targets are not judged
    probe_mode: str = ""  # on (preprocess), full (parse), off; "" from a report written before the probe
    probe_seconds: float = 0.0
    # Do the package's sources include ATen/cuda/ headers? (None: not known; judged as if they do.)
    probe_aten_cuda: bool | None = None
    # Where the package's own build (with stand-ins) spent its time: before its first compile, over
    # its compiles, after the last; and its number of records ({} from an older report).
    build_phases: Mapping[str, float] = field(default_factory=dict)

    @classmethod
    def from_json(cls, data: Any) -> "AuditReport":
        if not isinstance(data, dict):
            raise BuildError("the audit report is not a JSON object")
        exts = []
        for e in (data.get("extensions") or [])[:_MAX_EXTENSIONS]:
            if not isinstance(e, dict):
                continue
            cuda_sources = e.get("cuda_sources") if isinstance(e.get("cuda_sources"), list) else []
            exts.append(ExtensionAudit(
                module=_text(e.get("module") or "?"),
                sass=_strs(e.get("sass")), ptx=_strs(e.get("ptx")), other=_strs(e.get("other_targets")),
                sources=len(e.get("sources") or []) if isinstance(e.get("sources"), list) else 0,
                cuda_sources=len(cuda_sources),
                nvcc_flags=_strs(e.get("nvcc_flags"), 60),
                std_args=_std_args(e.get("std_args")),
                probe=_items(e.get("probe"), ProbeRun.from_json),
                link_missing=_strs(e.get("link_missing"), 20),
                include_missing=_items(e.get("include_missing"), MissingInclude.from_json),
            ))
        env = data.get("env") if isinstance(data.get("env"), dict) else {}
        probe = data.get("probe") if isinstance(data.get("probe"), dict) else {}
        return cls(
            ok=data.get("ok") is True,
            exit=int(data["exit"]) if isinstance(data.get("exit"), int) else -1,
            seconds=float(data["seconds"]) if isinstance(data.get("seconds"), (int, float)) else 0.0,
            env={_text(k): _text(v) for k, v in list(env.items())[:100]},
            error_lines=_strs(data.get("error_lines"), 12),
            extensions=tuple(exts),
            unlinked=len(data.get("unlinked_cuda_compiles") or []) if isinstance(data.get("unlinked_cuda_compiles"), list) else 0,
            probe_mode=_text(probe.get("mode") or ""),
            probe_seconds=float(probe["seconds"]) if isinstance(probe.get("seconds"), (int, float)) else 0.0,
            probe_aten_cuda=probe["aten_cuda_included"] if isinstance(probe.get("aten_cuda_included"), bool) else None,
            build_phases=_phases(data.get("build")),
        )

    @classmethod
    def load(cls, path: Path) -> "AuditReport":
        try:
            raw = path.read_bytes()[: 64 * 1024 * 1024]
            return cls.from_json(json.loads(raw.decode("utf-8", "replace")))
        except (OSError, ValueError) as exc:
            raise BuildError(f"cannot read the audit report {path}: {exc.__class__.__name__}") from None


@dataclass(frozen=True)
class Verdict:
    """The audit's judgement of one cell: refusals (it cannot build as asked) and warnings."""

    report: AuditReport
    refusals: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()

    @property
    def ok(self) -> bool:
        return not self.refusals

    def rows(self) -> list[tuple[str, str, str, str]]:
        """(extension, SASS, PTX, nvcc flags) per extension: the audit table."""
        out = []
        for e in self.report.extensions:
            sass = " ".join(e.sass) or ("nvcc default" if any(o.startswith("default") for o in e.other) else "-")
            out.append((e.module, sass, " ".join(e.ptx) or "-", " ".join(e.nvcc_flags) or "-"))
        return out

    def table(self) -> str:
        rows = [("extension", "SASS", "PTX", "nvcc flags"), *self.rows()]
        widths = [max(len(r[i]) for r in rows) for i in range(3)]
        lines = []
        for r in rows:
            lines.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
        return "\n".join(lines)

    def findings(self, *, refusals: bool = True) -> list[str]:
        """The judgement as labelled lines ("refused: ...", "warning: ...", "note: ..."), as every
        place that shows a verdict prints them."""
        return ([f"refused: {r}" for r in self.refusals] if refusals else []) \
            + [f"warning: {w}" for w in self.warnings] + [f"note: {n}" for n in self.notes]

    def as_dict(self) -> dict:
        """What the manifest and `plan --audit --json` record."""
        return {
            "verdict": "ok" if self.ok else "refused",
            "refusals": list(self.refusals),
            "warnings": list(self.warnings),
            "notes": list(self.notes),
            "seconds": self.report.seconds,
            **({"probe": {"mode": self.report.probe_mode, "seconds": self.report.probe_seconds}}
               if self.report.probe_mode else {}),
            **({"build": dict(self.report.build_phases)} if self.report.build_phases else {}),
            "build_exit": self.report.exit,
            "env": dict(self.report.env),
            "extensions": [
                {"module": e.module, "sass": list(e.sass), "ptx": list(e.ptx), "other": list(e.other),
                 "sources": e.sources, "cuda_sources": e.cuda_sources, "nvcc_flags": list(e.nvcc_flags),
                 **({"cxx_std": e.lowest_std.flag} if e.lowest_std is not None else {}),
                 **({"probe": [{"compiler": p.compiler, "what": p.what, "ok": p.ok, "error": p.error,
                                "seconds": p.seconds} for p in e.probe]} if e.probe else {}),
                 **({"link_missing": list(e.link_missing)} if e.link_missing else {}),
                 **({"include_missing": [{"path": m.path, "state": m.state, "submodule": m.submodule}
                                         for m in e.include_missing]} if e.include_missing else {})}
                for e in self.report.extensions
            ],
        }


__all__ = ["AuditReport", "ExtensionAudit", "MAX_TEXT", "MissingInclude", "ProbeRun", "Verdict", "parse_target"]
