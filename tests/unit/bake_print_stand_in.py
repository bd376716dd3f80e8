"""A pure stand-in for ``docker buildx bake --print`` (imagegen.render.bakefiles.print_bake), for unit
tests of what imagegen does with a printed definition. It resolves targets and groups the way buildx
does, over the definition imagegen itself generated (the repository's docker-bake.hcl) or a JSON file.

That buildx really prints these definitions is proved against buildx in
tests/integration/test_bake_print.py and tests/integration/test_ci_workflow.py."""

from __future__ import annotations

import functools
import json
from pathlib import Path

from imagegen.errors import EngineError
from imagegen.model.catalogue import load_catalogue
from imagegen.plan import defaults
from imagegen.render.bake import build_definition
from imagegen.render.bakefiles import REPO_SCRIPTS, repo_plan

ROOT = Path(__file__).resolve().parents[2]


@functools.lru_cache(maxsize=1)
def _repo_definition() -> str:
    definition = build_definition(repo_plan(load_catalogue()), out_dir=defaults()["repo"]["out"], root=ROOT,
                                  scripts=REPO_SCRIPTS)
    return json.dumps(definition.as_dict())


def print_bake(file: Path, cwd: Path, targets: list[str] | None = None, env: dict | None = None) -> dict:
    path = file if file.is_absolute() else cwd / file
    if path.suffix == ".json":
        definition = json.loads(path.read_text(encoding="utf-8"))
    elif path.read_text(encoding="utf-8") == (ROOT / "docker-bake.hcl").read_text(encoding="utf-8"):
        definition = json.loads(_repo_definition())
    else:
        # Like a machine without the buildx plugin: `imagegen bake` writes the file and warns.
        raise EngineError("docker buildx is not installed: the unit tests' stand-in for `bake --print` reads"
                          " JSON bake files and the repository's docker-bake.hcl only")
    groups = {name: g.get("targets", []) for name, g in definition.get("group", {}).items()}
    chosen: list[str] = []
    for name in targets or ["default"]:
        if name in groups:
            chosen += [t for t in groups[name] if t not in chosen]
        elif name in definition.get("target", {}):
            chosen += [name] if name not in chosen else []
        else:
            raise EngineError(f"docker buildx bake --print rejected {file}: failed to find target {name}")
    return {"group": {"default": {"targets": chosen}},
            "target": {name: definition["target"][name] for name in chosen}}
