"""Render a matrix into docker buildx bake definitions.

One target per buildable cell, named like ``sage-2_2_0-torch2_8-cu128-py312`` (bake allows only
``[a-zA-Z0-9_-]``), each with its own Dockerfile, its own local output folder
(``<out>/<pkg>-<ver>/torch<X.Y>/cu<XYZ>``: bake merges outputs that share a folder), the CA-bundle
secret, a named context for local sources, and build args that the environment can override through
``IMAGEGEN_``-prefixed variables (an unprefixed ``MAX_JOBS`` in a CI's environment would silently
override a bake variable of that name). Groups: one per recipe, and ``default``.

A cell whose base image has fallbacks (the manylinux flavor's sameli image, ``--base-image
CUDA=PRIMARY,FALLBACK``) gets, beside its target, one ``<target>-fallback`` target per fallback
(``-fallback2`` for a second), in no group: the cell as ``imagegen build`` builds it when the primary
cannot be pulled (its own Dockerfile, FROM the fallback; the same output folder). A plain ``docker buildx
bake <target>-fallback`` builds on it; ``imagegen ci github`` jobs pick it when the primary cannot be
had. The labels ``io.imagegen.base-image`` and ``io.imagegen.fallbacks`` say which is which.

The definition is emitted both as JSON (``bake/*.json``, no quoting pitfalls) and as HCL (the root
``docker-bake.hcl`` that a plain ``docker buildx bake`` in a clone of the repo picks up). Every value
is validated before it gets here (see imagegen.safety), and strings are written with JSON escaping,
which is also valid HCL string syntax once ``${`` and ``%{`` are escaped: bake evaluates templates in
JSON files too, so in both forms every string except the interpolations imagegen writes itself
(:class:`Interp`) has ``${`` written as ``$${`` and ``%{`` as ``%%{`` (bake reads them back literally).
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping

from imagegen import safety
from imagegen.model.build_cost import cell_cost
from imagegen.model.cell import DEFAULT_PLATFORM, Cell, Plan
from imagegen.plan.matrix import on_fallback
from imagegen.plan.registry import image_name
from imagegen.render.dockerfile import SCRIPTS_CONTEXT, CellInputs, builder_files, render_dockerfile
from imagegen.shipped.builder import imagegen_rules as rules

# Variables users may set in the environment to override every target's build args.
VARIABLES = {
    "IMAGEGEN_TORCH_CUDA_ARCH_LIST": ("TORCH_CUDA_ARCH_LIST", "GPU archs for every target, e.g. 8.0;9.0+PTX"),
    "IMAGEGEN_MAX_JOBS": ("MAX_JOBS", "parallel compile jobs per target (empty: sized from free RAM)"),
    "IMAGEGEN_NVCC_THREADS": ("NVCC_THREADS", "nvcc --threads per job"),
    "IMAGEGEN_AUDIT_PROBE": ("IMAGEGEN_AUDIT_PROBE", "the audit's header probe: 0 skips it, full parses torch's headers too"),
}
CA_VARIABLE = "IMAGEGEN_PIP_CERT"
CA_DEFAULT = "/etc/ssl/certs/ca-certificates.crt"


class Interp(str):
    """A string with an interpolation imagegen wrote itself (``${IMAGEGEN_PIP_CERT}``): written as is."""


def escape_template(value: str) -> str:
    """``value`` as a bake (HCL or JSON) string literal's content that bake reads back literally."""
    return value.replace("${", "$${").replace("%{", "%%{")


def _escaped(value):
    if isinstance(value, Interp):
        return str(value)
    if isinstance(value, str):
        return escape_template(value)
    if isinstance(value, list):
        return [_escaped(v) for v in value]
    if isinstance(value, dict):
        return {k: _escaped(v) for k, v in value.items()}
    return value


@dataclass
class BakeTarget:
    name: str
    recipe: str
    context: str  # bake resolves `dockerfile` inside the context: the Dockerfiles' own folder
    dockerfile: str
    output: str
    cell: Cell
    contexts: dict[str, str] = field(default_factory=dict)
    fallbacks: tuple[str, ...] = ()  # the names of this cell's fallback targets, in order
    fallback_of: str | None = None  # a fallback target: the primary's name (in no group)
    # The cell's inputs hash (the Dockerfile's io.imagegen.inputs): what `ci github --skip-published`
    # compares with the published manifest's entry. Primary targets only.
    inputs: str = ""


