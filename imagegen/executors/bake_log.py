"""Reading buildx bake's plain progress: each line to the log of the cell (target) it belongs to, one
console line per step, and a compiling cell's progress at most every PROGRESS_EVERY_S."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import TYPE_CHECKING, Callable, Iterable

if TYPE_CHECKING:
    pass


# "#12 [sage-2_2_0-torch2_8-cu128-py312 builder 8/8] RUN ..." names the target of vertex 12.
LOG_SUFFIX = "--log"  # the companion target exporting a cell's build log and reports


AUDIT_SUFFIX = "--audit"  # the companion target exporting a cell's gencode audit report


_HEADER = re.compile(r"^#(\d+) \[([A-Za-z0-9_-]+) ([A-Za-z0-9_-]+ )?(\d+/\d+)?\]? ?(.*)$")


_VERTEX = re.compile(r"^#(\d+) ")


_VERTEX_ERROR = re.compile(r"^#\d+ ERROR: ")


TARGET_FAILED = re.compile(r"target ([A-Za-z0-9_-]+): failed to solve")


def cell_of(target: str) -> str:
    """The cell a bake target belongs to (its companion log and audit targets included)."""
    for suffix in (LOG_SUFFIX, AUDIT_SUFFIX):
        if target.endswith(suffix):
            return target[: -len(suffix)]
    return target


_OUTPUT = re.compile(r"^#(\d+) \d+\.\d+ (.*)$")  # "#12 61.30 text": a vertex's output line


_DONE = re.compile(r"^#(\d+) DONE (\d+(?:\.\d+)?)s")


# A log line that says why a build failed.
ERROR_LINE = re.compile(r"\berror\b|\bfatal\b|Killed|out of memory", re.IGNORECASE)
COMPILE_STEP = "imagegen_build.py build"  # the RUN of the compile stage


PROGRESS_EVERY_S = 45.0  # a compiling cell's console line at most this often


def _minutes(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 60}m{seconds % 60:02d}s"


class TargetLogs:
    """Splits bake's plain progress into one log per target (vertices are named in their header).

    The logs are line-buffered: each grows while its target builds. With ``say``, the console also
    gets per-cell progress of the compile step: when it starts, a line at most every
    PROGRESS_EVERY_S seconds with the time so far and the last compiler line (the in-build script
    reports each finished nvcc and a heartbeat, so a long compile is never silent), and when it is
    done or failed (with the compiler's first error)."""

    def __init__(self, folder: Path, targets: Iterable[str], say: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        cells = [t for t in targets if cell_of(t) == t]
        self.targets = set(cells) | {t + suffix for t in cells for suffix in (LOG_SUFFIX, AUDIT_SUFFIX)}
        self.owner: dict[str, str] = {}
        self.files = {t: (folder / f"{t}.log").open("a", encoding="utf-8", buffering=1) for t in cells}
        self.failed: set[str] = set()
        self.last: dict[str, str] = {}
        self.bake_error = ""  # bake's own last ERROR line (a bad definition fails before any target runs)
        self.errors: dict[str, str] = {}  # target -> the in-build script's first "[imagegen] error: ..." text
        self.say = say
        self.clock = clock
        self.compiling: dict[str, list] = {}  # vertex -> [target, started, last line, last said, announced]
        self.sole: str | None = None  # the cell of the one target a bake runs (its lines name no target)

    def feed(self, line: str) -> tuple[str, str] | None:
        """Record one line; return (target, step) when a target starts a new step."""
        m = TARGET_FAILED.search(line)
        if m and m.group(1) in self.targets:
            self.failed.add(cell_of(m.group(1)))
        h = _HEADER.match(line)
        if h and (h.group(2) in self.targets or (self.sole and h.group(4))):
            if h.group(2) in self.targets:
                # A cell's companion log and audit targets share its vertices: one log per cell.
                target, stage = cell_of(h.group(2)), (h.group(3) or "").strip()
            else:  # "#11 [base 6/6] RUN ...": bake names a vertex's target only when it runs several
                target, stage = self.sole, h.group(2)
            self.owner[h.group(1)] = target
            self.files[target].write(line + "\n")
            if COMPILE_STEP in line and h.group(1) not in self.compiling:
                now = self.clock()
                self.compiling[h.group(1)] = [target, now, "", now, False]  # says "compiling" at its first output
            if stage in ("context", "internal") or not h.group(4):
                return None
            step = f"{stage} {h.group(4)} {' '.join(h.group(5).split())[:70]}"
            if self.last.get(target) == step:  # BuildKit repeats a header when output interleaves
                return None
            self.last[target] = step
            return target, step
        v = _VERTEX.match(line)
        if v and v.group(1) in self.owner:
            target = self.owner[v.group(1)]
            self.files[target].write(line + "\n")
            if _VERTEX_ERROR.match(line):
                self.failed.add(target)
            out = _OUTPUT.match(line)
            if out and target not in self.errors and out.group(2).strip().startswith("[imagegen] error: "):
                # the first step that failed with a reason of its own (fetch, toolchain, deps, compile...)
                self.errors[target] = out.group(2).strip()[len("[imagegen] error: "):]
            self._progress(v.group(1), target, line)
        return None

    def _say(self, message: str) -> None:
        if self.say is not None:
            self.say(message)

    def _progress(self, vertex: str, target: str, line: str) -> None:
        """Per-cell console progress of the compile step (vertex ``vertex``)."""
        state = self.compiling.get(vertex)
        if state is None:
            return
        out = _OUTPUT.match(line)
        if out:
            if not state[4]:
                state[4] = True
                self._say(f"[{target}] compiling")
            text = out.group(2).strip()
            if text and not text.startswith(("[imagegen] still compiling", "[imagegen] error: ")):
                state[2] = text
            now = self.clock()
            if now - state[3] >= PROGRESS_EVERY_S:
                state[3] = now
                self._say(f"[{target}] compiling, {_minutes(now - state[1])}"
                          + (f", last: {state[2][:160]}" if state[2] else ""))
            return
        done = _DONE.match(line)
        if done or line.startswith(f"#{vertex} CACHED"):
            del self.compiling[vertex]
            if done and state[4]:
                self._say(f"[{target}] compiled in {_minutes(float(done.group(2)))}")
        elif _VERTEX_ERROR.match(line) or line.startswith(f"#{vertex} CANCELED"):
            del self.compiling[vertex]
            if line.startswith(f"#{vertex} CANCELED"):
                self._say(f"[{target}] compile cancelled after {_minutes(self.clock() - state[1])}")
            else:
                self._say(f"[{target}] compile failed after {_minutes(self.clock() - state[1])}: "
                          + (self.errors.get(target) or line.split(": ", 1)[-1])[:300])

    def close(self) -> None:
        for fh in self.files.values():
            fh.close()

    def tail(self, target: str, n: int = 20) -> list[str]:
        """The lines that say what went wrong: the last error lines, then the last few lines."""
        if target in self.files:
            self.files[target].flush()
        try:
            lines = (self.folder / f"{target}.log").read_text(errors="replace").splitlines()
        except OSError:
            return []
        errors = [line for line in lines if ERROR_LINE.search(line)][-(n - 3):]
        last = [line for line in lines[-3:] if line not in errors]
        return errors + last
