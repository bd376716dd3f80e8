"""``imagegen ci github``: the command that writes a GitHub Actions workflow (imagegen.render.workflow
renders it) for a bake file's targets and, with ``--windows``, a matrix of Windows cells.

Every value is checked here before it reaches the workflow (registry, namespace, runner labels, bake file,
target and group names, output folders, publish destinations, the requirement, the Windows recipes and
matrix, the timeouts). The Linux matrix is read from the bake file by imagegen itself (a JSON bake file, or
HCL as imagegen writes it: imagegen.render.bake_read), so no docker is needed to write the workflow; where
the docker CLI with buildx is there, ``docker buildx bake --print`` reads it too and both must agree, so
the workflow builds exactly what bake would.

The Windows cells (``--windows RECIPE`` x ``--windows-version`` x ``--windows-torch`` x ``--windows-cuda`` x
``--windows-python`` x ``--windows-arch``) are planned by imagegen.plan.matrix.windows_plan, the planner of `imagegen
plan` and `render --shell`, with the toolkit each job installs as its nvcc. The matrix is taken as given: a
cell the plan rejects (a torch x CUDA pair torch never shipped, as a team's flash-attn matrix has in its own table; CUDA 12.6 with arch
12.0) is left out, and the command says which and why (on stderr and in the workflow's header); only a matrix
none of whose cells can build is refused.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import posixpath
import re
import subprocess
import sys
from pathlib import Path

from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from imagegen import DISTRIBUTION, __version__, safety
from imagegen.model.cell_rules import FixWords
from imagegen.errors import CompatError, UsageError, bounded
from imagegen.model import build_cost
from imagegen.model.destinations import parse_destination
from imagegen.outputs import resolve_target, write_output
from imagegen.render.bake_read import read_bake
from imagegen.render.workflow import (
    CELL_VALUE,
    DEFAULT_ARM64_RUNS_ON,
    DEFAULT_BAKE_FILE,
    DEFAULT_GROUP,
    DEFAULT_RUNS_ON,
    DEFAULT_TIMEOUT,
    DEFAULT_WINDOWS_RUNS_ON,
    DEFAULT_WINDOWS_TIMEOUT,
    MAX_TIMEOUT_MINUTES,
    NAMESPACE_EXPRESSIONS,
    RUNNER_LIMIT_MINUTES,
    DEFAULT_BRANCH,
    DEFAULT_TAG,
    FILTER,
    TRIGGER_WORDS,
    Options,
    Triggers,
    WindowsCell,
    WindowsRequest,
    render_workflow,
    resume_budget,
    windows_packages,
    windows_toolkit,
)
from imagegen.render.workflow_targets import (
    BAKE_NAME,
    MAX_MATRIX_JOBS,
    WorkflowTarget,
    fallback_targets,
    targets_from_print,
    validate_text,
)
from imagegen.shipped.builder import imagegen_wheeltools as wheeltools

# A registry host as docker reads it: a dotted name or localhost, with an optional port. A first path
# component without a dot or port would be taken for a Docker Hub namespace instead.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
REGISTRY = re.compile(rf"(?:localhost|{_LABEL}(?:\.{_LABEL})+)(?::[0-9]{{1,5}})?")
# Repository path components of an image reference (lower case, as the registry requires).
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
NAMESPACE = re.compile(rf"{_COMPONENT}(?:/{_COMPONENT}){{0,7}}")
# --push-builders REGISTRY/NAMESPACE: a registry host and a namespace, as the two flags above take them.
BUILDERS = re.compile(rf"{REGISTRY.pattern}/{NAMESPACE.pattern}")
RUNNER_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A --windows recipe as given (a catalogue name or alias; looked up in the catalogue after this check).
WINDOWS_RECIPE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
# A publish destination as it reaches the workflow: its kind and characters safe in YAML and in an
# environment variable (no quotes, spaces, $ or braces, so no GitHub expression either; no newline, which
# separates destinations in PUBLISH_TO). Each is then parsed as `imagegen publish --to` parses it
# (imagegen.model.destinations.parse_destination), so the job never meets one publish refuses.
PUBLISH_DEST = re.compile(r"(?:pypi:https?://|hf:|github:|s3://)[A-Za-z0-9._~:/@%+=,-]{1,400}")
# How the publish job installs imagegen: a pip requirement (name[extras] @ URL, a path, name==version);
# it cannot start with '-' (a pip option).
REQUIREMENT = re.compile(r"[A-Za-z0-9.][A-Za-z0-9._\[\],@ :/+=<>!~#%-]{0,299}")
# torch, CUDA and Python as given (compat reads each; this keeps its messages short).
_VERSION_ARG = re.compile(r"[A-Za-z0-9][A-Za-z0-9.+]{0,31}")
# One GPU arch list as given (parse_arch_list reads it): 8.0;9.0;12.0+PTX, sm_90a, Hopper, "8.0 9.0" ...
_ARCH_ARG = re.compile(r"[A-Za-z0-9][A-Za-z0-9._;:+, -]{0,199}")


def requirement_problem(requirement: str) -> str | None:
    """Why pip, given ``requirement``, would not install this imagegen (the distribution imagegen-wheels), or
    None. By the name 'imagegen' alone pip takes PyPI's 'imagegen', another project, whatever follows a '#'
    (pip reads `` #...`` as a comment in a requirements file, and no name goes on past one), in any spelling
    of the name (``IMAGEGEN``, ``imagegen[publish]>=1``); with a URL, pip refuses the project there, whose
    metadata says imagegen-wheels. ``imagegen-wheels[publish]>=1``, a URL under that name, a path: None."""
    head = requirement.split("#", 1)[0].strip()
    try:
        parsed = Requirement(head)
    except InvalidRequirement:
        return None  # a path or a URL (./tools/imagegen, git+https://...): not a name pip looks up
    if canonicalize_name(parsed.name) != "imagegen":
        return None
    if parsed.url is None:
        return "would install PyPI's 'imagegen', another project"
    return (f"names 'imagegen', but the project at {parsed.url} is the distribution {DISTRIBUTION} (pip refuses a"
            " URL whose metadata has another name)")


def validate_timeout(minutes: int, flag: str) -> int:
    """A job's timeout-minutes: below the hosted runner's own limit, so the job's stops it first."""
    if not 1 <= minutes <= MAX_TIMEOUT_MINUTES:
        raise UsageError(f"{flag} must be between 1 and {MAX_TIMEOUT_MINUTES} minutes (GitHub stops a hosted job"
                         f" after {RUNNER_LIMIT_MINUTES}, saving nothing)")
    return minutes


def _names(values: list[str] | None) -> list[str]:
    """``--targets a,b --targets c`` -> [a, b, c] (commas and spaces separate)."""
    out: list[str] = []
    for value in values or []:
        for name in re.split(r"[,\s]+", value.strip()):
            if name and name not in out:
                out.append(name)
    return out


# --------------------------------------------------------------------------------------------
# Command line


def add_parser(subparsers) -> argparse.ArgumentParser:
    """Add ``ci`` (with its ``github`` subcommand) to ``subparsers``: ``ci`` alone, as
    tests/workflow_cli.py parses it (imagegen's parser adds it from its table, as every command). Its
    options are data, in imagegen.commands.cli_ci."""
    from imagegen.commands import cli_ci, cli_spec

    return cli_spec.add_command(subparsers, cli_ci.CI)


def run(args: argparse.Namespace) -> int:
    """``imagegen ci github``."""
    if getattr(args, "ci_command", None) != "github":
        raise UsageError("imagegen ci: name a CI provider: github")
    options = options_from_args(args)
    root = Path.cwd()
    _validate_top_folder(root)
    # The Windows cells first: a matrix none of whose cells can build stops here, before the bake file is read.
    cells, left_out = windows_cells(options.windows, root) if options.windows else ([], [])
    for line in left_out:
        print(f"imagegen: left out of the Windows jobs: {line}", file=sys.stderr)
    targets: list[WorkflowTarget] = []
    if options.linux:
        if not (root / options.bake_file).is_file():
            raise UsageError(f"--bake-file {options.bake_file}: no such file in {root} (write it with `imagegen bake"
                             " --repo` or `imagegen bake -f FILE`, and run imagegen ci github in the repository's top"
                             " folder)")
        # Read by imagegen itself (no docker needed to write a YAML file) and, where the docker CLI with buildx
        # is there, checked against `docker buildx bake --print` (imagegen.render.bake_read).
        printed = read_bake(Path(options.bake_file), root, targets=options.selection)
        names = fallback_targets(printed)  # in no group: printed by name
        targets = targets_from_print(printed, read_bake(Path(options.bake_file), root, targets=names) if names else None)
        if options.skip_published is not None:
            for t in targets:
                if not t.inputs:
                    raise UsageError(f"--skip-published: bake target {t.name} has no io.imagegen.inputs label (a bake file"
                                     " written by an older imagegen): write it again with imagegen bake")
        if options.builders is not None:
            for t in targets:
                if not t.builder:
                    raise UsageError(f"--push-builders: bake target {t.name} has no io.imagegen.builder label (a bake"
                                     " file written by an older imagegen): write it again with imagegen bake")
    elif options.skip_published is not None:
        raise UsageError("--skip-published applies to the Linux jobs of a bake file; the Windows jobs always build")
    if not options.triggers.given:
        options = dataclasses.replace(options, triggers=default_triggers(options, root, printed if options.linux else None))
    text = render_workflow(options, targets, cells, left_out=left_out)
    write_output(text, options.output, what="workflow file")
    if options.output != "-":
        jobs = []
        if options.linux:
            jobs.append(f"{len(targets)} Linux jobs, one per target of {options.describe_selection()} in"
                        f" {options.bake_file}")
        if cells:
            jobs.append(f"{len(cells)} Windows job{'s' if len(cells) != 1 else ''}, one per cell"
                        + (f" ({len(left_out)} left out, listed above)" if left_out else ""))
        if options.publish:
            jobs.append("a publish job")
        if options.builders is not None:
            jobs.append(f"each Linux job pushing its builder image to {options.builders_shown} and a lock job"
                        " uploading imagegen.lock")
        print(f"wrote {options.output}: {', '.join(jobs)}", file=sys.stderr)
        if targets:
            for line in build_cost.sizing_lines([(t.name, t.cpu_hours, t.wall_hours) for t in targets],
                                                resume_budget(options.timeout)):
                print(line, file=sys.stderr)
    return 0


def options_from_args(args: argparse.Namespace) -> Options:
    """``imagegen ci github``'s flags, each checked before anything reaches the workflow."""
    windows = windows_request(args)
    bake_file_given = getattr(args, "bake_file", None) is not None
    linux = windows is None or bake_file_given or args.targets is not None or args.group is not None
    bake_file = safety.validate(args.bake_file if bake_file_given else DEFAULT_BAKE_FILE, safety.RELATIVE_PATH,
                                "--bake-file")
    targets = tuple(validate_text(n, BAKE_NAME, "--targets name", "bake target names of letters, digits, '_' and '-'")
                    for n in _names(args.targets))
    if args.targets is not None and not targets:
        raise UsageError("--targets: name at least one bake target")
    group = validate_text(args.group or DEFAULT_GROUP, BAKE_NAME, "--group", "a bake group name of letters, digits, '_' and '-'")
    registry = validate_text(args.registry, REGISTRY, "--registry",
                      "a registry host such as ghcr.io or registry.example.com:5000 (lower case, no scheme or path)")
    namespace = args.namespace
    if namespace not in NAMESPACE_EXPRESSIONS:
        validate_text(namespace, NAMESPACE, "--namespace", "a lower-case image path such as my-org or my-org/wheels,"
               f" or one of {', '.join(NAMESPACE_EXPRESSIONS)}")
    push_builders, builders = builders_repo(args, registry, namespace, linux)
    runs_on = tuple(validate_text(label, RUNNER_LABEL, "--runs-on label", "runner labels of letters, digits, '.', '_' and '-'")
                    for label in _names(args.runs_on or [DEFAULT_RUNS_ON]))
    if not runs_on:
        raise UsageError("--runs-on: name at least one runner label")
    arm64_runs_on = tuple(validate_text(label, RUNNER_LABEL, "--arm64-runs-on label",
                                        "runner labels of letters, digits, '.', '_' and '-'")
                          for label in _names(getattr(args, "arm64_runs_on", None) or [DEFAULT_ARM64_RUNS_ON]))
    if not arm64_runs_on:
        raise UsageError("--arm64-runs-on: name at least one runner label")
    timeout = DEFAULT_TIMEOUT if args.timeout is None else validate_timeout(args.timeout, "--timeout")
    # The workflow is committed and its logs are public: a private wheelhouse's access belongs in the runner.
    skip_published = None if args.skip_published is None else safety.served_folder_url(
        args.skip_published, "--skip-published", "serve the published wheelhouse where the build jobs can read it")
    if args.max_parallel is not None and not 1 <= args.max_parallel <= MAX_MATRIX_JOBS:
        raise UsageError(f"--max-parallel must be between 1 and {MAX_MATRIX_JOBS}")
    output = args.output
    if not output:
        raise UsageError("--output: give a file, or - for stdout")
    if output != "-":
        resolve_target(output, "workflow file")  # a device, folder or odd name: refused before buildx runs
    publish = tuple(validate_text(d, PUBLISH_DEST, "--publish", "a destination as imagegen publish --to takes it:"
                           " pypi:URL, hf:OWNER/REPO[@REVISION][:PATH], github:OWNER/REPO@TAG,"
                           " s3://BUCKET[/PREFIX][,layout=wheelhouse]")
                    for d in dict.fromkeys(getattr(args, "publish", None) or []))
    for dest in publish:  # the workflow is committed: a credential there is public
        safety.no_credentials(dest.removeprefix("pypi:"), "--publish", safety.CI_SECRET_INSTEAD
                              + " (TWINE_USERNAME/TWINE_PASSWORD, HF_TOKEN, IMAGEGEN_GITHUB_TOKEN, AWS_*)")
        parse_destination(dest, "--publish")
    wheelhouse_dests = [d for d in publish if d.startswith("s3://") and parse_destination(d, "--publish").wheelhouse]
    if wheelhouse_dests and skip_published is None:
        raise UsageError(f"--publish {wheelhouse_dests[0]} holds the wheelhouse as served: give --skip-published URL"
                         " too, the URL that prefix is served at, whose index the publish job merges with this run's"
                         " (imagegen index --merge) and whose published cells the build jobs skip")
    # How the publish job and the Windows jobs install imagegen: this release of imagegen-wheels from PyPI
    # (Options.publish_requirement, windows_requirement), or what --imagegen-from names.
    imagegen_from = getattr(args, "imagegen_from", None)
    if imagegen_from is not None:
        if not publish and windows is None:
            raise UsageError("--imagegen-from is for the publish job and the Windows jobs: give --publish DEST or"
                             " --windows RECIPE too")
        validate_text(imagegen_from, REQUIREMENT, "--imagegen-from", "a pip requirement such as"
               f" '{DISTRIBUTION}[publish] @ git+https://github.com/ORG/imagegen@TAG' (no quotes, $, ; or braces)")
        safety.no_credentials(imagegen_from, "--imagegen-from", "keep imagegen's source public, in the repository"
                              " itself (a path such as ./tools/imagegen), or reachable with the job's own token")
        problem = requirement_problem(imagegen_from)
        if problem:
            # By name alone pip would install PyPI's 'imagegen', another project, into the job that
            # holds the publish secrets; by URL it would refuse the project's own name.
            raise UsageError(f"--imagegen-from {imagegen_from!r} {problem}: name this one {DISTRIBUTION}, e.g."
                             f" '{DISTRIBUTION}[publish]=={__version__}', '{DISTRIBUTION}[publish] @"
                             " git+https://github.com/ORG/imagegen@TAG' or './tools/imagegen'")
    triggers = parse_triggers(getattr(args, "on", None))
    if publish and triggers.given and not (triggers.dispatch or triggers.tags or triggers.push_all):
        raise UsageError("--publish: the publish job runs on a tag push or a manual run, and --on gives neither: add"
                         f" --on dispatch or --on tag:{DEFAULT_TAG}")
    opts = Options(triggers=triggers, bake_file=bake_file, targets=targets, group=group, registry=registry, namespace=namespace,
               runs_on=runs_on, max_parallel=args.max_parallel, output=output, publish=publish, timeout=timeout,
               skip_published=skip_published,
               arm64_runs_on=arm64_runs_on, push_builders=push_builders, builders=builders,
               imagegen_from=imagegen_from, linux=linux, windows=windows)
    # The reference buildx will see (an expression stands for a lower-case owner/repo): well formed?
    safety.validate(f"{opts.cache_repo_shown.replace('<', '').replace('>', '')}:tag", safety.IMAGE_REF,
                    "cache reference")
    return opts


def parse_triggers(values: list[str] | None) -> Triggers:
    """``--on`` (repeatable; None: the default, which default_triggers completes): each a word of
    TRIGGER_WORDS, its patterns checked as GitHub filters of plain characters."""
    if values is None:
        return Triggers()
    dispatch = push_all = pr = False
    branches: list[str] = []
    tags: list[str] = []
    paths: list[str] = []
    given: list[str] = []
    for raw in values:
        spec = raw.strip()
        kind, sep, value = spec.partition(":")
        if spec in ("dispatch", "push", "pr"):
            dispatch, push_all, pr = dispatch or spec == "dispatch", push_all or spec == "push", pr or spec == "pr"
        elif sep and kind in ("tag", "branch", "paths"):
            items = [v for v in value.split(",") if v] if kind == "paths" else [value] if value else []
            if not items:
                raise UsageError(f"--on {kind}: give a pattern after the colon, e.g. --on {kind}:"
                                 + {"tag": DEFAULT_TAG, "branch": DEFAULT_BRANCH, "paths": "docker-bake.hcl"}[kind])
            for item in items:
                validate_text(item, FILTER, f"--on {kind}", "a GitHub filter pattern of letters, digits and . _ - / * +"
                              " ? [ ] (a leading ! negates)")
                if kind == "paths" and (item.lstrip("!").startswith("/") or ".." in item.split("/")):
                    raise UsageError(f"--on paths:{item}: give paths relative to the repository's top folder")
                bucket = {"tag": tags, "branch": branches, "paths": paths}[kind]
                if item not in bucket:
                    bucket.append(item)
        else:
            shown = bounded(repr(safety.redact(spec)), 80)
            raise UsageError(f"--on {shown}: give one of {', '.join(TRIGGER_WORDS)}")
        if spec not in given:
            given.append(spec)
    if push_all and (branches or tags):
        raise UsageError("--on push runs on every push already: leave out --on branch:/tag: (or --on push)")
    if paths and not (branches or pr):
        raise UsageError("--on paths: filters branch pushes and pull requests (GitHub reads no paths for a tag): give"
                         f" --on branch:{DEFAULT_BRANCH} or --on pr too")
    return Triggers(dispatch=dispatch, push_all=push_all, branches=tuple(branches), tags=tuple(tags), paths=tuple(paths),
                    pr=pr, given=tuple(given))


def default_branch(root: Path) -> str:
    """The checkout's default branch (origin/HEAD's), else main."""
    try:
        env = wheeltools.git_env(str(root))
        proc = subprocess.run(wheeltools.git_cmd(str(root), ["symbolic-ref", "--quiet", "--short",
                                                             "refs/remotes/origin/HEAD"], env=env),
                              env=env, capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired, wheeltools.UnsafeTree):
        return DEFAULT_BRANCH
    name = proc.stdout.strip().removeprefix("origin/") if proc.returncode == 0 else ""
    return name if name and FILTER.fullmatch(name) and not name.startswith("!") else DEFAULT_BRANCH


def default_triggers(options: Options, root: Path, printed: dict | None) -> Triggers:
    """The default `on:`: a manual run, tags v*, and pushes to the default branch that touch what the builds
    are made of: the bake file, the folders its targets build from (their contexts) and the workflow file."""
    paths: list[str] = []

    def add(path: str, folder: bool) -> None:
        rel = posixpath.normpath(path.replace(os.sep, "/"))
        if rel.startswith(("/", "../")) or rel == ".." or "://" in path or ":" in rel:
            return  # outside the checkout, a URL or another target: no file of the repository
        glob = "**" if rel == "." else f"{rel}/**" if folder else rel
        if not FILTER.fullmatch(glob) or glob.startswith("!"):
            raise UsageError(f"the default triggers would filter on {rel!r}, which is not a plain path: give --on"
                             f" dispatch --on tag:{DEFAULT_TAG} --on branch:{DEFAULT_BRANCH} --on paths:GLOBS")
        if glob not in paths:
            paths.append(glob)

    if printed is not None:
        add(options.bake_file, folder=False)
        for body in (printed.get("target") or {}).values():
            for context in [body.get("context") or ".", *(body.get("contexts") or {}).values()]:
                add(str(context), folder=True)
    if options.output != "-":
        try:
            add(os.path.relpath(Path(options.output).resolve(), root.resolve()), folder=False)
        except ValueError:
            pass  # another drive
    if "**" in paths:
        paths = []  # a target built from the whole checkout: every push to the branch
    return Triggers(dispatch=True, tags=(DEFAULT_TAG,), branches=(default_branch(root),), paths=tuple(paths))


def builders_repo(args: argparse.Namespace, registry: str, namespace: str, linux: bool) -> tuple[str | None, str | None]:
    """``--push-builders`` as given ('' bare, None absent) and the REGISTRY/NAMESPACE the builder images go to:
    the flag's value, else the config's registry (where `imagegen pull` and `imagegen lock` look), else
    --registry/--namespace. Checked like every value that reaches the workflow; its host is the one the
    workflow logs in to (--registry)."""
    raw = getattr(args, "push_builders", False)
    if raw is False:
        return None, None
    if not linux:
        raise UsageError("--push-builders pushes the Linux jobs' builder images: give --bake-file, --targets or --group"
                         " too (the Windows jobs make no image)")
    if raw:
        repo = validate_text(raw, BUILDERS, "--push-builders", "REGISTRY/NAMESPACE such as ghcr.io/my-team or"
                             " registry.example.com:5000/ml (lower case, no scheme, tag or credentials)")
    else:
        from imagegen.plan.config import load_config

        configured = load_config(search_from=Path.cwd()).registry  # validated when the config is read
        repo = validate_text(configured, BUILDERS, "the config's registry", "REGISTRY/NAMESPACE such as ghcr.io/my-team"
                             " (a host with a dot or a port)") if configured else f"{registry}/{namespace}"
    host = repo.split("/", 1)[0]
    if host != registry:
        raise UsageError(f"--push-builders: the builder images go to {host} but the workflow logs in to {registry}: give"
                         f" --registry {host} too (the build cache then goes there as well)")
    return raw or "", repo


def windows_request(args: argparse.Namespace) -> WindowsRequest | None:
    """``--windows`` and its matrix, checked as text (windows_cells plans it); None without --windows."""
    flags = {"--windows-torch": "windows_torch", "--windows-cuda": "windows_cuda", "--windows-python": "windows_python",
             "--windows-version": "windows_version", "--windows-arch": "windows_arch",
             "--windows-runs-on": "windows_runs_on", "--windows-timeout": "windows_timeout"}
    values = {flag: getattr(args, dest, None) for flag, dest in flags.items()}
    if getattr(args, "windows", None) is None:
        given = [flag for flag, value in values.items() if value is not None]
        if given:
            raise UsageError(f"{given[0]} goes with --windows RECIPE (the recipes the Windows jobs build)")
        return None
    recipes = tuple(validate_text(n, WINDOWS_RECIPE, "--windows recipe", "a recipe name or alias such as sage or"
                           " flash-attn (imagegen recipes lists them)") for n in _names(args.windows))
    if not recipes:
        raise UsageError("--windows: name at least one recipe (imagegen recipes lists them)")
    axes = {}
    for flag, what in (("--windows-torch", "a torch series or release such as 2.8"),
                       ("--windows-cuda", "a CUDA version such as 12.8 or cu128"),
                       ("--windows-python", "a CPython version such as 3.12"),
                       ("--windows-version", "a recipe version such as 2.8.3")):
        raw = values[flag]
        axes[flag] = tuple(validate_text(v, _VERSION_ARG, flag, what) for v in _names(raw))
        if raw is not None and not axes[flag]:
            raise UsageError(f"{flag}: give at least one version")
    for flag in ("--windows-torch", "--windows-cuda"):
        if not axes[flag]:
            raise UsageError(f"--windows needs {flag} (comma-separated versions): the Windows matrix is asked for,"
                             " never guessed")
    archs = tuple(dict.fromkeys(validate_text(a.strip(), _ARCH_ARG, "--windows-arch", "one GPU arch list such as"
                                       " '8.0;9.0;12.0' or 9.0+PTX per flag") for a in values["--windows-arch"] or []))
    runs_on = tuple(validate_text(label, RUNNER_LABEL, "--windows-runs-on label", "runner labels of letters, digits,"
                           " '.', '_' and '-'") for label in _names(values["--windows-runs-on"] or [DEFAULT_WINDOWS_RUNS_ON]))
    if not runs_on:
        raise UsageError("--windows-runs-on: name at least one runner label")
    timeout = values["--windows-timeout"]
    if timeout is None:
        timeout = DEFAULT_WINDOWS_TIMEOUT
    else:
        validate_timeout(timeout, "--windows-timeout")
    return WindowsRequest(recipes=recipes, torch=axes["--windows-torch"], cuda=axes["--windows-cuda"],
                          python=axes["--windows-python"], archs=archs, runs_on=runs_on, timeout=timeout,
                          versions=axes["--windows-version"])


# --------------------------------------------------------------------------------------------
# Windows jobs

# A rejected Windows cell's reason names the --windows-* flags that change it.
WINDOWS_FIXES = FixWords(torch="use --windows-torch {}", cuda="use --windows-cuda {}", python="use --windows-python {}",
                         version="--windows-version")


def windows_cells(request: WindowsRequest, root: Path) -> tuple[list[WindowsCell], list[str]]:
    """The Windows matrix as given, planned by imagegen.plan.matrix.windows_plan (the planner of `plan` and `render
    --shell`) with the toolkit each job installs as its nvcc: (one job per cell that can build, one line per
    cell left out saying why). CompatError when no cell can build."""
    from imagegen.plan.config import load_config
    from imagegen.model import compat
    from imagegen.model.arch_parse import parse_arch_list
    from imagegen.model.catalogue import load_catalogue
    from imagegen.model.cell import WindowsHost
    from imagegen.plan.matrix import defaults, windows_plan

    config = load_config(search_from=root)  # the checkout's, as `imagegen render` on the runner reads it
    cat = load_catalogue(tuple(config.recipe_dirs))
    recipes = {}
    for name in request.recipes:
        recipe = cat.get(name)
        for wanted in request.versions or (None,):
            version = recipe.version(wanted)
            # The job's script fetches the pinned source: a git ref, or the sdist a release newer than the
            # mirror is pinned by (causal-conv1d 1.7.0); a local tree is not on the runner.
            if recipe.source_kind == "local" or not (version.ref or version.sdist):
                raise UsageError(f"--windows {name}: the Windows script fetches the recipe's pinned source (a git ref"
                                 f" or an sdist), and {recipe.name} {version.version} has neither")
            recipes.setdefault((recipe.name, version.version), (recipe, version))
    left_out: list[str] = []
    toolkits: dict[str, str] = {}
    for variant in dict.fromkeys(compat.cuda_variant(c) for c in request.cuda):
        try:
            toolkits[variant.name] = windows_toolkit(variant)
        except CompatError as exc:  # no installer for it: every cell of that CUDA is left out
            left_out.append(f"every cell of CUDA {variant.dotted}: {exc}")
    archs = list({str(a): a for a in (parse_arch_list(a) for a in request.archs or [defaults()["arch"]])}.values())
    plan = windows_plan(list(recipes.values()), archs, WindowsHost(toolkits=tuple(toolkits.items()), fixes=WINDOWS_FIXES),
                        torch=request.torch, cuda=list(toolkits), python=request.python) if toolkits else None
    cells: list[WindowsCell] = []
    seen: dict[str, str] = {}
    for cell in plan.cells if plan else []:
        requested = cell.requested_archs
        if not cell.buildable:
            if cell.problems:  # a skipped cell (a Python-independent wheel built once) is not left out
                left_out.append(f"{cell.name} (arch {requested}): {'; '.join(cell.problems)}")
            continue
        other = seen.setdefault(cell.name, str(requested))
        if other != str(requested):
            raise UsageError(f"Windows cell {cell.name} is asked for two arch lists ({other} and {requested}): a"
                             " workflow has one job per cell; give one --windows-arch list")
        toolkit = toolkits[cell.cuda.name]
        row = WindowsCell(name=validate_text(cell.name, BAKE_NAME, "Windows cell name", "a recipe with a plain name"),
                          recipe=cell.recipe.name, version=cell.version.version, torch=cell.torch_version,
                          cuda=cell.cuda.dotted, toolkit=toolkit, python=cell.python, arch=str(requested),
                          packages=windows_packages(toolkit))
        for value in (row.recipe, row.version, row.torch, row.cuda, row.toolkit, row.python, row.arch):
            validate_text(value, CELL_VALUE, f"Windows cell {row.name}", "a recipe and versions of plain characters")
        cells.append(row)
    if not cells:
        raise CompatError(f"no Windows cell of this matrix can build: {bounded(left_out[0], 400)}"
                          + (f" (and {len(left_out) - 1} more left out)" if len(left_out) > 1 else ""))
    if len(cells) > MAX_MATRIX_JOBS:
        raise UsageError(f"{len(cells)} Windows cells: a GitHub matrix holds at most {MAX_MATRIX_JOBS} jobs")
    return cells, left_out


def _validate_top_folder(cwd: Path) -> None:
    """The workflow runs bake in the checkout's top folder, and bake resolves paths against its cwd."""
    try:
        # As on any tree imagegen reads: none of the checkout's own commands run (imagegen_wheeltools.git_cmd).
        env = wheeltools.git_env(str(cwd))
        env.pop("GIT_CEILING_DIRECTORIES")  # the top folder is searched upwards from cwd
        proc = subprocess.run(wheeltools.git_cmd(str(cwd), ["rev-parse", "--show-toplevel"], env=env), env=env,
                              capture_output=True, text=True, timeout=30, stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired, wheeltools.UnsafeTree):
        return  # no git: nothing to compare with
    if proc.returncode != 0 or not proc.stdout.strip():
        return  # not a git checkout
    top = Path(proc.stdout.strip()).resolve()
    if top != cwd.resolve():
        raise UsageError(f"run imagegen ci github in the repository's top folder {top}, not {cwd}: the workflow runs"
                         " bake there, and bake resolves the file's paths against the folder it runs in")


