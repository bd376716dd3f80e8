"""The request a command plans: the recipes it names (catalogue names, project trees, --ref/--git sources)
at the versions it asks, made into a MatrixRequest from the resolved Options, and the plan of that
matrix with every per-cell change the options ask for (layout, platforms, offline, the GPU check) and the
locked base images pinned. Every command that plans a matrix (plan, bake, build, push, pull, lock) goes
through ``planned``; a native build's one cell, planned for this host's toolchain, through ``native_request``."""

from __future__ import annotations

import dataclasses
import re
import sys
from pathlib import Path
from typing import Callable, Mapping, Sequence

from imagegen import safety
from imagegen.errors import CompatError, NothingToDoError, UsageError
from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import Catalogue
from imagegen.model import compat
from imagegen.model.cell import BUILDABLE, Cell, HostToolchain, MatrixRequest, Plan
from imagegen.model.recipes import JOB_FLAGS, Recipe, RecipeVersion, fetched_from, with_env, with_memory_for
from imagegen.model.source_tree import looks_like_path, read_tree, recipe_from_source_tree, with_declared_version
from imagegen.outputs import shown
from imagegen.plan import refs
from imagegen.plan.matrix import (
    choose_cell,
    defaults,
    device_requests,
    expand,
    gpu_checked,
    offline,
    preflight,
    with_gpu_check,
    with_layout,
    with_offline,
)
from imagegen.plan.options import Options
from imagegen.plan.platforms import with_requested_platforms
from imagegen.plan.registry import Lock


def recipe_at(cat: Catalogue, name: str | None, source: Path | None, wanted_version: str | None,
              fetch: str | None = None, env: Mapping[str, str] | None = None, *, ref: str | None = None,
              git: str | None = None, jobs: tuple[str, str] = JOB_FLAGS,
              build: refs.BuildCredentials | None = None) -> tuple[Recipe, RecipeVersion]:
    """The recipe ``name`` (or the project tree ``source``, or a path given as the name) at the version
    asked: a pinned version, --ref/--git resolved to a commit, or a tree's own; with the user's --env on
    top of the version's."""
    if source is not None and name is not None:
        # "this recipe, from this tree": the tree's one cell, with the recipe's knowledge (as a fork's --src-dir)
        return with_build_env(*recipe_from_tree(cat, name, source, wanted_version), env or {}, jobs)
    if source is None and name is not None and looks_like_path(name):
        source = Path(name)
    if source is not None:
        recipe = recipe_from_source_tree(source)
        known = cat.by_distribution(recipe.distribution)
        if known is not None:  # a tree of a package the catalogue knows: built with that recipe's knowledge
            recipe, version = refs.at_tree(known, known.version(None), source, wanted_version, tree=recipe)
            return with_build_env(recipe, version, env or {}, jobs)
        # your own project: named by the version it states, else the one --version declares
        recipe = with_declared_version(recipe, wanted_version)
        wanted_version = None
        if recipe.version(None).source_version is None:
            print(f"imagegen: warning: {recipe.version(None).resolved}", file=sys.stderr)
    elif name is None:
        raise UsageError("name a recipe (imagegen recipes lists them) or give --source PATH")
    else:
        recipe = cat.get(name)
    if ref or git:
        if fetch == "sdist":
            raise UsageError("--fetch sdist builds a pinned version's source distribution; --ref/--git fetch from git")
        recipe, version = refs.at_ref(recipe, ref, git, wanted_version, build)
    else:
        recipe, version = fetched_from(recipe, recipe.version(wanted_version), fetch)
    return with_build_env(recipe, version, env or {}, jobs)


