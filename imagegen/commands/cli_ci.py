"""`imagegen ci` as data (see cli_spec): one subcommand per CI provider, github's options, and its
Windows jobs' options as a section of their own. commands.ci reads them (ci.run)."""

from __future__ import annotations

from imagegen.commands.cli_options import path_text
from imagegen.commands.cli_spec import Command, Group, Opt
from imagegen.render.workflow import (DEFAULT_ARM64_RUNS_ON, DEFAULT_BAKE_FILE, DEFAULT_GROUP, DEFAULT_NAMESPACE,
                                      DEFAULT_OUTPUT, DEFAULT_REGISTRY, DEFAULT_RUNS_ON, DEFAULT_TIMEOUT,
                                      DEFAULT_WINDOWS_RUNS_ON, DEFAULT_WINDOWS_TIMEOUT, MAX_TIMEOUT_MINUTES,
                                      RUNNER_LIMIT_MINUTES)

# Which bake targets the Linux jobs build: named ones or a group, not both.
_WHICH_TARGETS = Group((
    Opt(("--targets",), action="append", metavar="NAMES", help="bake targets or groups to build (comma-separated or"
        " repeated)"),
    Opt(("--group",), help=f"bake group to build (default: {DEFAULT_GROUP})"),
), exclusive=True)

_WINDOWS_JOBS = Group((
    Opt(("--windows",), action="append", metavar="RECIPES", help="add Windows jobs building these recipes"
        " (catalogue names or aliases, at their default version unless --windows-version; comma-separated or"
        " repeated); needs --windows-torch and --windows-cuda"),
    Opt(("--windows-version",), action="append", metavar="VERSIONS", help="recipe versions of the Windows cells,"
        " each recipe's cells at each (comma-separated or repeated, e.g. 2.8.2,2.8.3; default: the recipe's default"
        " version)"),
    Opt(("--windows-torch",), action="append", metavar="VERSIONS", help="torch series or releases of the Windows"
        " cells: 2.8 or 2.8.0 (comma-separated or repeated)"),
    Opt(("--windows-cuda",), action="append", metavar="VERSIONS", help="CUDA variants of the Windows cells: 12.8 or"
        " cu128 (comma-separated or repeated)"),
    Opt(("--windows-python",), action="append", metavar="VERSIONS", help="CPython versions of the Windows cells"
        " (comma-separated or repeated; default: imagegen's default Python)"),
    Opt(("--windows-arch",), action="append", metavar="ARCHS", help="one GPU arch list of the Windows cells, e.g."
        " '8.0;9.0;12.0' (repeat for several lists; default: imagegen's default list)"),
    Opt(("--windows-runs-on",), action="append", metavar="LABELS", help="runner labels of the Windows jobs"
        f" (comma-separated or repeated; default: {DEFAULT_WINDOWS_RUNS_ON})"),
    Opt(("--windows-timeout",), type=int, metavar="MINUTES", help="timeout-minutes of each Windows job (default:"
        f" {DEFAULT_WINDOWS_TIMEOUT}; at most {MAX_TIMEOUT_MINUTES}, below GitHub's {RUNNER_LIMIT_MINUTES} for a"
        " hosted job)"),
), title="Windows jobs", description="native Windows builds, one job per cell of recipes x torch x CUDA x Python x"
   " arch list, planned as `imagegen plan` plans them; the cells it rejects are left out and named")

