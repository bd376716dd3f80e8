"""The package's folders are the steps of the data flow: request -> plan -> render -> execute ->
finish -> publish, and its imports follow it. A module may import its own step and earlier ones,
never a later one (read from the code's own imports, nested ones included). A folder is one step;
the modules at the top level are listed one by one, and a new one must be given a step.

The executors do not import the finish step: the command hands it to them
(executors.buildx.build(finish=...), executors.native.build_native(finish=...),
executors.prebuilt.pull(finish=...)), and they read the
wheelhouse only through imagegen.wheelhouse."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "imagegen"

FOLDER_STEP = {
    "model": 1,       # inputs as data and the rules over them (arch, compat, recipes, cells, jobs, the audit verdict)
    "plan": 2,        # from a request to validated cells: options, config, refs, matrix, lock, resolution
    "wheelhouse": 3,  # where wheels go and what the manifests say (read before building); collect, its one writer
    "render": 4,      # one generator per output
    "executors": 5,   # buildx bake, native, prebuilt images
    "finish": 6,      # verify a built wheel and check it on the GPU, then hand it to collect
    "publish": 7,     # uploads, the index, repair, registry images
    "commands": 8,    # the shell's commands
    "shipped": 0,     # the stdlib-only code builder images and Windows scripts run (the library shares a few parts)
}
MODULE_STEP = {
    # foundations every step may use: errors, validation, safe writes, bounded reads, signals, YAML, the engine seam
    "errors": 0, "safety": 0, "untrusted": 0, "yamlio": 0, "outputs": 0, "interrupt": 0, "engine": 0, "__init__": 0,
    # the shell
    "cli": 8, "__main__": 9,
}
KNOWN: set[tuple[str, str]] = set()  # exceptions still to remove; none left


def modules() -> dict[str, Path]:
    """Every module by dotted name below imagegen ("model.arch", "cli")."""
    found = {}
    for path in PACKAGE.rglob("*.py"):
        rel = path.relative_to(PACKAGE).with_suffix("")
        found[".".join(rel.parts)] = path
    return found


def step(name: str) -> int:
    head = name.split(".")[0]
    if "." in name or head in FOLDER_STEP:
        return FOLDER_STEP[head]
    return MODULE_STEP[name]


def imports(name: str, path: Path) -> set[str]:
    """The imagegen modules ``name`` imports, as dotted names below imagegen."""
    known = modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "imagegen":
            base = node.module.split(".", 1)[1] if "." in node.module else ""
            for alias in node.names:
                full = f"{base}.{alias.name}" if base else alias.name
                found.add(full if full in known else base)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".", 1)[1] for a in node.names if a.name.startswith("imagegen."))
    return {m for m in found if m and m != name and not m.endswith("__init__")}


def test_every_module_has_a_step():
    for name in modules():
        if "." not in name and name not in FOLDER_STEP:
            assert name in MODULE_STEP, f"give the new module {name} a step in MODULE_STEP"
        else:
            assert name.split(".")[0] in FOLDER_STEP, f"give the new folder of {name} a step in FOLDER_STEP"


def test_the_folders_are_packages_that_say_what_they_hold():
    for folder in FOLDER_STEP:
        init = PACKAGE / folder / "__init__.py"
        assert init.is_file() and ast.get_docstring(ast.parse(init.read_text())), folder


def test_resources_hold_data_only():
    # Code lives in packages (shipped/ for what leaves imagegen); resources/ is what the code reads.
    code = sorted(str(p.relative_to(PACKAGE)) for p in (PACKAGE / "resources").rglob("*.py"))
    assert not code, code


def test_no_module_imports_a_later_step():
    later = sorted((name, dep) for name, path in modules().items() for dep in imports(name, path)
                   if step(dep.split(".")[0] if dep.split(".")[0] in FOLDER_STEP else dep) > step(name)
                   and (name, dep) not in KNOWN)
    assert not later, later


def test_the_import_reader_sees_imports_across_folders():
    # The test above can only fail if imports() finds what a module really imports.
    deps = imports("executors.buildx", PACKAGE / "executors" / "buildx.py")
    assert {"wheelhouse.manifest", "engine", "executors.bake_run"} <= deps, deps
    assert "model.arch" in imports("plan.matrix", PACKAGE / "plan" / "matrix.py")


def test_the_known_exceptions_are_still_real():
    # An exception that no longer occurs must leave KNOWN (so the list only shrinks).
    for module, dep in KNOWN:
        assert dep in imports(module, modules()[module]), (module, dep)


# --------------------------------------------------------------------------------------------
# One unit test file per module


UNIT = Path(__file__).resolve().parent
NOT_MODULES = {"__init__", "__main__"}  # a package's docstring; `python -m imagegen` (cli.main)


def imported_by_test(path: Path) -> set[str]:
    """The imagegen modules a test file imports, as dotted names below imagegen."""
    known = modules()
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom) and node.module and node.module.split(".")[0] == "imagegen":
            base = node.module.split(".", 1)[1] if "." in node.module else ""
            found.add(base)
            found.update(f"{base}.{a.name}" if base else a.name for a in node.names)
        elif isinstance(node, ast.Import):
            found.update(a.name.split(".", 1)[1] for a in node.names if a.name.startswith("imagegen."))
    return found & set(known)


def test_every_module_has_its_own_unit_test_file_that_imports_it():
    package_modules = {name: path for name, path in modules().items()
                       if not name.startswith("shipped.") and name.split(".")[-1] not in NOT_MODULES}
    basenames = [name.split(".")[-1] for name in package_modules]
    assert len(basenames) == len(set(basenames)), "module names must stay unique: tests/unit is one folder"
    missing = sorted(f"tests/unit/test_{name.split('.')[-1]}.py for imagegen.{name}" for name in package_modules
                     if not (UNIT / f"test_{name.split('.')[-1]}.py").is_file())
    assert not missing, missing
    not_imported = sorted(name for name in package_modules
                          if name not in imported_by_test(UNIT / f"test_{name.split('.')[-1]}.py"))
    assert not not_imported, f"these modules' test files do not import them: {not_imported}"


def test_the_test_import_reader_sees_both_import_forms(tmp_path):
    # The test above can only fail if imported_by_test() finds what a test file imports.
    sample = tmp_path / "test_x.py"
    sample.write_text("from imagegen.model import arch_parse\nfrom imagegen.render.bake import to_json\n"
                      "import imagegen.executors.host\nfrom imagegen import cli\n")
    assert imported_by_test(sample) == {"model.arch_parse", "render.bake", "executors.host", "cli"}