@dataclass
class BakeDefinition:
    targets: list[BakeTarget]
    dockerfiles: dict[str, str]  # path relative to the root -> content

    @property
    def groups(self) -> dict[str, list[str]]:
        """``default`` (every target), one group per recipe (``flash-attn``) and one per recipe version
        (``flash-attn-2_8_3``). buildx keeps the last file's group of a name when several files are
        given (``-f a.hcl -f b.hcl``): the version groups, named after what they hold, stay apart, so
        files of two versions build together by naming them (docs/guide/ci-farm.md: several bake files)."""
        groups: dict[str, list[str]] = {}
        primary = [t for t in self.targets if t.fallback_of is None]
        for t in primary:
            groups.setdefault(t.recipe, []).append(t.name)
        recipes = set(groups)
        for t in primary:
            if version_group(t) not in recipes:  # a recipe of that very name keeps its own group
                groups.setdefault(version_group(t), []).append(t.name)
        groups["default"] = [t.name for t in primary]
        return groups

    def version_groups_of(self, recipe: str) -> set[str]:
        return {version_group(t) for t in self.targets if t.recipe == recipe}

    def as_dict(self, *, only_recipe: str | None = None) -> dict:
        targets = [t for t in self.targets if only_recipe is None or t.recipe == only_recipe]
        mine = self.version_groups_of(only_recipe) if only_recipe is not None else set()
        groups = {k: v for k, v in self.groups.items() if only_recipe is None or k in (only_recipe, "default", *mine)}
        if only_recipe is not None:
            groups["default"] = [t.name for t in targets if t.fallback_of is None]
        variables = {name: {"default": ""} for name in VARIABLES}
        variables[CA_VARIABLE] = {"default": CA_DEFAULT}  # every default is a literal
        return {
            "variable": variables,
            "group": {name: {"targets": names} for name, names in sorted(groups.items())},
            "target": {t.name: _target_dict(t) for t in targets},
        }


def version_group(t: BakeTarget) -> str:
    """The bake group of one recipe version's targets: ``flash-attn-2_8_3`` (bake names take no dots)."""
    return f"{t.recipe}-{''.join(c if c.isalnum() else '_' for c in t.cell.version.version)}"


# `imagegen build --compile-cache URL`: the secret and the variable it is read from (imagegen_rules.py: the
# in-build script reads the same names)
COMPILE_CACHE_SECRET = rules.COMPILE_CACHE_SECRET
COMPILE_CACHE_VARIABLE = rules.COMPILE_CACHE_VARIABLE
# The estimated CPU-hours of a target's compile (imagegen.model.build_cost), where its recipe has a measurement.
CPU_HOURS_LABEL = "io.imagegen.cpu-hours"
WALL_HOURS_LABEL = "io.imagegen.wall-hours"  # the least wall time of that compile (the measured build's own)
BUILDER_LABEL = "io.imagegen.builder"


def _target_dict(t: BakeTarget) -> dict:
    args = {arg: Interp(f'${{{var} != "" ? {var} : null}}') for var, (arg, _) in VARIABLES.items()}
    d: dict = {
        "context": t.context,
        "dockerfile": t.dockerfile,
        "target": "wheels",
        "args": args,
        "secret": [Interp(f"id=pip_cert,src=${{{CA_VARIABLE}}}"), f"id={COMPILE_CACHE_SECRET},env={COMPILE_CACHE_VARIABLE}"],
        "output": [f"type=local,dest={t.output}"],
        # io.imagegen.builder: the cell's builder image below a registry (imagegen-<recipe>:<tag>), as `imagegen
        # push` names it: what `imagegen ci github --push-builders` pushes the target's builder stage as.
        "labels": {"io.imagegen.cell": t.fallback_of or t.name, BUILDER_LABEL: image_name(t.cell)},
    }
    if t.inputs:
        d["labels"]["io.imagegen.inputs"] = t.inputs
    cost = None if t.fallback_of else cell_cost(t.cell.recipe, t.cell.gencode_targets)
    if cost is not None:  # what `imagegen ci github` sizes the farm's runners by (its primary's job)
        d["labels"][CPU_HOURS_LABEL] = f"{cost.cpu_hours:.2f}"
        if cost.wall_hours is not None:
            d["labels"][WALL_HOURS_LABEL] = f"{cost.wall_hours:.2f}"
    if t.fallbacks or t.fallback_of:
        assert t.cell.base is not None
        d["labels"]["io.imagegen.base-image"] = t.cell.base.ref
    if t.fallbacks:
        d["labels"]["io.imagegen.fallbacks"] = ",".join(t.fallbacks)
    if t.contexts:
        d["contexts"] = dict(t.contexts)
    if t.cell.platform != DEFAULT_PLATFORM:  # amd64 cells build for the builder's own platform, as before
        d["platforms"] = [t.cell.platform]
    return d