GITHUB = Command("github", None, "GitHub Actions workflow with a registry cache per target", (
    "Write a GitHub Actions workflow whose matrix is the bake file's targets (read by imagegen, so no docker is"
    " needed, and checked against `docker buildx bake --print` where buildx is there): each job bakes one target on its own runner with a docker-container builder"
    " and a registry cache (<registry>/<namespace>/imagegen-cache:<target>, cache-to mode=max), then uploads the"
    " target's local output folder as an artifact; with --push-builders it also pushes the target's builder image and"
    " a last job uploads the lock file of their digests. With --windows, it also builds on Windows runners, one job per"
    " cell of the --windows-* matrix (planned as `imagegen plan` plans it; a cell that cannot build, such as a torch"
    " x CUDA pair torch never shipped, is left out and named); its Linux jobs are then written only when"
    " --bake-file, --targets or --group is given. A target whose base image has a fallback (<target>-fallback in"
    " the bake file) builds on the first that can be pulled. Every job has a timeout below a hosted runner's 6"
    " hours. Run it in the repository's top folder, where the workflow runs bake."), (
    Opt(("--bake-file",), type=path_text, help="bake file, relative to the repository's top folder (default:"
        f" {DEFAULT_BAKE_FILE}, written by `imagegen bake --repo`)"),
    _WHICH_TARGETS,
    Opt(("--registry",), default=DEFAULT_REGISTRY, help=f"registry for the build cache (default: {DEFAULT_REGISTRY},"
        " logged in with GITHUB_TOKEN; any other uses the secrets IMAGEGEN_REGISTRY_USERNAME and"
        " IMAGEGEN_REGISTRY_PASSWORD)"),
    Opt(("--namespace",), default=DEFAULT_NAMESPACE, help="repository path under the registry (default: the"
        " repository owner, lower-cased at run time)"),
    # nargs="?" with default False: absent is False, bare is None (argparse's const), a value is the value.
    Opt(("--push-builders",), nargs="?", default=False, metavar="REGISTRY/NAMESPACE", help="each Linux job also"
        " pushes its target's builder image (the builder stage, with its Dockerfile's labels) as"
        " REGISTRY/NAMESPACE/imagegen-<recipe>:<tag>, the reference `imagegen push` gives and `imagegen pull` and"
        " `imagegen lock` read, records its digest, and a last job uploads imagegen.lock with every pushed digest"
        " (artifact imagegen-lock). Without a value: the config's registry (pyproject [tool.imagegen] or"
        " imagegen.toml), else --registry/--namespace. Its host must be --registry's (the one the workflow logs"
        " in to)"),
    Opt(("--runs-on",), action="append", metavar="LABELS", help="runner labels (comma-separated or repeated;"
        f" default: {DEFAULT_RUNS_ON})"),
    Opt(("--arm64-runs-on",), action="append", metavar="LABELS", help="runner labels of the jobs of linux/arm64"
        " targets (imagegen bake --platform arm64), which build natively there (default:"
        f" {DEFAULT_ARM64_RUNS_ON}, GitHub's arm64 runner)"),
    Opt(("--timeout",), type=int, metavar="MINUTES", help="timeout-minutes of each Linux build job (default:"
        f" {DEFAULT_TIMEOUT}; at most {MAX_TIMEOUT_MINUTES}, below GitHub's {RUNNER_LIMIT_MINUTES} for a hosted"
        " job)"),
    Opt(("--skip-published",), metavar="URL", help="the URL the published wheelhouse is served at (the folder"
        " imagegen index makes servable, with each <pkg>-<ver>/torch<X.Y>/cu<XYZ>/manifest.json): each Linux job"
        " first reads its cell's entry there and builds nothing when the same inputs hash is published with its"
        " wheel (a run with nothing changed builds nothing and says so)"),
    Opt(("--on",), action="append", metavar="TRIGGER", help="when the workflow runs (repeatable): dispatch (a manual"
        " run), tag:PATTERN (a tag push, e.g. tag:v*), branch:PATTERN (a push to it), paths:GLOB[,GLOB] (only the"
        " branch pushes and pull requests touching these), pr (pull requests), push (every push). Default: dispatch,"
        " tag:v* and pushes to the default branch touching the bake file, the folders its targets build from or"
        " the workflow file"),
    Opt(("--max-parallel",), type=int, help="most jobs at once, in each of the Linux and the Windows matrix"
        " (default: as many as GitHub allows)"),
    _WINDOWS_JOBS,
    Opt(("--publish",), action="append", metavar="DEST", help="add a publish job: once every target built, on a tag"
        " push or a manual run, `imagegen collect` verifies the wheels against their build records and `imagegen"
        " publish` uploads those to DEST (as imagegen publish --to takes it; repeatable), with the credentials from"
        " the repository's secrets"),
    Opt(("--imagegen-from",), metavar="REQUIREMENT", help="with --publish or --windows: how the publish job and the"
        " Windows jobs install imagegen, a pip requirement such as 'imagegen-wheels[publish] @"
        " git+https://github.com/ORG/imagegen@v0.1.0' or a path in the repository (default: the imagegen-wheels"
        " release of this imagegen from PyPI, with its publish extra in the publish job; PyPI's 'imagegen' is"
        " another project and is refused)"),
    Opt(("-o", "--output"), type=path_text, default=DEFAULT_OUTPUT,
        help=f"workflow file to write, - for stdout (default:"
        f" {DEFAULT_OUTPUT})"),
), epilog=("example: imagegen ci github --windows sage --windows-torch 2.8 --windows-cuda 12.8 --windows-python 3.12"
           " --windows-arch '8.0;9.0;12.0' (Windows jobs only, each installing this imagegen-wheels release; add"
           " --group default for the bake file's Linux jobs too)"))

CI = Command("ci", "ci.run", "write a CI workflow that builds the bake matrix on CI runners",
             "Write a CI workflow that builds every target of a bake file, one runner per target.",
             subcommands=(GITHUB,), subcommand_dest="ci_command", subcommand_metavar="PROVIDER")
