"""The package's imports follow the data flow: request -> plan -> render -> execute -> finish ->
publish. A module may import its own step and earlier ones, never a later one (read from the code's
own imports, nested ones included). The step of each module is listed here; a new module must be
given one.

The executors do not import the finish step: the command hands it to them (execute.build(finish=...),
native.build_native(finish=...)), and they read the wheelhouse only through imagegen.wheelhouse."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "imagegen"

STEP = {
    # foundations every step may use: errors, validation, safe writes, signals, YAML, the engine seam
    "errors": 0, "safety": 0, "yamlio": 0, "outputs": 0, "interrupt": 0, "engine": 0, "resources": 0,
    # inputs and rules
    "arch": 1, "compat": 1, "config": 1, "recipes": 1, "jobs": 1,
    # plan (and the wheelhouse as it is: what a plan's cells would skip or replace)
    "plan": 2, "audit": 2, "options": 2, "wheelhouse": 2,
    # render
    "render": 3, "bake": 3, "bakefiles": 3, "windows": 3, "ci": 3,
    # execute
    "execute": 4, "native": 4,
    # finish: verify, collect into the wheelhouse, the GPU check
    "finish": 5, "verify": 5, "collect": 5, "check": 5,
    # publish: registry images (prebuilt pushes builder images and runs them)
    "registry": 6, "prebuilt": 6,
    # the shell
    "doctor": 7, "cli": 7, "__main__": 8, "__init__": 0,
}
KNOWN: set[tuple[str, str]] = set()  # exceptions still to remove; none left


def imports(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "imagegen":
            parts = node.module.split(".")
            found.update([parts[1]] if len(parts) > 1 else [a.name for a in node.names if a.name in STEP])
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".")[1] for a in node.names if a.name.startswith("imagegen."))
    return found - {path.stem}


def test_every_module_has_a_step():
    assert {p.stem for p in PACKAGE.glob("*.py")} <= set(STEP), "give the new module a step in STEP"


def test_no_module_imports_a_later_step():
    later = sorted((p.stem, dep) for p in PACKAGE.glob("*.py") for dep in imports(p)
                   if dep in STEP and STEP[dep] > STEP[p.stem] and (p.stem, dep) not in KNOWN)
    assert not later, later


def test_the_known_exceptions_are_still_real():
    # An exception that no longer occurs must leave KNOWN (so the list only shrinks).
    for module, dep in KNOWN:
        assert dep in imports(PACKAGE / f"{module}.py"), (module, dep)