def build_definition(plan: Plan, *, out_dir: str, dockerfiles_dir: str = "dockerfiles",
                     root: Path | None = None, command: str | None = None,
                     scripts: str | None = None, fallback_targets: bool = False,
                     inputs: Mapping[str, CellInputs] | None = None) -> BakeDefinition:
    """Targets for every buildable cell of ``plan``; paths are relative to ``root`` (the folder
    bake runs from: bake resolves context, dockerfile and output against its working directory).

    Every target gets imagegen's in-build scripts as the named context SCRIPTS_CONTEXT: ``scripts``
    (a folder as bake should read it: the clone's own imagegen/shipped/builder for --repo), else a
    copy written beside the Dockerfiles (``<dockerfiles_dir>/imagegen-scripts/``), so that a bake
    file and its Dockerfiles build on a machine without imagegen (a CI runner). ``fallback_targets``: a
    ``<target>-fallback`` target per fallback base image (a bake file for people and CI; `imagegen build`
    picks the base itself). ``inputs``: each cell's (by name), where the caller worked them out already."""
    root = (root or Path.cwd()).resolve()
    targets, dockerfiles = [], {}
    safety.validate(dockerfiles_dir, safety.LOCAL_PATH, "Dockerfiles folder")
    if scripts is None:
        for name, text in builder_files().items():
            dockerfiles[f"{dockerfiles_dir}/{SCRIPTS_CONTEXT}/{name}"] = text
        scripts = _relative(Path(root, dockerfiles_dir, SCRIPTS_CONTEXT), root, "Dockerfiles folder")
    for cell in plan.buildable:
        name = cell.name
        safety.validate(name, _TARGET_NAME, "bake target name")
        path = f"{dockerfiles_dir}/{name}.Dockerfile"
        rendered = render_dockerfile(cell, command=command, inputs=(inputs or {}).get(name), files_dir=name)
        dockerfiles[path] = rendered.dockerfile
        dockerfiles.update({f"{dockerfiles_dir}/{rel}": text for rel, text in rendered.files.items()})
        out = out_dir if cell.wheel_dir == "." else f"{out_dir}/{cell.wheel_dir}"  # "." : the flat layout
        safety.validate(out, safety.LOCAL_PATH, "output folder")
        contexts = {SCRIPTS_CONTEXT: scripts}
        if cell.recipe.source_kind == "local" and cell.recipe.source_path is not None:
            contexts["source"] = _relative(cell.recipe.source_path, root)
        fallbacks = list(cell.base.fallbacks) if fallback_targets and cell.base is not None else []
        names = [fallback_target(name, i) for i in range(1, len(fallbacks) + 1)]
        targets.append(BakeTarget(name=name, recipe=cell.recipe.name, context=dockerfiles_dir,
                                  dockerfile=f"{name}.Dockerfile", output=out, cell=cell, contexts=contexts,
                                  fallbacks=tuple(names), inputs=rendered.inputs_hash))
        for ref, fallback in zip(fallbacks, names):
            safety.validate(fallback, _TARGET_NAME, "bake target name")
            other = on_fallback(cell, ref, f"when {cell.base.ref} cannot be pulled ({fallback})")
            other_rendered = render_dockerfile(other, command=command, files_dir=fallback)
            dockerfiles[f"{dockerfiles_dir}/{fallback}.Dockerfile"] = other_rendered.dockerfile
            dockerfiles.update({f"{dockerfiles_dir}/{rel}": text for rel, text in other_rendered.files.items()})
            targets.append(BakeTarget(name=fallback, recipe=cell.recipe.name, context=dockerfiles_dir,
                                      dockerfile=f"{fallback}.Dockerfile", output=out, cell=other, contexts=contexts,
                                      fallback_of=name))
    return BakeDefinition(targets=targets, dockerfiles=dockerfiles)