def recipe_from_tree(cat: Catalogue, name: str, source: Path, wanted_version: str | None) -> tuple[Recipe, RecipeVersion]:
    """``NAME --source TREE``: the recipe ``name`` built from the tree (refs.at_tree: a local tree with that
    recipe's arch knob, patches and variables for the tree's version), one cell. A tree that states another
    project's name is refused in one line, saying which to give."""
    if looks_like_path(name):
        raise UsageError(f"{shown(name, 60)} and --source {shown(source, 60)} are two trees: give one tree per"
                         " --source, or name the recipe the tree is (NAME --source TREE)")
    recipe = cat.get(name)
    tree = recipe_from_source_tree(source)

    def key(text: str) -> str:
        return re.sub(r"[-_.]+", "-", text).lower()

    # A project name the tree states (not its folder's, which is all a name read from nowhere is) that is
    # not this recipe's: another package, not a fork of this one.
    root = tree.source_path or source
    stated = read_tree(root).name != root.name  # read_tree falls back to the folder's name, as it is
    if stated and key(tree.name) not in {key(n) for n in (recipe.name, recipe.distribution, *recipe.aliases)}:
        other = cat.by_distribution(tree.distribution)
        instead = f"`{other.name} --source TREE`" if other is not None else "the tree alone (--source TREE)"
        theirs = "" if key(recipe.distribution) == key(recipe.name) else f" ({recipe.distribution})"
        raise UsageError(f"--source {shown(source, 60)} is the project {tree.name}, not {recipe.name}{theirs}:"
                         f" give {instead}, or name the recipe the tree is a copy of")
    return refs.at_tree(recipe, recipe.version(None), source, wanted_version, tree=tree)


def with_build_env(recipe: Recipe, version: RecipeVersion, env: Mapping[str, str],
                   jobs: tuple[str, str]) -> tuple[Recipe, RecipeVersion]:
    """The user's --env on top of the version's, and the recipe's memory figure for that environment."""
    version = with_env(recipe, version, dict(env), jobs)
    return with_memory_for(recipe, version.env), version


def matrix(opts: Options, cat: Catalogue) -> MatrixRequest:
    """The matrix the options ask for: each recipe (named, the config's, or every one; or the --source
    trees) at each version, on the axes given (empty ones are filled per cell by the default policy)."""
    sources = list(opts.sources)
    names = list(opts.recipes) or ([] if sources else cat.names())
    pairs, seen = [], set()
    if names and sources:
        # NAME --source TREE: that recipe, from that tree, one cell (not the catalogue's cell and the tree's).
        if len(names) != 1 or len(sources) != 1:
            raise UsageError("a recipe name with --source means that recipe built from that tree: give one of each"
                             " (NAME --source TREE), or the trees alone (--source TREE ...)")
        names, sources, named_tree = [], [], (names[0], sources[0])
    else:
        named_tree = None
    # A recipe named twice (sage SAGE sageattention) or one project given twice is built once.
    ref, git = opts.ref, opts.git
    if (ref or git) and (sources or len({cat.get(n).name if not looks_like_path(n) else n for n in names}) != 1):
        raise UsageError("--ref/--git name one recipe's source: give exactly one recipe with them")
    # Several versions (a team's flash-attn matrix's FA_VERSIONS="2.8.2 2.8.3"): each recipe's cells at each of them.
    versions = one_version_per_source(opts)
    for recipe, version in [recipe_at(cat, n, None, v, opts.fetch, opts.env, ref=ref, git=git, jobs=opts.jobs_fix,
                                      build=opts.build_credentials)
                            for n in names for v in versions] \
            + [recipe_at(cat, None, source, versions[0], opts.fetch, opts.env, jobs=opts.jobs_fix) for source in sources] \
            + ([recipe_at(cat, named_tree[0], named_tree[1], versions[0], opts.fetch, opts.env, jobs=opts.jobs_fix)]
               if named_tree else []):
        key = (recipe.name, version.version, str(recipe.source_path) if recipe.source_path else None)
        if key not in seen:
            seen.add(key)
            pairs.append((recipe, version))
    archs = []
    for a in opts.archs:
        parsed = parse_arch_list(a)
        if str(parsed) not in {str(x) for x in archs}:
            archs.append(parsed)
    return MatrixRequest(
        recipes=pairs,
        torch=list(opts.torch),
        cuda=list(opts.cuda),
        python=list(opts.python),
        archs=archs,
        flavor=opts.flavor,
        base_image=opts.base_image,
        torch_index_override=opts.torch_index_url,
        flavor_given=opts.flavor_given,
        platforms=tuple(opts.platforms),
    )


def one_version_per_source(opts: Options) -> tuple[str | None, ...]:
    """The --version values a matrix is planned at ((None,): each recipe's default). Several versions are
    several pins of a catalogue recipe; a source given as it is (--ref, --git, --source, a path) is one
    version, so it takes one --version."""
    versions = opts.versions
    if len(versions) > 1:
        given = [flag for flag, value in (("--ref", opts.ref), ("--git", opts.git), ("--source", opts.sources))
                 if value] + (["a project path"] if any(looks_like_path(n) for n in opts.recipes) else [])
        if given:
            raise UsageError(f"--version {' '.join(versions)}: {given[0]} is one source, of one version: give one"
                             " --version with it (several versions are several pins of a catalogue recipe)")
    return versions or (None,)


