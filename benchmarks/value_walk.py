"""Follow one command-line value through a real run of imagegen: which files handle it, in what order,
and how often it climbs back to an earlier step of the flow.

    python benchmarks/value_walk.py --flag --arch -- build --native --source tests/fixtures/tiny_kernel \\
        --arch 8.0 --python-exe VENV/bin/python --out /tmp/wh --work /tmp/work

The command runs in this process (``imagegen.cli.main``) under a profiler. A file *handles* the value
when one of its functions
  - is called with it in any form it takes on the way: the text from the command line, a value a
    handler returned from it (the parsed arch list, the mapped list, TORCH_CUDA_ARCH_LIST's text, a
    tuple or dict holding one), or
  - reads it from the object that carries it (``args.arch``, ``args.argv``, ``Flags.arch``, ``Options.archs``,
    ``MatrixRequest.archs``, ``Cell.archs`` / ``requested_archs`` / ``expected_archs``).
The trip is those handlings in time order, a stay for each run of one file. A *climb* is the value
going back to an earlier step of the flow: a stay in a step before the step of the stay that came
before it, in the order request (commands/, cli.py) -> plan -> render -> executors -> finish ->
wheelhouse -> publish. model/, the foundations (errors, safety, outputs, ...) and the shipped code are
rules every step uses, not steps of the flow, so a stay there is passed over (each is one of the files
counted). What runs in another process (the build script in the image or on the host) is not seen;
the value reaches it as an environment variable or a file, which the trip shows as the call that
passes it.

Results are written down in benchmarks/RESULTS.md; nothing here is a test.
"""

from __future__ import annotations

import argparse
import dataclasses
import re
import sys
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PACKAGE = ROOT / "imagegen"
ARCHY = re.compile(r"\d+\.\d|sm_\d|compute_\d")  # a returned text that can be an arch list
CARRIERS = {  # class path -> the attributes that hold the value
    ("argparse", "Namespace"): {"arch", "argv"},
    ("imagegen.plan.options", "Flags"): {"arch"},
    ("imagegen.plan.options", "Options"): {"archs", "arch_configured"},
    ("imagegen.model.cell", "MatrixRequest"): {"archs"},
    ("imagegen.model.cell", "Cell"): {"archs", "requested_archs", "expected_archs"},
    # the tree as it was when issue 33 was filed (2398cc2), for the figures it is compared with
    ("imagegen.options", "Options"): {"archs", "arch_configured"},
    ("imagegen.plan", "MatrixRequest"): {"archs"},
    ("imagegen.plan", "Cell"): {"archs", "requested_archs", "expected_archs"},
}


FLOW = ("commands", "plan", "render", "executors", "finish", "wheelhouse", "publish")
# The top-level modules of 2398cc2 (issue 33 filed), by the step they belonged to
_FLOW_BEFORE = {"cli": "commands", "doctor": "commands", "plan": "plan", "options": "plan", "config": "plan",
                "refs": "plan", "registry": "plan", "resolve": "plan", "audit": "plan", "refresh": "plan",
                "finish": "finish", "verify": "finish", "fatbin": "finish", "check": "finish",
                "collect": "wheelhouse", "records": "wheelhouse", "wheelhouse": "wheelhouse"}


def flow_step(path: str) -> int | None:
    """The file's place in the flow (0 for the request), None for the rules every step uses."""
    parts = Path(path).with_suffix("").parts
    head = parts[0] if len(parts) > 1 else _FLOW_BEFORE.get(parts[0], parts[0])
    return FLOW.index(head) if head in FLOW else None


