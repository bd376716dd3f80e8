"""Any ref of a package, or a fork: ``--ref TAG|BRANCH|COMMIT`` and ``--git URL[@REF]``, resolved before
anything is planned.

A ref is resolved to one commit with ``git ls-remote`` (a branch moves; the build then fetches the ref and
refuses a checkout that is not that commit, and the commit is what keys the build cache). The build
facts come from the recipe: the catalogue's pin when the commit is one, else the ``by_version`` range
that holds the source's version: the one the user declares (``--version``), the one a tag names
(``v2.8.2``), or the pin that follows the same branch (``main``). A ref whose version cannot be told
is refused with what to add, never built with facts guessed for it.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import tarfile
import tempfile
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterator, Sequence
from urllib.parse import urlsplit

from imagegen import safety
from imagegen.errors import RecipeError, UsageError, bounded, printable
from imagegen.model.recipe_reader import quoted
from imagegen.model.recipes import Patch, Recipe, RecipeVersion, ranges_text
from imagegen.shipped.builder import imagegen_wheeltools as wheeltools

FULL_SHA = re.compile(r"[0-9a-f]{40}")
# A tag that names a version: v2.8.2, 2.8.3.post1, V1.0 (what remains is read as PEP 440).
_VERSION_TAG = re.compile(r"[vV]?(\d+(\.\d+)*([._-]?(a|b|rc|post|dev)\d*)*)")
LS_REMOTE_TIMEOUT = 60
# A full commit needs no resolving: the build's access to its host is asked, but not waited on for long.
FULL_SHA_ACCESS_TIMEOUT = 20
MAX_LS_REMOTE_BYTES = 1 << 20
# git never asks: a missing credential fails at once instead of waiting on a prompt nobody sees.
_GIT_ENV = {"GIT_TERMINAL_PROMPT": "0", "GIT_ASKPASS": "", "SSH_ASKPASS": "", "GIT_OPTIONAL_LOCKS": "0", "LC_ALL": "C"}


def _git(args: list[str], *, timeout: int, missing: str, env: dict[str, str] | None = None,
         input: bytes | None = None, tree: Path | None = None,
         home: Path | None = None) -> subprocess.CompletedProcess:
    """git ``args`` (output as bytes); ``missing`` is the UsageError's message when git is not installed.

    With ``tree``: git on that tree, which imagegen only reads, with none of its own commands running
    (imagegen_wheeltools.git_cmd: no hooks, fsmonitor, filters, drivers, pager or network; UsageError
    for a tree whose drivers cannot be switched off). Without: a remote operation (ls-remote), run in an
    empty folder of its own, so that the config of whatever repository the current folder is in (a
    downloaded project's core.sshCommand, credential helper or url.insteadOf) plays no part; with ``home``
    (_build_home), git's HOME and XDG config are that folder's."""
    git = shutil.which("git")
    if git is None:
        raise UsageError(missing)
    if tree is not None:
        full_env = {**wheeltools.git_env(str(tree)), **_GIT_ENV, **(env or {})}
        try:
            cmd = wheeltools.git_cmd(str(tree), args, env=full_env, git=git)
        except wheeltools.UnsafeTree as exc:
            raise UsageError(f"{tree}: {exc}: not read with git") from None
        return subprocess.run(cmd, capture_output=True, env=full_env, timeout=timeout, input=input,
                              stdin=None if input is not None else subprocess.DEVNULL)
    with tempfile.TemporaryDirectory(prefix="imagegen-git-") as empty:
        full_env = {**os.environ, **_GIT_ENV, "GIT_CEILING_DIRECTORIES": os.path.dirname(empty), **(env or {})}
        for var in ("GIT_DIR", "GIT_WORK_TREE"):
            full_env.pop(var, None)
        if home is not None:
            full_env.update(HOME=str(home), XDG_CONFIG_HOME=str(home / ".config"))
        return subprocess.run([git, *args], capture_output=True, env=full_env, cwd=empty,
                              timeout=timeout, input=input, stdin=None if input is not None else subprocess.DEVNULL)


# git's advice after a failed remote operation: no reason of its own.
_GIT_ADVICE = ("please make sure you have the correct access rights", "and the repository exists.")
MAX_GIT_REASON_LINES = 4
MAX_GIT_REASON_CHARS = 400


def _stderr_tail(proc: subprocess.CompletedProcess) -> str:
    """What git said when it failed, for a one-line message: its lines that give a reason (not its
    closing advice), at most MAX_GIT_REASON_LINES of them, joined with '; ', every credential redacted
    before the whole is cut to MAX_GIT_REASON_CHARS."""
    text = proc.stderr[:1 << 16].decode("utf-8", "replace")
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    reasons = list(dict.fromkeys(line for line in lines if line.lower() not in _GIT_ADVICE)) or lines or ["no output"]
    return bounded(safety.redact("; ".join(reasons[:MAX_GIT_REASON_LINES])), MAX_GIT_REASON_CHARS)


def split_git(value: str) -> tuple[str, str | None]:
    """``--git URL[@REF]`` -> (URL, REF or None). The ref follows the last ``@`` whose left part is a
    repository URL (``git@host:org/repo.git@v1``, ``https://host/org/repo@feature/x``)."""
    if not isinstance(value, str) or not value or len(value) > 500:
        raise UsageError("--git: give a repository URL, optionally @REF (https://host/org/repo.git@v2.8.2)")
    # The URL is written into the Dockerfile, the cell document (in the image) and the manifest, and
    # keys the build cache: a credential in it is refused, never carried (docs/security.md).
    safety.no_credentials(value, "--git", safety.NETRC_INSTEAD)
    if _repo_url(value):
        return value, None
    for at in reversed([i for i, c in enumerate(value) if c == "@"]):
        url, ref = value[:at], value[at + 1:]
        if _repo_url(url) and ref:
            return url, ref
    raise UsageError(f"--git {quoted(value)}: not a repository URL (https://, http://, ssh://, git@host:path or file:///path),"
                     " optionally followed by @REF")


# A repository on this machine (--git only; recipe files name remote sources): exported on the host,
# since a build container cannot reach the host's paths.
FILE_URL = re.compile(r"file:///[A-Za-z0-9._~/+-]+")


def _repo_url(url: str) -> bool:
    if FILE_URL.fullmatch(url):
        return ".." not in url.split("/")
    if not safety.GIT_URL.fullmatch(url):
        return False
    if url.startswith("git@"):
        host, _, path = url[4:].partition(":")
        return bool(host and path) and "@" not in path
    rest = url.split("://", 1)[1]
    return "/" in rest.strip("/") and "@" not in rest.split("/", 1)[1]


@dataclass(frozen=True)
class BuildCredentials:
    """What a container build's fetch step has to reach an http(s) git host: the file ``--netrc`` hands it
    as the netrc BuildKit secret, or nothing (no ~/.netrc, no credential helper: those are this machine's).
    `build`, `push` and `pull` resolve a ref with exactly these, so that a repository the build could not
    fetch is said before anything is built, in one line."""
    netrc: str | None = None


@contextlib.contextmanager
def _build_home(creds: BuildCredentials) -> Iterator[Path]:
    """A HOME for git holding what the build has: a link to the --netrc file as .netrc (git's HTTP reads
    $HOME/.netrc only), and a .gitconfig that includes the user's global git config (a proxy, a CA,
    url.insteadOf still apply); the credential helpers are switched off on git's command line."""
    real_home = Path(os.path.expanduser("~"))
    xdg = Path(os.environ.get("XDG_CONFIG_HOME") or real_home / ".config")
    with tempfile.TemporaryDirectory(prefix="imagegen-git-home-") as folder:
        home = Path(folder)
        included = [p for p in (real_home / ".gitconfig", xdg / "git" / "config") if str(p).isprintable() and safety.is_file(p)]
        if included:
            quoted_paths = "".join('\tpath = "%s"\n' % str(p).replace("\\", "\\\\").replace('"', '\\"')
                                   for p in included)
            (home / ".gitconfig").write_text("[include]\n" + quoted_paths, encoding="utf-8")
        if creds.netrc is not None:
            (home / ".netrc").symlink_to(creds.netrc)
        yield home


def _ls_remote(url: str, ref: str, creds: BuildCredentials | None,
               timeout: float = LS_REMOTE_TIMEOUT) -> subprocess.CompletedProcess:
    # The pattern `REF^{}` lists an annotated tag's commit (the tag object is listed under REF).
    args = ["ls-remote", "--", url, ref, ref + "^{}"]
    missing = (f"--ref {ref}: git is not installed here, and it is needed to resolve the ref to a commit"
               " (install git, or give the full 40-character commit)")
    try:
        if creds is None:
            return _git(args, timeout=timeout, missing=missing)
        with _build_home(creds) as home:
            return _git(["-c", "credential.helper=", *args], timeout=timeout, missing=missing, home=home)
    except subprocess.TimeoutExpired:
        raise UsageError(f"cannot resolve {ref} at {url}: git ls-remote took over {timeout:g} s"
                         " (no network? give the full 40-character commit)") from None
    except OSError as exc:
        raise UsageError(f"cannot resolve {ref} at {url}: {safety.os_reason(exc)}") from None


def _refuse_what_the_build_cannot_fetch(url: str, ref: str, proc: subprocess.CompletedProcess,
                                        as_build: BuildCredentials) -> None:
    """``proc``, git ls-remote with only the build's credentials, failed: when git with this machine's
    own credentials succeeds, the build could not fetch the repository: a UsageError says what to give.
    Otherwise (the host refuses everyone, or cannot be reached) the caller says what failed."""
    try:
        mine = _ls_remote(url, ref, None, timeout=FULL_SHA_ACCESS_TIMEOUT)
    except UsageError:
        return
    if mine.returncode != 0:
        return
    host = urlsplit(url).hostname or "HOST"
    if as_build.netrc is None:
        raise UsageError(f"cannot fetch {url} in the build: it needs credentials, which git on this machine"
                         " has (~/.netrc or a credential helper) but a build's fetch step gets only the netrc"
                         f" file --netrc hands it: give --netrc ~/.netrc (or a file with 'machine {host}"
                         " login USER password TOKEN')")
    raise UsageError(f"cannot fetch {url} in the build: the --netrc file's credentials are refused there"
                     f" ({_stderr_tail(proc)}), while git on this machine has working ones: put them in the"
                     f" --netrc file ('machine {host} login USER password TOKEN')")


def resolve_commit(url: str, ref: str, build: BuildCredentials | None = None) -> str:
    """The commit ``ref`` names in the repository at ``url`` (a full commit names itself).

    ``build``: for a container build, an http(s) repository is asked with the credentials the build's
    fetch step will have, not this machine's; when that fails where git with this machine's own
    credentials succeeds, the build could not fetch it: a UsageError says to give --netrc."""
    if build is not None and url.startswith(("ssh://", "git@")):
        # A build's fetch step gets the --netrc file and nothing else of this machine's: no SSH key, no
        # agent (and none is ever put into a build). Said now, not after the toolchain layer.
        raise UsageError(f"cannot fetch {url} in the build: a container build's fetch step has no SSH key or"
                         " agent; give the repository's https:// URL with --netrc FILE ('machine HOST login USER"
                         " password TOKEN'), or build with --native, where your own ssh setup is used")
    as_build = build if build is not None and url.startswith(("https://", "http://")) else None
    if FULL_SHA.fullmatch(ref):
        # Nothing to resolve, and no network needed (the offline route). A container build's fetch step
        # still needs access: asked once with its credentials; where the host cannot be asked at all
        # (offline, too slow), the fetch step says what failed.
        if as_build is not None:
            try:
                proc = _ls_remote(url, ref, as_build, timeout=FULL_SHA_ACCESS_TIMEOUT)
            except UsageError:
                return ref
            if proc.returncode != 0:
                _refuse_what_the_build_cannot_fetch(url, ref, proc, as_build)
        return ref
    proc = _ls_remote(url, ref, as_build)
    if proc.returncode != 0 and as_build is not None:
        _refuse_what_the_build_cannot_fetch(url, ref, proc, as_build)
    out = proc.stdout[:MAX_LS_REMOTE_BYTES].decode("utf-8", "replace")
    if proc.returncode != 0:
        host = urlsplit(url).hostname or "HOST"
        said = proc.stderr[:1 << 16].decode("utf-8", "replace")
        if wheeltools.unreachable(said):
            raise UsageError(f"cannot resolve {ref} at {url}: {safety.redact(wheeltools.cannot_reach(host, said))}"
                             " (offline, give the full commit)")
        hint = ("it needs git credentials" if as_build is None else "give --netrc FILE with its credential"
                if as_build.netrc is None else f"the --netrc file has no working entry for {host}")
        raise UsageError(f"cannot resolve {ref} at {url}: git ls-remote failed: {_stderr_tail(proc)}"
                         f" (a private repository? {hint}; offline, give the full commit)")
    found = {}
    for line in out.splitlines():
        sha, _, name = line.partition("\t")
        if FULL_SHA.fullmatch(sha):
            found[name] = sha
    for name in (f"refs/tags/{ref}^{{}}", f"refs/tags/{ref}", f"refs/heads/{ref}", ref):
        if name in found:
            return found[name]
    if re.fullmatch(r"[0-9a-f]{7,39}", ref):
        raise UsageError(f"--ref {ref}: a short commit cannot be resolved remotely: give the full 40-character commit")
    raise UsageError(f"--ref {ref}: {url} has no branch or tag of that name")


def version_tag(ref: str) -> str | None:
    """The version a tag names (``v2.8.2`` -> ``2.8.2``), else None."""
    m = _VERSION_TAG.fullmatch(ref.rsplit("/", 1)[-1])
    return m.group(1) if m else None


def at_ref(recipe: Recipe, ref: str | None, git: str | None, declared: str | None,
           build: BuildCredentials | None = None) -> tuple[Recipe, RecipeVersion]:
    """``recipe`` and the version to build for ``--ref``/``--git`` (one of them given); ``build``: what a
    container build's fetch step will have to reach the repository (resolve_commit)."""
    if recipe.source_kind != "git" or recipe.source_url is None:
        raise UsageError(f"--ref/--git apply to a recipe whose source is a git repository; {recipe.name} is"
                         f" {recipe.source_kind} (build a checkout of your own with --source DIR)")
    url, ref_in_url = split_git(git) if git else (recipe.source_url, None)
    if ref and ref_in_url:
        raise UsageError(f"--ref {ref} and --git ...@{ref_in_url}: give the ref once")
    ref = ref or ref_in_url or "HEAD"
    safety.validate(ref, safety.GIT_REF, "--ref")
    commit = resolve_commit(url, ref, build)
    forked = url != recipe.source_url
    if forked:
        recipe = replace(recipe, source_url=url)

    pin = next((v for v in recipe.versions.values() if v.commit and commit.startswith(v.commit)), None)
    if pin is not None and not forked and declared in (None, pin.version):
        # The catalogue's own pin: built exactly as `--version` would.
        return recipe, replace(pin, ref=ref, commit=commit, resolved=_note(ref, commit, f"the pinned {pin.version}", pin))
    said = declared or version_tag(ref)
    if said is not None:
        facts = recipe.versions.get(said) or recipe.facts_for(said)
        how = f"its version {said}" + (" (--version)" if declared else f" (from the tag {ref})")
        if facts is None:
            ranges = ranges_text(recipe.by_version) or "none"
            raise RecipeError(f"{recipe.name} {said}: no pinned version and no by_version range holds it (ranges:"
                              f" {ranges}); add a range to the recipe (--recipe-dir) or give --version of a known one")
    else:
        same_branch = [v for v in recipe.versions.values() if v.ref == ref]
        if not same_branch:
            raise UsageError(f"--ref {ref}: which version is that source? give --version X.Y.Z (what its setup.py or"
                             " __init__ says) so imagegen applies that version's recipe rules")
        facts, how = same_branch[0], f"the catalogue's {same_branch[0].version} rules (it follows {ref})"
        said = facts.source_version or facts.version
    # "+" would not do: the label names wheelhouse folders and bake outputs (safety.LOCAL_PATH)
    label = f"{said}-g{commit[:8]}"
    safety.validate(label, safety.VERSION_LABEL, "version label")
    # A fork is the recipe's package as someone changed it: the recipe's facts are assumed for it, unchecked.
    unchecked = (f"unaudited: what this fork compiles is unchecked (the recipe's facts for {facts.version} are"
                 " assumed; a git source is read only when its build fetches it): `imagegen plan --audit` checks it"
                 if forked else "")
    version = replace(facts, version=label, ref=ref, commit=commit, sdist=None, source_version=said,
                      resolved=_note(ref, commit, how, facts), unchecked=unchecked)
    if url.startswith("file://"):
        from imagegen.model.source_tree import unaudited

        tree = export_commit(Path(url[len("file://"):]), commit, recipe.name)
        recipe = replace(recipe, source_kind="local", source_path=tree, source_url=None, submodules=False)
        version = replace(version, ref="", commit=None, **unaudited(tree),
                          resolved=f"{version.resolved}; exported from {url} to {tree} (no submodules)")
    return recipe, version


def export_commit(repo: Path, commit: str, name: str) -> Path:
    """``commit`` of a repository on this machine as a plain tree in imagegen's cache
    (``$XDG_CACHE_HOME/imagegen/sources``, else ~/.cache/...), made once and then reused: what the build
    context of a local source can carry into a container."""
    from imagegen.outputs import output_folder, shown

    base = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "imagegen" / "sources"
    output_folder(base, "imagegen's cache ($XDG_CACHE_HOME/imagegen/sources)")
    dest = base / f"{name}-{commit[:16]}"
    marker = dest / ".imagegen-export"
    if marker.is_file() and marker.read_text().strip() == commit:
        return dest
    try:
        base.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}-", dir=base))
    except OSError as exc:
        raise UsageError(f"cannot export {commit[:12]} of {repo} into {shown(base)} (imagegen's cache: $XDG_CACHE_HOME,"
                         f" else ~/.cache): {safety.os_reason(exc)}") from None
    try:
        archive = _git(["archive", "--format=tar", commit], timeout=600, tree=repo,
                       missing="git is not installed here, and it is needed to export the --git file:// repository")
        if archive.returncode != 0:
            raise UsageError(f"cannot export {commit[:12]} of {repo}: {_stderr_tail(archive)}")
        try:
            with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
                tar.extractall(tmp, filter="data")  # nothing outside tmp, no devices, no links out
        except tarfile.FilterError as exc:  # a link to an absolute path or out of the tree, a device
            info = exc.tarinfo
            link = f" -> {printable(info.linkname)[:200]}" if info.linkname else ""
            raise UsageError(f"cannot export {commit[:12]} of {repo}: {printable(info.name)[:200]}{link}:"
                             f" {exc.__class__.__name__}; imagegen exports only a tree whose links stay inside"
                             " it (build from a commit without it, or from a https:// remote)") from None
        except (tarfile.TarError, EOFError) as exc:
            raise UsageError(f"cannot export {commit[:12]} of {repo}: git archive gave no readable tar"
                             f" ({exc.__class__.__name__})") from None
        (tmp / ".imagegen-export").write_text(commit + "\n")
        if dest.exists():
            shutil.rmtree(dest)
        os.replace(tmp, dest)
    except OSError as exc:  # a full disk, a cache folder that became unwritable
        raise UsageError(f"cannot export {commit[:12]} of {repo} into {shown(base)}: {safety.os_reason(exc)}") from None
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
    return dest


def _note(ref: str, commit: str, how: str, facts: RecipeVersion) -> str:
    rules = f" (recipe rules: {facts.rules_from})" if facts.rules_from else ""
    return f"{ref} is {commit[:12]}, built with {how}{rules}"


def checkout_head(root: Path) -> tuple[str | None, bool]:
    """(HEAD's commit or None, whether the work tree has changes) of a git checkout; (None, False) where
    ``root`` is not one or git is missing."""
    if not (root / ".git").exists():
        return None, False
    try:
        head = _git(["rev-parse", "HEAD"], timeout=60, missing="", tree=root)
        status = _git(["status", "--porcelain", "--untracked-files=no"], timeout=120, missing="", tree=root)
    except (UsageError, OSError, subprocess.TimeoutExpired):  # no git, or it failed to run: not a checkout to us
        return None, False
    sha = head.stdout.decode("utf-8", "replace").strip()
    return (sha if FULL_SHA.fullmatch(sha) else None), bool(status.stdout.strip())


def only_patched(root: Path, patches: Sequence[Patch]) -> bool:
    """Whether the tracked files of the checkout at ``root`` are HEAD with exactly ``patches`` applied:
    the tree an earlier build of the pin left (imagegen patches the source in place), which is still
    the pin. Checked in a throwaway index (HEAD, then each patch applied to it), never in the user's
    tree or index."""
    if not patches:
        return False
    with tempfile.TemporaryDirectory(prefix="imagegen-index-") as tmp:
        env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        try:
            if _git(["read-tree", "HEAD"], timeout=120, missing="", env=env, tree=root).returncode:
                return False
            for patch in patches:
                if _git(["apply", "--cached", "-"], timeout=120, missing="", env=env, tree=root,
                        input=patch.text.encode()).returncode:
                    return False
            return _git(["diff", "--quiet", "--no-ext-diff", "--no-textconv"], timeout=300, missing="", env=env,
                        tree=root).returncode == 0
        except (UsageError, OSError, subprocess.TimeoutExpired):
            return False


def at_tree(recipe: Recipe, version: RecipeVersion, root: Path, declared: str | None,
            tree: Recipe | None = None) -> tuple[Recipe, RecipeVersion]:
    """A local tree of a package the catalogue knows (``--src-dir`` on a fork or a dirty checkout,
    ``--source`` on its sdist): built in place as a local source, with the recipe's knowledge (arch
    knob, force-build and local-version variables, patches, routing) for the tree's version. The
    catalogue's pin itself (HEAD at the pinned commit, no changes) is returned as it is. ``tree``: the
    tree already read as a recipe (source_tree.recipe_from_source_tree), where the caller has it."""
    from imagegen.model.source_tree import VERSION_PLACES, recipe_from_source_tree, unaudited

    root = root.expanduser().resolve()
    head, dirty = checkout_head(root)
    at_pin = bool(head and version.commit and head.startswith(version.commit) and recipe.source_kind == "git")
    if at_pin and (not dirty or only_patched(root, version.patches)):
        return recipe, version
    pinned = recipe.versions.get(declared or "")
    # The version the tree is: what the user declares (a pin's label says its version), else its own
    # metadata (PKG-INFO first: recipe_from_source_tree reads it).
    said = (pinned.source_version or declared) if pinned else declared
    if not said:
        said = (tree or recipe_from_source_tree(root)).version(None).source_version
    if not said:  # never a silent 0.0.0: the version picks the recipe's rules
        raise UsageError(f"{root}: which {recipe.name} version is this tree? it states none that imagegen reads"
                         f" without running it ({VERSION_PLACES}); give --version X.Y.Z (the pinned ones:"
                         f" {', '.join(recipe.versions)})")
    facts = pinned or recipe.versions.get(said) or recipe.facts_for(said)
    if facts is None:
        ranges = ranges_text(recipe.by_version) or "none"
        raise RecipeError(f"{root} is {recipe.name} {said}, which no pinned version or by_version range holds"
                          f" (ranges: {ranges}): give --version of the pinned version it is closest to"
                          f" ({', '.join(recipe.versions)}), or add a range (--recipe-dir)")
    where = f"HEAD {head[:12]}" + (", with changes" if dirty else "") if head else "no git history"
    how = (f"the rules of {recipe.name} {facts.version}" + (f" ({facts.rules_from})" if facts.rules_from else ""))
    resolved = (f"{root} ({where}; version {said}) is built as a local tree with {how}; up to date only while"
                " its content is unchanged")
    local = replace(recipe, source_kind="local", source_path=root, source_url=None, submodules=False)
    label = f"{said}-local"
    safety.validate(label, safety.VERSION_LABEL, "version label")
    return local, replace(facts, version=label, ref="", commit=None, sdist=None, source_version=said, resolved=resolved,
                          **unaudited(root))