def planned(opts: Options, cat: Catalogue, lock: Lock | None = None) -> Plan:
    """The matrix expanded, with the base images ``lock`` holds pinned to their digests (None: the tags, as
    `imagegen lock` wants them); a cell asked twice (``sage SAGE``, ``--torch 2.8 --torch 2.8.0``, ``--cuda
    12.8 --cuda cu128``) is there once."""
    request = matrix(opts, cat)
    # a flavor whose images each serve one device (jetson) plans its devices' own cells on open axes
    requests = device_requests(request, torch=opts.torch_one is not None, cuda=opts.cuda_one is not None,
                               python=opts.python_one is not None, arch=opts.arch_configured is not None)
    expanded = Plan(cells=[c for r in requests for c in expand(r).cells])
    plan = with_requested_platforms(with_layout(unique_cells(expanded), opts.layout), opts.platforms, request.flavor)
    if opts.offline:
        plan = with_offline(plan)
    plan = plan.each(gpu_check_step(opts))
    return lock.pin_bases(plan) if lock is not None else plan


def gpu_check_step(opts: Options) -> Callable[[Cell], Cell]:
    """The per-cell change --gpu-check-device asks for (the GPU check inside the build; none without it),
    its values checked now."""
    if opts.dockerfile_frontend is not None and opts.gpu_check_device is None:
        raise UsageError("--dockerfile-frontend goes with --gpu-check-device (only `RUN --device` needs a labs frontend)")
    # `is not None`: an empty value (an unset shell variable) is refused by with_gpu_check, not taken as no flag.
    if opts.gpu_check_device is None:
        return lambda cell: cell
    device, frontend = opts.gpu_check_device, opts.dockerfile_frontend
    with_gpu_check(Plan(), device, frontend)  # refuses a bad device or frontend even where no cell is built
    return lambda cell: gpu_checked(cell, device, frontend)


def unique_cells(plan: Plan) -> Plan:
    seen: set = set()
    cells = []
    for c in plan.cells:
        key = (c.name, str(c.archs), c.status)
        if key not in seen:
            seen.add(key)
            cells.append(c)
    return dataclasses.replace(plan, cells=cells)


def one_target_per_cell(plan: Plan) -> Plan:
    """bake/build/pull make one bake target per cell, named by the cell: two arch lists of one cell
    would be two targets of one name (bake keeps one of them, or refuses the file)."""
    archs: dict[str, str] = {}
    for c in plan.buildable:
        other = archs.setdefault(c.name, str(c.archs))
        if other != str(c.archs):
            raise UsageError(f"{c.name} is asked for two arch lists ({other} and {c.archs}): a build makes one target"
                             f" per cell; give one --arch list (e.g. --arch '{other};{c.archs}'), or run once per list")
    return plan