def fallback_target(name: str, index: int) -> str:
    """The bake target of a cell on its ``index``-th fallback base image: NAME-fallback, NAME-fallback2, ..."""
    return f"{name}-fallback" + (str(index) if index > 1 else "")


def absolute_contexts(target: BakeTarget, dockerfiles_dir: Path) -> dict[str, str]:
    """``target``'s named contexts as absolute paths, for a bake file in a run folder (python-on-whales
    cannot set bake's working directory): the scripts written beside ``dockerfiles_dir``'s
    Dockerfiles and, for a local project, its tree."""
    contexts = {SCRIPTS_CONTEXT: str(dockerfiles_dir / SCRIPTS_CONTEXT)}
    if target.cell.recipe.source_path is not None and "source" in target.contexts:
        contexts["source"] = str(target.cell.recipe.source_path)
    return contexts


_TARGET_NAME = re.compile(r"[A-Za-z0-9_-]{1,200}")


def _relative(path: Path, root: Path, what: str = "local source path") -> str:
    try:
        rel = os.path.relpath(path, root)
    except ValueError:
        rel = str(path)
    rel = rel if rel.startswith(("/", ".")) else "./" + rel
    return safety.validate(rel, safety.LOCAL_PATH, what)


# --------------------------------------------------------------------------------------------
# Serialisation


def to_json(definition: dict) -> str:
    """The bake file in JSON form (bake evaluates templates in its strings too: see the module docstring)."""
    return json.dumps(_escaped(definition), indent=2, sort_keys=False) + "\n"


def _hcl_string(value: str) -> str:
    # JSON escaping is HCL's too; an interpolation we did not write must not be evaluated.
    return json.dumps(str(value) if isinstance(value, Interp) else escape_template(value))


def _hcl_value(value, indent: str) -> str:
    if isinstance(value, str):
        return _hcl_string(value)
    if isinstance(value, list):
        return "[" + ", ".join(_hcl_value(v, indent) for v in value) + "]"
    if isinstance(value, dict):
        inner = indent + "  "
        lines = [f"{inner}{_hcl_key(k)} = {_hcl_value(v, inner)}" for k, v in value.items()]
        return "{\n" + "\n".join(lines) + f"\n{indent}}}"
    raise TypeError(type(value))


def _hcl_key(key: str) -> str:
    return key if _TARGET_NAME.fullmatch(key) and not key[0].isdigit() and "." not in key else json.dumps(key)


def to_hcl(definition: dict, header: str) -> str:
    out = [f"# {line}" if line else "#" for line in header.splitlines()] + [""]
    for name, body in definition["variable"].items():
        desc = VARIABLES.get(name, (None, "CA bundle passed to builds as the pip_cert secret"))[1]
        out += [f"# {desc}", f'variable "{name}" {{', f"  default = {_hcl_string(body['default'])}", "}", ""]
    for name, body in definition["group"].items():
        out += [f'group "{name}" {{', f"  targets = {_hcl_value(body['targets'], '  ')}", "}", ""]
    for name, body in definition["target"].items():
        out.append(f'target "{name}" {{')
        for key, value in body.items():
            if key == "args":
                # Conditional expressions are written raw so bake evaluates them.
                inner = "\n".join(f'    {k} = {_raw_expr(v)}' for k, v in value.items())
                out.append(f"  args = {{\n{inner}\n  }}")
            elif key == "secret":
                out.append("  secret = [" + ", ".join(_hcl_interp(v) for v in value) + "]")
            else:
                out.append(f"  {_hcl_key(key)} = {_hcl_value(value, '  ')}")
        out += ["}", ""]
    return "\n".join(out)


def _raw_expr(value: str) -> str:
    assert value.startswith("${") and value.endswith("}")
    return value[2:-1]


def _hcl_interp(value: str) -> str:
    # A string with one ${VAR} we wrote ourselves: keep the interpolation (anything else is escaped).
    return _hcl_string(value)