class Walk:
    def __init__(self, text: str):
        # id -> each form of the value, kept alive so the ids stay theirs. Texts too are told by identity:
        # a recipe's own "8.0" is equal to the user's but is not it.
        self.objects = {id(text): text}
        self.events: list[tuple[str, str, str]] = []  # (file, function, how)
        self.handling: set[int] = set()  # frames that handled the value (their returns carry it)

    def carries(self, value, depth: int = 0) -> bool:
        if id(value) in self.objects:
            return True
        if depth < 2 and isinstance(value, (tuple, list, set, frozenset)) and len(value) <= 64:
            return any(self.carries(v, depth + 1) for v in value)
        if depth < 1 and isinstance(value, dict) and len(value) <= 256:
            return any(self.carries(v, depth + 1) for v in value.values())
        return False

    def take(self, value) -> None:
        """A handler's return value is a form of the value when it can be one (a short arch-like text, an
        arch list, a tuple of them)."""
        if isinstance(value, str):
            if len(value) <= 200 and ARCHY.search(value):
                self.objects[id(value)] = value
        elif type(value).__name__ == "ArchList":
            self.objects[id(value)] = value
        elif isinstance(value, (tuple, list)) and 0 < len(value) <= 64 and all(
                isinstance(v, str) or type(v).__name__ == "ArchList" for v in value):
            self.objects[id(value)] = value
            for v in value:
                self.take(v)

    def note(self, frame, how: str) -> None:
        try:
            rel = str(Path(frame.f_code.co_filename).resolve().relative_to(PACKAGE))
        except ValueError:
            return
        self.events.append((rel, frame.f_code.co_qualname, how))
        self.handling.add(id(frame))

    def profile(self, frame, event, arg):
        if event == "call":
            code = frame.f_code
            if not code.co_filename.startswith(str(PACKAGE)):
                return
            n = code.co_argcount + code.co_kwonlyargcount + bool(code.co_flags & 4) + bool(code.co_flags & 8)
            for name in code.co_varnames[:n]:
                if name in ("self", "cls"):
                    continue
                if self.carries(frame.f_locals.get(name)):
                    self.note(frame, f"given it as {name}")
                    return
        elif event == "return" and id(frame) in self.handling:
            self.handling.discard(id(frame))
            self.take(arg)

    def watch_reads(self) -> list:
        """Record each read of a carrier's attribute by the imagegen frame that reads it."""
        import importlib

        undo = []
        for (module, name), attrs in CARRIERS.items():
            try:
                cls = getattr(importlib.import_module(module), name)
            except (ImportError, AttributeError):
                continue  # the other tree's
            original = cls.__getattribute__

            def read(obj, attr, _original=original, _attrs=attrs):
                value = _original(obj, attr)
                if attr in _attrs:
                    self.note(sys._getframe(1), f"reads .{attr}")
                    self.take(value)
                return value
            cls.__getattribute__ = read
            undo.append((cls, original))
        return undo


def stays(events):
    out = []
    for file, func, how in events:
        if out and out[-1][0] == file:
            out[-1][1].append(f"{func} ({how})")
        else:
            out.append((file, [f"{func} ({how})"]))
    return out


@dataclasses.dataclass
class Trip:
    exit: object  # the command's exit code
    stays: list[tuple[str, list[str]]]  # (file below imagegen/, what its functions did with the value)

    @property
    def files(self) -> list[str]:
        return sorted({f for f, _ in self.stays})

    @property
    def flow_files(self) -> list[str]:
        """The files of the flow's steps; the others are the rules (model/, the foundations, shipped
        code) that the value's own type and checks live in, which every step may call."""
        return [f for f in self.files if flow_step(f) is not None]

    @property
    def climbs(self) -> list[tuple[str, str]]:
        in_flow = [file for file, _ in self.stays if flow_step(file) is not None]
        return [(a, b) for a, b in zip(in_flow, in_flow[1:]) if flow_step(b) < flow_step(a)]


def follow(command: list[str], flag: str = "--arch") -> Trip:
    """Run ``imagegen COMMAND`` here and follow the value of ``flag`` in it."""
    walk = Walk(command[command.index(flag) + 1])

    from imagegen import cli

    undo = walk.watch_reads()
    threading.setprofile(walk.profile)
    sys.setprofile(walk.profile)
    try:
        rc = cli.main(command)
    except SystemExit as exc:
        rc = exc.code
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
        for cls, original in undo:
            cls.__getattribute__ = original
    return Trip(rc, stays(walk.events))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--flag", default="--arch", help="the option whose value to follow (default --arch)")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then an imagegen command line")
    ns = ap.parse_args(argv)
    command = ns.command[1:] if ns.command[:1] == ["--"] else ns.command
    if ns.flag not in command[:-1]:
        ap.error(f"the command line has no {ns.flag} VALUE to follow")
    trip = follow(command, ns.flag)
    print(f"\n# {ns.flag} of `imagegen {' '.join(command[:1])}` (exit {trip.exit})", file=sys.stderr)
    for i, (file, what) in enumerate(trip.stays, 1):
        shown = ", ".join(dict.fromkeys(what))
        where = "" if flow_step(file) is None else FLOW[flow_step(file)]
        print(f"{i:3}. {where:10} {file:34} {shown[:150]}", file=sys.stderr)
    print(f"files: {len(trip.files)} ({len(trip.flow_files)} of the flow, {len(trip.files) - len(trip.flow_files)} of"
          f" rules); stays: {len(trip.stays)}; moves: {max(len(trip.stays) - 1, 0)};"
          f" climbs: {len(trip.climbs)}", file=sys.stderr)
    for a, b in trip.climbs:
        print(f"  climb: {a} -> {b} (back from {FLOW[flow_step(a)]} to {FLOW[flow_step(b)]})", file=sys.stderr)
    return 0 if trip.exit in (0, None) else 1


if __name__ == "__main__":
    sys.exit(main())