def buildable(plan: Plan, *, arch_free: bool = False, say: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> Plan:
    """The plan to build: one cell per target name (a builder image, ``arch_free``, is one per cell whatever
    the arch lists), each rejected cell said; NothingToDoError when none can build."""
    if arch_free:
        names: set[str] = set()
        plan = dataclasses.replace(plan, cells=[c for c in plan.cells if not (c.status == BUILDABLE and (
            c.name in names or names.add(c.name)))])
    else:
        plan = one_target_per_cell(plan)
    for c in plan.rejected:
        say(f"[{c.name}] rejected: {'; '.join(c.problems)}")
    if not plan.buildable:
        raise NothingToDoError("no cell of this matrix can build (imagegen plan explains each)")
    return plan


def native_request(opts: Options, cat: Catalogue, name: str | None, source: Path | None, src_dir: Path | None,
                   host: HostToolchain) -> Cell:
    """A native build's (or audit's) one cell: the recipe ``name`` (or the tree ``source``) at the one
    version asked, as the checkout in ``src_dir`` has it, planned for this host's toolchain."""
    if len(opts.versions) > 1:
        raise UsageError(f"--native builds one version at a time (for this host's torch): give one --version, not"
                         f" {' '.join(opts.versions)}")
    wanted = opts.versions[0] if opts.versions else None
    recipe, version = recipe_at(cat, name, source, wanted, opts.fetch, opts.env, ref=opts.ref, git=opts.git,
                                jobs=opts.jobs_fix)
    recipe, version = local_checkout(recipe, version, src_dir, wanted)
    return native_cell(opts, recipe, version, host)


def local_checkout(recipe: Recipe, version: RecipeVersion, src_dir: Path | None,
                   wanted: str | None) -> tuple[Recipe, RecipeVersion]:
    """``--src-dir`` on an existing checkout of a git recipe (a native build, a Windows script): the pin as
    it is, or a fork or changed tree built as a local tree with the recipe's knowledge (refs.at_tree); a
    folder that holds no project yet (the build clones into it) leaves the recipe as it is."""
    if src_dir is None or recipe.source_kind != "git" or not any(
            safety.is_file(Path(src_dir) / f) for f in ("setup.py", "pyproject.toml")):
        return recipe, version
    return refs.at_tree(recipe, version, Path(src_dir), wanted)


def native_cell(opts: Options, recipe: Recipe, version: RecipeVersion, host: HostToolchain, *,
                say: Callable[[str], None] = lambda m: print(m, file=sys.stderr)) -> Cell:
    """The one cell a native build makes: this host's torch, CUDA and Python, for the --arch list (else
    the config's, else this host's GPUs: a Colab user's fork builds for the Colab GPU it runs on, else the
    default list, said in one line on stderr: a GPU-less runtime would otherwise build the default silently),
    or a one-line error. --torch/--cuda/--python describe the host here: a mismatch is refused instead of building the
    wrong thing."""
    if len(opts.archs) > 1:
        raise UsageError("--native takes one --arch list")
    for axis, have in (("torch", host.torch), ("cuda", host.torch_cuda), ("python", host.python)):
        for asked in opts.axes_given.get(axis, ()):
            if not same_value(f"--{axis}", asked, have):
                raise UsageError(f"--{axis} {asked} asked, but this host has {have}: a native build uses the host's;"
                                 " install the one you want, or build in a container")
    archs = one_arch_list(opts, gpus=host.ccs)
    cell = preflight(recipe, version, archs, host)
    if opts.arch_configured is None and not host.ccs:
        say(f"no GPU seen on this host (nvidia-smi lists none): building for the default arch list {archs}"
            " instead; choose with --arch (e.g. --arch 7.5 for a T4, --arch 9.0 for an H100)")
    return dataclasses.replace(cell, layout=opts.layout)


def same_value(flag: str, asked: str, have: str | None) -> bool:
    """Whether ``have`` (an interpreter's torch, torch's CUDA or Python: 2.8.0, 12.9, 3.12) is what --torch,
    --cuda or --python ``asked`` (2.8, 2.8.0; 12.9, cu129; 3.12)."""
    if have is None:
        return False
    if flag == "--cuda" and compat.cuda_variant(asked).dotted == have:
        return True
    return have == asked or have.startswith(asked + ".")


def one_arch_list(opts: Options, gpus: Sequence[str] = ()) -> ArchList:
    """The arch list of a command that makes one cell or one script (render, render --shell, a native
    build): --arch, else the config's, else ``gpus`` (a native build's: this host's), else the default."""
    return parse_arch_list(opts.arch_configured or ";".join(gpus) or defaults()["arch"])


def one_cell(opts: Options, recipe: Recipe, version: RecipeVersion) -> Cell:
    """render's one cell: the --arch list (else the config's, else the default) with the one cell the
    default policy chooses where an axis is open (a config matrix narrows the choice; its last entry, the
    newest listed, wins), on one platform, offline and GPU-checked as asked; or a one-line CompatError
    naming why it cannot build."""
    cell = choose_cell(recipe, version, one_arch_list(opts), torch=opts.torch_one, cuda=opts.cuda_one,
                       python=opts.python_one, flavor=opts.flavor, base_image=opts.base_image, torch_index_override=opts.torch_index_url,
                       flavor_given=opts.flavor_given, platforms=tuple(opts.platforms))
    if len(opts.platforms) > 1:
        raise UsageError("render makes one cell's Dockerfile: give one --platform (bake and build take several)")
    cell = with_requested_platforms(Plan(cells=[cell]), opts.platforms, cell.flavor).cells[0]
    if not cell.buildable:
        raise CompatError(f"{cell.name}: " + "; ".join(cell.problems))
    if opts.offline:
        cell = offline(cell)
        if not cell.buildable:
            raise CompatError(f"{cell.name}: " + "; ".join(cell.problems))
    return gpu_check_step(opts)(cell)
