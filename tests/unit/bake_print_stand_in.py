"""A pure stand-in for ``docker buildx bake --print`` (imagegen.render.bakefiles.print_bake), for unit
tests of what imagegen does with a printed definition. It resolves targets and groups the way buildx
does, over the definition imagegen itself generated (the repository's docker-bake.hcl) or JSON files
(several, as `-f A -f B` merges them: print_bake_files).

That buildx really prints these definitions is proved against buildx in
tests/integration/test_bake_print.py and tests/integration/test_ci_workflow.py."""

from __future__ import annotations

import json
from pathlib import Path

from imagegen.errors import EngineError
from imagegen.render.bake_read import load_definition

ROOT = Path(__file__).resolve().parents[2]


def _definition(path: Path, file: Path) -> dict:
    if path.suffix == ".json":
        return json.loads(path.read_text(encoding="utf-8"))
    if path.read_text(encoding="utf-8") == (ROOT / "docker-bake.hcl").read_text(encoding="utf-8"):
        # The file as it is (its inputs hashes those of the commit that wrote it), read as buildx reads it:
        # tests/integration/test_ci_workflow.py proves imagegen's reader and buildx's agree on it.
        return load_definition(path)
    # Like a machine without the buildx plugin: `imagegen bake` writes the file and warns.
    raise EngineError("docker buildx is not installed: the unit tests' stand-in for `bake --print` reads"
                      " JSON bake files and the repository's docker-bake.hcl only")


def print_bake(file: Path, cwd: Path, targets: list[str] | None = None, env: dict | None = None) -> dict:
    return print_bake_files([file], cwd, targets, env)


def print_bake_files(files: list[Path], cwd: Path, targets: list[str] | None = None, env: dict | None = None) -> dict:
    """``docker buildx bake --print -f A -f B ...``: the files merged as buildx merges them (bake/hclparser:
    a later file's target of the same name merges into the earlier one; a group has no merge, so a
    later file's group of the same name, `default` too, replaces the earlier one)."""
    groups: dict[str, list[str]] = {}
    defined: dict[str, dict] = {}
    for file in files:
        definition = _definition(file if file.is_absolute() else cwd / file, file)
        groups.update({name: g.get("targets", []) for name, g in definition.get("group", {}).items()})
        for name, target in definition.get("target", {}).items():
            defined[name] = {**defined.get(name, {}), **target}
    chosen: list[str] = []
    for name in targets or ["default"]:
        if name in groups:
            chosen += [t for t in groups[name] if t not in chosen]
        elif name in defined:
            chosen += [name] if name not in chosen else []
        else:
            raise EngineError(f"docker buildx bake --print rejected {files[-1]}: failed to find target {name}")
    return {"group": {"default": {"targets": chosen}},
            "target": {name: defined[name] for name in chosen}}
