#!/usr/bin/env python3
"""A campaign of hostile input against the whole imagegen CLI (issue 32, "Hostile input, round 2").

About 1400 invocations of the real CLI (`python -m imagegen ...`, each in a process of its own), in the
16 classes of issue 32: a token in every URL-taking flag, recipe and config; git hooks and config
planted in trees imagegen reads; outputs aimed at /, the home folder, system folders, links and `..`
out of the folder given; cdi-spec beside a home folder's secrets; hostile index, upload and git servers
on 127.0.0.1 (malformed PEP 691, other schemes, bombs, drips, redirect loops, echoed credentials);
FIFOs, huge and /dev/zero files and deep JSON where manifests, records and wheels are read; layouts;
input that could be silently ignored; CI destinations; repair's member names; messages; long paths;
concurrent writers of one wheelhouse; refusals before any build. No Docker engine: a stand-in `docker`
first on PATH refuses everything but `buildx bake --print` (which buildx answers without an engine),
so a command that would reach the engine stops there and is counted ("engine").

Each invocation is classified (`classify`): ok (exit 0), refused (non-zero, its error one
`imagegen: error:` line, the last), messy (non-zero otherwise), exit 70, traceback, crash (killed by a
signal: the 2 GiB address-space or 256 MiB file-size limit every invocation runs under), hang (over
its time limit). Then checked: a leak (the campaign's token, or its Basic-auth form, in stdout,
stderr or any file the invocation wrote), a write outside (see below), code run from a planted tree (a
marker file appeared), an unsafe message (a control, bidi or line-separator character in stderr), an
unexpected outcome (a case that must be refused and was not, or the reverse).

**Writes outside.** Run as root (the default), the campaign re-executes itself in a mount namespace of
its own (`unshare -m`) where `/` is read-only and only its work folder is writable (the shared
fixtures read-only too), and `/dev` is a tmpfs of its own holding the usual nodes plus NVIDIA's (so
`cdi-spec` reads a driver): any write outside the work folder fails with EROFS ("Read-only file
system" in its output counts as a write outside) and cannot harm the machine. Inside its own folder
an invocation may write only where the case allows (its working folder, HOME, TMPDIR and the outputs
it names): a file created, changed or removed elsewhere in the case's folder (its inputs) is a write
outside.

    sudo .venv/bin/python benchmarks/hostile_campaign.py [--jobs 2] [--only CLASS ...] [--work DIR]

Prints a table per class and writes results.jsonl (every case: class, argv, outcome, flags, seconds,
the last lines of stderr) and summary.json to --work (default /tmp/imagegen-campaign). The figures of
a run are in docs/security.md. Not part of the test suite (it takes ~15 minutes on 2 busy cores);
tests/unit/test_hostile_campaign.py checks its classifier.
"""

from __future__ import annotations

import argparse
import base64
import concurrent.futures
import dataclasses
import json
import os
import random
import resource
import shutil
import signal
import stat
import subprocess
import sys
import threading
import time
import unicodedata
import uuid
from pathlib import Path
from typing import Callable

ROOT = Path(__file__).resolve().parents[1]
TOKEN = "igtok" + uuid.uuid4().hex  # the campaign's secret: never in anything imagegen prints or writes
LOGIN = "campaign-user"
REAL_DOCKER = shutil.which("docker") or "/usr/local/bin/docker"
MIB = 1 << 20
WHEEL_NAME = "tiny_kernel-0.1.0+cu130torch2.11-cp311-cp311-linux_x86_64.whl"  # tests/fixtures/wheels' real wheel

CLASSES = {
    "credentials": "1. a token in every URL-taking flag, recipe, config and credential variable",
    "planted-trees": "2. hooks, config and attributes planted in a git tree or repository imagegen reads",
    "writes-outside": "3. outputs aimed at /, ~, system folders, links and .. out of the folder given",
    "cdi-spec": "4. cdi-spec with the driver beside a home folder's secrets, odd LD_LIBRARY_PATHs",
    "servers": "5. hostile index, upload and git servers on 127.0.0.1",
    "manifests": "6. manifest.json and build records: FIFO, huge, /dev/zero, deep, odd JSON",
    "wheels": "7. wheels: bombs, FIFOs, links, not zips, for verify, check, repair, collect",
    "exit70": "8. former exit-70s: odd record fields, --git file:// repositories with links",
    "layouts": "9. layouts: too deep, braces, odd placeholders, config layouts",
    "ignored-input": "10. input that could be silently ignored or silently bent",
    "ci-destinations": "11. ci github destinations, --imagegen-from and workflow values",
    "repair-members": "12. repair of wheels whose member names leave the wheel",
    "messages": "13. control, bidi and non-ASCII characters, overlong values, git's failures",
    "long-paths": "14. long paths and names",
    "concurrency": "15. concurrent writers of one wheelhouse",
    "refusals": "16. refusals before any build: a wheel for other archs, platforms, native",
}


# ----------------------------------------------------------------------------------------------
# classification (tests/unit/test_hostile_campaign.py checks these)

UNSAFE = {"\u2028", "\u2029", "\u200e", "\u200f", *map(chr, range(0x202A, 0x202F)), *map(chr, range(0x2066, 0x206A))}


def classify(returncode: int | None, stdout: str, stderr: str, timed_out: bool) -> str:
    """hang, crash, traceback, exit70, ok, refused or messy (see the module's docstring)."""
    if timed_out:
        return "hang"
    if returncode is None or returncode < 0:
        return "crash"
    if "Traceback (most recent call last)" in stdout + stderr:
        return "traceback"
    if returncode == 70:
        return "exit70"
    if returncode == 0:
        return "ok"
    lines = [line for line in stderr.splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("imagegen: error:")]
    return "refused" if len(errors) == 1 and lines[-1] == errors[0] else "messy"


def unsafe_text(text: str) -> bool:
    """A character that moves the cursor, rewrites the line or reorders text on a terminal."""
    return any((unicodedata.category(c) == "Cc" and c not in "\n\t") or c in UNSAFE for c in text)


def secret_forms(token: str = TOKEN, logins: tuple[str, ...] = (LOGIN, "__token__", "user", "u", "x")) -> list[bytes]:
    """The token and the Basic-auth headers that would carry it."""
    forms = [token.encode()]
    forms += [base64.b64encode(f"{login}:{token}".encode()) for login in logins]
    return forms


def leaks(data: bytes, forms: list[bytes] | None = None) -> bool:
    return any(form in data for form in (forms or secret_forms()))


# ----------------------------------------------------------------------------------------------
# cases


@dataclasses.dataclass
class Case:
    cls: str
    what: str  # a few words
    argv: list[str] | list[list[str]]  # @C@: the case's folder, @F@: the fixtures, @O@: outside, @T@: the token
    setup: Callable[[Path], None] | None = None  # makes the case's inputs (under its folder)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    expect: str = "any"  # "refuse": must be refused; "ok": must succeed; "any"
    timeout: float = 90
    allowed: tuple[str, ...] = ()  # case-relative folders it may write, besides cwd, home and tmp
    planted: tuple[str, ...] = ()  # case-relative files that hold the token by construction
    after: Callable[[Path, list], str | None] | None = None  # a further check: a defect's text, or None
    erofs_ok: bool = False  # the path given itself leads out of the work folder: EROFS there is no defect


def sub(value: str, ctx: dict[str, str]) -> str:
    for key, repl in ctx.items():
        value = value.replace(f"@{key}@", repl)
    return value


CELL = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]  # sage: a buildable cell
TINY_CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "8.0", "--flavor", "pypi"]
TINY_GIT = ["tiny", "--recipe-dir", str(ROOT / "tests" / "fixtures" / "tiny_git_recipe"), *TINY_CELL]
MATRIX_COMMANDS = ("render", "plan", "bake", "build", "push", "pull", "lock")


def matrix_tail(command: str) -> list[str]:
    """What each matrix command needs besides the cell to get past its own checks."""
    return {"render": ["-o", "@C@/cwd/Dockerfile"], "plan": [], "bake": ["-f", "@C@/cwd/docker-bake.hcl"],
            "build": ["--out", "@C@/cwd/out", "--work", "@C@/cwd/work"],
            "push": ["--registry", "127.0.0.1:9/ns", "--work", "@C@/cwd/work"],
            "pull": ["--registry", "127.0.0.1:9/ns", "--out", "@C@/cwd/out", "--work", "@C@/cwd/work"],
            "lock": ["--lock", "@C@/cwd/imagegen.lock"]}[command]


def write(path: Path, data: str | bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data if isinstance(data, bytes) else data.encode())
    return path


def set_json_field(path: Path, field: str, value) -> None:
    """Rewrite the JSON document at ``path`` with ``field`` set to ``value`` (a hostile record or manifest)."""
    doc = json.loads(path.read_text())
    doc[field] = value
    path.write_text(json.dumps(doc))


def copy_tree(src: Path, dest: Path) -> None:
    shutil.copytree(src, dest, symlinks=True)


# ---- 1. credentials -----------------------------------------------------------------------


def token_urls(host: str, path: str) -> list[str]:
    """A URL to ``host``/``path`` carrying the token in each way a URL can."""
    return [f"https://{LOGIN}:{TOKEN}@{host}/{path}", f"https://{TOKEN}@{host}/{path}",
            f"HTTPS://{LOGIN}:{TOKEN}@{host}/{path}", f"https://{host}/{path}?token={TOKEN}",
            f"https://{host}/{path}?x=1&access_token={TOKEN}", f"https://{host}/{path}?X-Amz-Signature={TOKEN}",
            f"http://{LOGIN}:{TOKEN}@{host}/{path}", f"https://{LOGIN}%40corp:{TOKEN}@{host}/{path}"]


def credential_cases(s: "Servers") -> list[Case]:
    cases: list[Case] = []
    hosts = ["127.0.0.1:9", s.git_private.base.split("//")[1]]
    for command in MATRIX_COMMANDS:
        for host in hosts:
            for url in [u for i, u in enumerate(token_urls(host, "org/repo.git")) if i in (0, 1, 3, 7)]:
                cases.append(Case("credentials", f"{command} --git {url[:12]}..", [command, *TINY_GIT, "--git",
                                  url + "@v0.1.0", *matrix_tail(command)], expect="refuse"))
    wh = lambda c: copy_tree(s.f / "wheelhouse", c / "cwd" / "wh")  # noqa: E731
    for url in token_urls("127.0.0.1:9", "simple/")[:6]:
        cases.append(Case("credentials", "index --base-url", ["index", "@C@/cwd/wh", "--base-url", url], setup=wh,
                          expect="refuse", allowed=("cwd/wh",)))
        cases.append(Case("credentials", "publish --to", ["publish", "@C@/cwd/wh", "--to", "pypi:" + url], setup=wh,
                          expect="refuse"))
        cases.append(Case("credentials", "publish simple=", ["publish", "@C@/cwd/wh", "--to",
                          f"pypi:http://127.0.0.1:9/legacy/,simple={url}"], setup=wh, expect="refuse"))
        cases.append(Case("credentials", "ci --publish", ["ci", "github", "--bake-file", "@F@/ci/docker-bake.hcl",
                          "--publish", "pypi:" + url, "--imagegen-from", "./tools/imagegen", "-o", "@C@/cwd/wf.yml"],
                          expect="refuse"))
        cases.append(Case("credentials", "ci --imagegen-from", ["ci", "github", "--bake-file",
                          "@F@/ci/docker-bake.hcl", "--publish", "pypi:https://upload.pypi.org/legacy/",
                          "--imagegen-from", f"imagegen @ git+{url}", "-o", "@C@/cwd/wf.yml"], expect="refuse"))
        cases.append(Case("credentials", "refresh --index-url (unreachable)", ["refresh", "--index-url", url,
                          "--dry-run"]))
    # refresh may carry a credential (it is only read here): used against real answers, never shown
    for scenario in ("ok", "401", "404", "500-echo", "redirect-loop", "drip-headers", "echo-page"):
        base = s.index.simple(scenario)
        authed = base.replace("http://", f"http://{LOGIN}:{TOKEN}@")
        cases.append(Case("credentials", f"refresh --index-url userinfo {scenario}",
                          ["refresh", "--index-url", authed, *(["--dry-run"] if scenario != "ok" else [])],
                          env={"IMAGEGEN_REFRESH_DEADLINE": "4"}))
        cases.append(Case("credentials", f"refresh --index-url ?token= {scenario}",
                          ["refresh", "--index-url", f"{base}?token={TOKEN}", "--dry-run"],
                          env={"IMAGEGEN_REFRESH_DEADLINE": "4"}))
    # values that name a registry or an image with a credential
    for command in ("render", "plan", "bake", "build", "push", "pull", "lock"):
        for value in (f"{LOGIN}:{TOKEN}@registry.example/img:1", f"https://{LOGIN}:{TOKEN}@registry.example/img:1"):
            cases.append(Case("credentials", f"{command} --base-image cred", [command, "sage", *CELL, "--base-image",
                              value, *matrix_tail(command)], expect="refuse"))
    for command in ("push", "pull"):
        for value in (f"{LOGIN}:{TOKEN}@127.0.0.1:9/ns", f"https://{LOGIN}:{TOKEN}@127.0.0.1:9/ns"):
            argv = [command, "sage", *CELL, *[a for a in matrix_tail(command) if a != "127.0.0.1:9/ns"]]
            argv[argv.index("--registry") + 1] = value
            cases.append(Case("credentials", f"{command} --registry cred", argv, expect="refuse"))
    for flag in ("--cache-from", "--cache-to"):
        for value in (f"type=registry,ref={LOGIN}:{TOKEN}@127.0.0.1:9/c:t", f"{LOGIN}:{TOKEN}@127.0.0.1:9/c:t"):
            cases.append(Case("credentials", f"build {flag} cred", ["build", "sage", *CELL, flag, value,
                              *matrix_tail("build")], expect="refuse"))
    for command in ("render", "bake", "build"):
        cases.append(Case("credentials", f"{command} --dockerfile-frontend cred", [command, "sage", *CELL,
                          "--dockerfile-frontend", f"{LOGIN}:{TOKEN}@registry.example/df:1", *matrix_tail(command)],
                          expect="refuse"))
    for command in ("render", "plan", "bake", "build"):
        for value in (f"MY_URL=https://{LOGIN}:{TOKEN}@h.example/x", f"PIP_EXTRA_INDEX_URL=https://{LOGIN}:{TOKEN}@h/s",
                      f"HF_TOKEN={TOKEN}", f"MY_TOKEN={TOKEN}"):
            cases.append(Case("credentials", f"{command} --env {value.split('=')[0]}", [command, "sage", *CELL,
                              "--env", value, *matrix_tail(command)], expect="refuse"))
    # a recipe and a config file that carry one
    for key, value in (("git", f"https://{LOGIN}:{TOKEN}@example.invalid/x.git"),
                       ("git", f"https://example.invalid/x.git?token={TOKEN}")):
        def recipe(c: Path, value=value, key=key) -> None:
            text = (ROOT / "tests" / "fixtures" / "tiny_git_recipe" / "tiny.yaml").read_text()
            write(c / "in" / "recipes" / "tiny.yaml", text.replace("https://example.invalid/tiny-kernel.git", value))
            copy_tree(ROOT / "tests" / "fixtures" / "tiny_git_recipe" / "patches", c / "in" / "recipes" / "patches")
        for command in MATRIX_COMMANDS:
            cases.append(Case("credentials", f"{command} recipe source.{key}", [command, "tiny", "--recipe-dir",
                              "@C@/in/recipes", *TINY_CELL, "--version", "0.0.9", *matrix_tail(command)],
                              setup=recipe, expect="refuse", planted=("in/recipes/tiny.yaml",)))
    for line in (f'torch-index-url = "https://{LOGIN}:{TOKEN}@download.example/whl"',
                 f'registry = "{LOGIN}:{TOKEN}@registry.example/ns"'):
        def config(c: Path, line=line) -> None:
            write(c / "in" / "imagegen.toml", line + "\n")
        for command in MATRIX_COMMANDS:
            cases.append(Case("credentials", f"{command} config {line.split()[0]}", [command, "sage", *CELL,
                              "--config", "@C@/in/imagegen.toml", *matrix_tail(command)], setup=config,
                              planted=("in/imagegen.toml",)))
    # credentials in the environment and a netrc: used, never shown
    cases += publish_credential_cases(s)
    for scenario in ("private", "reflect"):
        url = s.git_private.url("tiny.git") if scenario == "private" else s.index.url("git-reflect") + "tiny.git"
        for command in ("build", "plan", "render"):
            def netrc(c: Path) -> None:
                write(c / "home" / ".netrc", f"machine 127.0.0.1 login {LOGIN} password {TOKEN}\n")
            cases.append(Case("credentials", f"{command} --git private ~/.netrc {scenario}", [command, *TINY_GIT,
                              "--git", url + "@v0.1.0", *matrix_tail(command)], setup=netrc,
                              planted=("home/.netrc",)))
            if command == "build":
                for which in ("good", "wrong"):
                    def given(c: Path, which=which) -> None:
                        write(c / "in" / "netrc", f"machine 127.0.0.1 login {LOGIN} password "
                              f"{TOKEN if which == 'good' else 'wrong' + TOKEN[::-1]}\n")
                    cases.append(Case("credentials", f"build --git private --netrc {which} {scenario}",
                                      ["build", *TINY_GIT, "--git", url + "@v0.1.0", "--netrc", "@C@/in/netrc",
                                       *matrix_tail("build")], setup=given, planted=("in/netrc",)))
    return cases


def publish_credential_cases(s: "Servers") -> list[Case]:
    cases = []
    wh = lambda c: copy_tree(s.f / "wheelhouse", c / "cwd" / "wh")  # noqa: E731
    for scenario in ("fake-index", "401", "403-echo", "500-echo", "redirect-upload", "drip-page", "echo-page",
                     "unreachable"):
        if scenario == "fake-index":
            upload = s.fake_index.base + "/legacy/"
        elif scenario == "unreachable":
            upload = "http://127.0.0.1:9/legacy/"
        else:
            upload = s.index.url(scenario) + "legacy/"
        for creds in ({"TWINE_USERNAME": LOGIN, "TWINE_PASSWORD": TOKEN}, {"TWINE_PASSWORD": TOKEN}, "netrc"):
            env = creds if isinstance(creds, dict) else {"NETRC": "@C@/in/netrc"}
            setup = wh if isinstance(creds, dict) else (lambda c: (wh(c), write(
                c / "in" / "netrc", f"machine 127.0.0.1 login {LOGIN} password {TOKEN}\n")))
            cases.append(Case("credentials", f"publish pypi {scenario} {'netrc' if creds == 'netrc' else 'env'}",
                              ["publish", "@C@/cwd/wh", "--to", f"pypi:{upload}"], setup=setup,
                              env={**env, "IMAGEGEN_PUBLISH_DEADLINE": "6"}, timeout=90,
                              planted=("in/netrc",) if creds == "netrc" else ()))
    hub = {"HF_TOKEN": TOKEN, "HF_ENDPOINT": s.fake_hub.base}
    gh = {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": s.fake_github.base}
    for dest, env in (("hf:org/repo", hub), ("hf:org/repo@main:sub", hub),
                      ("hf:org/repo", {"HF_TOKEN": TOKEN, "HF_ENDPOINT": "http://127.0.0.1:9"}),
                      ("hf:org/repo", {"HF_TOKEN": TOKEN, "HF_ENDPOINT": s.index.url("500-echo").rstrip("/")}),
                      ("github:org/repo@v1", gh),
                      ("github:org/repo@v1", {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": "http://127.0.0.1:9"}),
                      ("github:org/repo@v1", {"GITHUB_TOKEN": TOKEN, "GITHUB_API_URL": s.index.url("500-echo").rstrip("/")}),
                      ("s3://bucket/prefix", {"AWS_ACCESS_KEY_ID": "AKIACAMPAIGN", "AWS_SECRET_ACCESS_KEY": TOKEN,
                                              "AWS_ENDPOINT_URL": "http://127.0.0.1:9"}),
                      ("s3://bucket/prefix", {"AWS_ACCESS_KEY_ID": "AKIACAMPAIGN", "AWS_SECRET_ACCESS_KEY": TOKEN,
                                              "AWS_ENDPOINT_URL": s.index.url("500-echo").rstrip("/")})):
        for dry in ([], ["--dry-run"]):
            cases.append(Case("credentials", f"publish {dest.split(':')[0]} env {env.get('HF_ENDPOINT') or env.get('GITHUB_API_URL') or env.get('AWS_ENDPOINT_URL')}",
                              ["publish", "@C@/cwd/wh", "--to", dest, *dry], setup=wh,
                              env={**env, "IMAGEGEN_PUBLISH_DEADLINE": "6"}, timeout=120))
    # the token huggingface-cli login stores
    def hf_login(c: Path) -> None:
        wh(c)
        write(c / "home" / ".cache" / "huggingface" / "token", TOKEN)
    cases.append(Case("credentials", "publish hf stored token", ["publish", "@C@/cwd/wh", "--to", "hf:org/repo"],
                      setup=hf_login, env={"HF_ENDPOINT": "http://127.0.0.1:9"}, planted=("home/.cache/huggingface/token",)))
    return cases


# ---- 2. planted trees ---------------------------------------------------------------------

CATALOGUE_TREE = {"setup.py": "from setuptools import setup\nfrom torch.utils.cpp_extension import CUDAExtension\n"
                              "setup(name='causal_conv1d', version='1.6.1', ext_modules=[CUDAExtension("
                              "name='causal_conv1d_cuda', sources=['csrc/a.cpp'])])\n",
                  "PKG-INFO": "Metadata-Version: 2.1\nName: causal_conv1d\nVersion: 1.6.1\n", "csrc/a.cpp": "int x;\n"}
OWN_TREE = {"setup.py": "from setuptools import setup\nsetup(name='own_kernel', version='0.3.0')\n",
            "own_kernel/__init__.py": "__version__ = '0.3.0'\n"}
HOOKS = ["post-checkout", "pre-commit", "post-commit", "post-index-change", "reference-transaction", "pre-auto-gc",
         "fsmonitor-watchman", "post-merge", "pre-push", "post-rewrite", "push-to-checkout", "sendemail-validate"]


def plant(tree: Path, kind: str, marks: Path) -> None:
    """Make ``tree`` a git repository (one commit) holding a planted command of ``kind``; every command
    planted touches a file in ``marks``."""
    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tree), *args], check=True, capture_output=True,
                       env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1",
                            "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
                            "GIT_COMMITTER_EMAIL": "t@x"})
    mark = lambda name: f"touch {marks}/{name}"  # noqa: E731
    git("init", "-q", "-b", "main")
    if kind in ("filter", "filter-process", "filter-include", "textconv", "diff-command"):
        write(tree / ".gitattributes", "* filter=evil diff=evil\n")
    git("add", "-A")
    git("commit", "-q", "-m", "x")
    git("tag", "-a", "v1.6.1", "-m", "v")
    cfg = tree / ".git" / "config"
    extra = {
        "fsmonitor": f"[core]\n\tfsmonitor = \"{mark('fsmonitor')}; false\"\n",
        "hooks-path": f"[core]\n\thooksPath = {marks.parent / 'hooks'}\n",
        "filter": f"[filter \"evil\"]\n\tclean = \"{mark('clean')}; cat\"\n\tsmudge = \"{mark('smudge')}; cat\"\n",
        "filter-process": f"[filter \"evil\"]\n\tprocess = \"{mark('process')}\"\n\trequired = true\n",
        "filter-include": f"[include]\n\tpath = {marks.parent / 'included.cfg'}\n",
        "textconv": f"[diff \"evil\"]\n\ttextconv = \"{mark('textconv')}; cat\"\n",
        "diff-command": f"[diff \"evil\"]\n\tcommand = \"{mark('diffcmd')}\"\n",
        "diff-external": f"[diff]\n\texternal = \"{mark('external')}\"\n",
        "pager": f"[core]\n\tpager = \"{mark('pager')}; cat\"\n[pager]\n\tstatus = \"{mark('pager2')}; cat\"\n",
        "ssh-command": f"[core]\n\tsshCommand = \"{mark('ssh')}\"\n[remote \"origin\"]\n\turl = ssh://git@example.invalid/x\n"
                       "\tfetch = +refs/heads/*:refs/remotes/origin/*\n",
        "git-proxy": f"[core]\n\tgitProxy = \"{marks.parent / 'proxy.sh'}\"\n",
        "askpass": f"[core]\n\taskPass = \"{marks.parent / 'proxy.sh'}\"\n[credential]\n\thelper = \"!{mark('helper')}\"\n",
        "alternate-refs": f"[core]\n\talternateRefsCommand = \"{mark('altrefs')}\"\n",
        "editor": f"[core]\n\teditor = \"{mark('editor')}\"\n[sequence]\n\teditor = \"{mark('seqeditor')}\"\n",
        "untracked-cache": f"[core]\n\tuntrackedCache = true\n\tfsmonitor = {marks.parent / 'hooks' / 'fsmonitor-watchman'}\n",
        "gc-auto": f"[gc]\n\tauto = 1\n\tautoDetach = false\n[core]\n\thooksPath = {marks.parent / 'hooks'}\n",
    }[kind]
    with cfg.open("a") as fh:
        fh.write(extra)
    for name in HOOKS:  # .git/hooks always, and a hooksPath folder for the kinds that name it
        for folder in (tree / ".git" / "hooks", marks.parent / "hooks"):
            write(folder / name, f"#!/bin/sh\n{mark('hook-' + name)}\n")
            (folder / name).chmod(0o755)
    write(marks.parent / "included.cfg", f"[filter \"evil\"]\n\tclean = \"{mark('inc-clean')}; cat\"\n"
                                         f"\tsmudge = \"{mark('inc-smudge')}; cat\"\n")
    write(marks.parent / "proxy.sh", f"#!/bin/sh\n{mark('proxy')}\n")
    (marks.parent / "proxy.sh").chmod(0o755)
    if kind in ("filter", "filter-process", "filter-include", "textconv", "diff-command", "diff-external"):
        with (tree / "setup.py").open("a") as fh:
            fh.write("# changed after the commit: a dirty tree\n")


PLANT_KINDS = ["fsmonitor", "hooks-path", "filter", "filter-process", "filter-include", "textconv", "diff-command",
               "diff-external", "pager", "ssh-command", "git-proxy", "askpass", "alternate-refs", "editor",
               "untracked-cache", "gc-auto"]


# The control: what plain git (no imagegen) runs of each plant, so that "no planted command ran" under
# imagegen means something. Kinds git runs only on a network fetch of an alternate (alternateRefsCommand)
# have no control here.
PLANT_CONTROLS = {
    "fsmonitor": [["status"]], "untracked-cache": [["status"]], "hooks-path": [["checkout", "-q", "-b", "ctl"]],
    "filter": [["diff"]], "filter-process": [["diff"]], "filter-include": [["diff"]], "textconv": [["diff"]],
    "diff-command": [["diff"]], "diff-external": [["diff"]], "pager": [["-p", "status"]],
    "ssh-command": [["fetch", "-q", "origin"]], "git-proxy": [["fetch", "-q", "git://example.invalid/x"]],
    "askpass": [["credential", "fill"]], "editor": [["commit", "-q", "--allow-empty"]],
    "gc-auto": [["gc", "--auto"], ["commit", "-q", "--allow-empty", "-m", "x"]],
}


def plant_controls(folder: Path) -> dict[str, bool]:
    """kind -> whether plain git ran a planted command of that kind (a marker appeared)."""
    ran = {}
    for kind, commands in PLANT_CONTROLS.items():
        tree, marks = folder / kind / "tree", folder / kind / "marks"
        marks.mkdir(parents=True)
        for rel, text in OWN_TREE.items():
            write(tree / rel, text)
        plant(tree, kind, marks)
        env = {**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_CONFIG_NOSYSTEM": "1", "GIT_TERMINAL_PROMPT": "0",
               "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@x"}
        for name in ("GIT_EDITOR", "VISUAL", "EDITOR", "GIT_PAGER", "PAGER", "GIT_SSH", "GIT_SSH_COMMAND"):
            env.pop(name, None)
        for args in commands:
            subprocess.run(["git", "-C", str(tree), *args], env=env, capture_output=True, timeout=60,
                           input=b"protocol=https\nhost=example.invalid\n\n")
        ran[kind] = any(marks.iterdir())
    return ran


def marker_check(c: Path, results: list) -> str | None:
    found = sorted(p.name for p in (c / "marks").iterdir()) if (c / "marks").is_dir() else []
    return f"planted commands ran: {', '.join(found)}" if found else None


def planted_cases(s: "Servers") -> list[Case]:
    cases = []
    for kind in PLANT_KINDS:
        for tree_kind, files in (("catalogue", CATALOGUE_TREE), ("own", OWN_TREE)):
            def setup(c: Path, kind=kind, files=files) -> None:
                (c / "marks").mkdir()
                for rel, text in files.items():
                    write(c / "in" / "tree" / rel, text)
                plant(c / "in" / "tree", kind, c / "marks")
            tree = "@C@/in/tree"
            cell = CELL if tree_kind == "own" else ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]
            for argv in (["render", "--source", tree, *cell, "-o", "@C@/cwd/Dockerfile"],
                         ["plan", "--source", tree, *cell, "--json"],
                         ["bake", "--source", tree, *cell, "-f", "@C@/cwd/docker-bake.hcl"],
                         ["build", "--source", tree, *cell, "--out", "@C@/cwd/out", "--work", "@C@/cwd/work"],
                         ["plan", "causal-conv1d", "--git", f"file://{tree}@v1.6.1", *cell],
                         ["render", "causal-conv1d", "--git", f"file://{tree}@v1.6.1", *cell, "-o", "@C@/cwd/D"]):
                if tree_kind == "own" and ("--git" in argv or argv[0] == "bake"):
                    continue
                cases.append(Case("planted-trees", f"{argv[0]} {kind} {tree_kind}", argv, setup=setup,
                                  after=marker_check, allowed=("in/tree",) if argv[0] == "build" else ()))
            # ci github from inside the planted repository (its top-folder check runs git there)
            def ci_setup(c: Path, kind=kind, files=files, setup=setup) -> None:
                setup(c)
                shutil.copy(s.f / "ci" / "docker-bake.hcl", c / "in" / "tree" / "docker-bake.hcl")
                copy_tree(s.f / "ci" / "dockerfiles", c / "in" / "tree" / "dockerfiles")
            if tree_kind == "own":
                cases.append(Case("planted-trees", f"ci github {kind}", ["ci", "github", "-o",
                                  "@C@/in/tree/.github/workflows/wheels.yml"], setup=ci_setup, after=marker_check,
                                  env={"CAMPAIGN_CWD": "@C@/in/tree"}, allowed=("in/tree",)))
    return cases


# ---- 3. writes outside --------------------------------------------------------------------


def outside_targets() -> list[tuple[str, str, Callable[[Path], None] | None, bool]]:
    """(name, path, setup, the path leads out on purpose) of outputs given as /, the home folder, system
    folders, and paths that lead out of the case's folder themselves (a link, ``..``): those are the
    folder the user gave, so EROFS there (the sandbox's read-only /) is what writing them meets."""
    def link(name: str, to: str) -> Callable[[Path], None]:
        def make(c: Path) -> None:
            (c / "cwd" / name).symlink_to(sub(to, {"C": str(c), "O": str(c.parent.parent) + "-outside"}))
        return make
    return [
        ("root", "/", None, False), ("home", "@C@/home", None, False), ("etc", "/etc", None, False), ("usr", "/usr", None, False),
        ("tmp", "/tmp", None, False),
        ("proc", "/proc/self", None, False), ("etc-file", "/etc/passwd", None, False),
        ("link-etc", "@C@/cwd/etc-link", link("etc-link", "/etc"), False),
        ("dev-null", "/dev/null", None, False),
        ("link-out", "@C@/cwd/out-link", link("out-link", "@O@/canary"), True),
        ("dotdot", "@C@/cwd/../../../../campaign-escape", None, True),
        ("empty", "", None, True),
    ]


def links_out(kind: str) -> Callable[[Path], None]:
    """A folder the case gives (cwd/wh, cwd) holding a link that leads out of it, into the canary folder
    outside the work folder (read-only: a write through the link is EROFS, a write outside)."""
    def make(c: Path) -> None:
        o = Path(str(c.parent.parent) + "-outside") / "canary"
        wh = c / "cwd" / "wh"
        if kind in ("cell-link", "manifest-link", "lock-link", "pages-link", "index-link", "wheel-link", "record-link"):
            copy_tree(c.parent.parent / "fixtures" / ("exported" if kind in ("cell-link", "record-link") else "wheelhouse"), wh)
        if kind == "cell-link":  # a cell folder of the export is a link to a copy outside
            (wh / "extra").symlink_to(o / "exported")
        elif kind == "manifest-link":
            m = next(wh.rglob("manifest.json"))
            m.unlink()
            m.symlink_to(o / "manifest.json")
        elif kind == "lock-link":
            next(wh.rglob("manifest.json")).with_name(".manifest.json.lock").symlink_to(o / "lock")
        elif kind == "pages-link":
            (wh / "simple").symlink_to(o / "pages")
        elif kind == "index-link":
            (wh / "index.html").symlink_to(o / "index.html")
        elif kind == "wheel-link":
            (c / "cwd" / "fixed").mkdir()
            (c / "cwd" / "fixed" / WHEEL_NAME).symlink_to(o / "x.whl")
        elif kind == "record-link":
            next(wh.rglob("*.imagegen.json")).with_name("other.whl.imagegen.json").symlink_to(o / "record.json")
        elif kind == "scripts-link":
            (c / "cwd" / "imagegen-scripts").symlink_to(o / "scripts")
        elif kind == "dockerfiles-link":
            (c / "cwd" / "dockerfiles").symlink_to(o / "dockerfiles")
        elif kind == "runs-link":
            (c / "cwd" / "work").mkdir()
            (c / "cwd" / "work" / "runs").symlink_to(o / "runs")
        elif kind == "workflows-link":
            (c / "cwd" / ".github").mkdir()
            (c / "cwd" / ".github" / "workflows").symlink_to(o / "workflows")
    return make


def make_canary(o: Path, fixtures: Path) -> None:
    """The folder outside the work folder that links lead into (read-only once the sandbox is locked)."""
    o.mkdir(parents=True, exist_ok=True)
    copy_tree(fixtures / "exported", o / "exported")
    for name in ("pages", "scripts", "dockerfiles", "runs", "workflows"):
        (o / name).mkdir()
    for name in ("manifest.json", "lock", "index.html", "record.json"):
        write(o / name, "{}\n")
    shutil.copyfile(fixtures / "wheel" / WHEEL_NAME, o / "x.whl")


def writes_outside_cases(s: "Servers") -> list[Case]:
    cases = []
    wheel = str(s.f / "wheel" / WHEEL_NAME)
    outputs = [
        ("render -o", lambda t: ["render", "sage", *CELL, "-o", t]),
        ("bake -f", lambda t: ["bake", "sage", *CELL, "-f", t]),
        ("bake --dockerfiles", lambda t: ["bake", "sage", *CELL, "-f", "@C@/cwd/b.hcl", "--dockerfiles", t]),
        ("build --out", lambda t: ["build", "sage", *CELL, "--out", t, "--work", "@C@/cwd/work"]),
        ("build --work", lambda t: ["build", "sage", *CELL, "--out", "@C@/cwd/out", "--work", t]),
        ("plan --audit --work", lambda t: ["plan", "sage", *CELL, "--audit", "--work", t]),
        ("pull --out", lambda t: ["pull", "sage", *CELL, "--registry", "127.0.0.1:9/ns", "--out", t,
                                  "--work", "@C@/cwd/work"]),
        ("collect", lambda t: ["collect", t]),
        ("index", lambda t: ["index", t]),
        ("repair --out", lambda t: ["repair", wheel, "--out", t]),
        ("cdi-spec -o", lambda t: ["cdi-spec", "-o", t]),
        ("ci github -o", lambda t: ["ci", "github", "--bake-file", "@F@/ci/docker-bake.hcl", "-o", t]),
    ]
    for what, make in outputs:
        for name, target, setup, leads_out in outside_targets():
            cases.append(Case("writes-outside", f"{what} {name}", make(target), setup=setup,
                              expect="any" if leads_out else "refuse", erofs_ok=leads_out))
    # a folder given that holds a link leading out of it: nothing is written through the link
    for kind, argv in (("cell-link", ["collect", "@C@/cwd/wh"]), ("manifest-link", ["collect", "@C@/cwd/wh"]),
                       ("manifest-link", ["index", "@C@/cwd/wh"]), ("lock-link", ["collect", "@C@/cwd/wh"]),
                       ("pages-link", ["index", "@C@/cwd/wh"]), ("index-link", ["index", "@C@/cwd/wh"]),
                       ("record-link", ["collect", "@C@/cwd/wh"]), ("wheel-link", ["repair", wheel, "--out", "@C@/cwd/fixed"]),
                       ("scripts-link", ["render", "sage", *CELL, "-o", "@C@/cwd/Dockerfile"]),
                       ("dockerfiles-link", ["bake", "sage", *CELL, "-f", "@C@/cwd/docker-bake.hcl"]),
                       ("runs-link", ["build", "sage", *CELL, "--out", "@C@/cwd/out", "--work", "@C@/cwd/work"]),
                       ("runs-link", ["plan", "sage", *CELL, "--audit", "--work", "@C@/cwd/work"]),
                       ("workflows-link", ["ci", "github", "--bake-file", "@F@/ci/docker-bake.hcl"]),
                       ("manifest-link", ["publish", "@C@/cwd/wh", "--to", "pypi:http://127.0.0.1:9/legacy/", "--dry-run"]),
                       ("cell-link", ["index", "@C@/cwd/wh"])):
        cases.append(Case("writes-outside", f"{argv[0]} {kind}", argv, setup=links_out(kind),
                          allowed=("cwd/wh", "cwd/fixed"), erofs_ok=kind == "dockerfiles-link"))
    # no folder for temporary files at all (TMPDIR a system folder, the current folder read-only)
    for argv in (["verify", f"@F@/wheel/{WHEEL_NAME}", "--arch", "8.0"], ["collect", "@C@/cwd/wh"],
                 ["repair", f"@F@/wheel/{WHEEL_NAME}", "--out", "@C@/cwd/r"], ["index", "@C@/cwd/wh"]):
        cases.append(Case("writes-outside", f"{argv[0]} without a temporary folder", argv,
                          setup=lambda c: copy_tree(s.f / "exported", c / "cwd" / "wh"),
                          env={"TMPDIR": "/etc", "CAMPAIGN_CWD": "/"}, allowed=("cwd/wh",)))
    # the environment's own places given as system folders or outside
    for var in ("XDG_CACHE_HOME", "IMAGEGEN_COMPAT_DIR", "HOME"):
        for target in ("/etc", "@O@/canary"):
            for argv in (["refresh", "--index-url", s.index.simple("ok")], ["plan", "sage", *CELL],
                         ["render", "tiny", "--git", f"file://{s.f}/tinyrepo@v0.1.0", "--recipe-dir",
                          str(ROOT / "tests" / "fixtures" / "tiny_git_recipe"), *TINY_CELL, "-o", "@C@/cwd/D"]):
                cases.append(Case("writes-outside", f"{argv[0]} {var}={target}", argv, env={var: target},
                                  erofs_ok=target.startswith("@O@")))  # a place the user named, outside
    return cases


# ---- 4. cdi-spec --------------------------------------------------------------------------


def fake_driver(folder: Path, version: str = "580.65.06", extra: dict[str, str] | None = None) -> None:
    """A driver's libraries (files named as the driver's, not real ELF) with their SONAME links."""
    folder.mkdir(parents=True, exist_ok=True)
    for lib in ("libcuda", "libnvidia-ml", "libnvidia-ptxjitcompiler", "libnvidia-nvvm"):
        write(folder / f"{lib}.so.{version}", b"\x7fELF not really\n")
        (folder / f"{lib}.so.1").symlink_to(f"{lib}.so.{version}")
    for name, to in (extra or {}).items():
        (folder / name).symlink_to(to)


def cdi_cases(s: "Servers") -> list[Case]:
    cases = []

    def home_driver(c: Path) -> None:
        write(c / "home" / ".ssh" / "id_ed25519", f"-----BEGIN OPENSSH PRIVATE KEY----- {TOKEN}\n")
        write(c / "home" / ".netrc", f"machine h login u password {TOKEN}\n")
        fake_driver(c / "home" / "lib", extra={"libnvidia-cfg.so.1": "../.netrc"})
        write(c / "home" / "bin" / "nvidia-smi", "#!/bin/sh\n")

    def odd_driver(kind: str) -> Callable[[Path], None]:
        def make(c: Path) -> None:
            d = c / "in" / "drv"
            d.mkdir(parents=True)
            write(c / "in" / "secret.txt", TOKEN)
            if kind == "fifo":
                os.mkfifo(d / "libcuda.so.1")
            elif kind == "dev-zero":
                (d / "libcuda.so.1").symlink_to("/dev/zero")
            elif kind == "loop":
                (d / "libcuda.so.1").symlink_to("libcuda.so.1")
            elif kind == "dir":
                (d / "libcuda.so.1").mkdir()
            elif kind == "to-secret":
                (d / "libcuda.so.1").symlink_to("../secret.txt")
                (d / "libnvidia-ml.so.1").symlink_to("../secret.txt")
            elif kind == "versioned-secret":
                fake_driver(d)
                os.unlink(d / "libnvidia-ml.so.1")
                (c / "in" / "secret.txt").rename(d / "libnvidia-ml.so.580.65.06.bak")
                (d / "libnvidia-ml.so.1").symlink_to("libnvidia-ml.so.580.65.06.bak")
            elif kind == "many":
                fake_driver(d)
                for i in range(3000):
                    write(d / f"libnvidia-x{i}.so.1", b"")
            elif kind == "no-version":
                write(d / "libcuda.so.1", b"\x7fELF")
            elif kind == "whole-tree":
                fake_driver(d / "lib64")
                (d / "lib64" / "libcuda.so.1").unlink()
                (d / "lib64" / "libcuda.so.1").symlink_to("../../secret.txt")
        return make
    paths = [("home lib", "@C@/home/lib", home_driver, ("home/.ssh/id_ed25519", "home/.netrc"))]
    for kind in ("fifo", "dev-zero", "loop", "dir", "to-secret", "versioned-secret", "many", "no-version", "whole-tree"):
        paths.append((kind, "@C@/in/drv" + ("/lib64" if kind == "whole-tree" else ""), odd_driver(kind),
                      ("in/secret.txt",) if kind not in ("versioned-secret",) else ("in/drv/libnvidia-ml.so.580.65.06.bak",)))
    for what, ld, setup, planted in paths:
        for out in ([], ["-o", "@C@/cwd/cdi.json"], ["-o", "/etc/cdi/imagegen-campaign.json"],
                    ["-o", "/run/cdi/x.json"]):
            cases.append(Case("cdi-spec", f"cdi-spec {what} {' '.join(out)[:30]}", ["cdi-spec", *out], setup=setup,
                              env={"LD_LIBRARY_PATH": ld}, planted=planted,
                              erofs_ok=any(o.startswith(("/etc/cdi/", "/run/cdi/")) for o in out)))
    for ld in ("", ":", "relative/lib", "/nonexistent", "@C@/home/lib:@C@/home/lib", "/dev/null", "/proc/self/fd",
               "x" * 5000, "/etc", "@C@/home"):
        cases.append(Case("cdi-spec", f"cdi-spec LD_LIBRARY_PATH={ld[:20]}", ["cdi-spec"], setup=home_driver,
                          env={"LD_LIBRARY_PATH": ld}, planted=("home/.ssh/id_ed25519", "home/.netrc")))
    return cases


# ---- 5. hostile servers -------------------------------------------------------------------

INDEX_SCENARIOS = ["ok", "relative", "files-5", "files-mixed", "deep", "deep-files", "no-url", "url-5", "size-abc",
                   "size-neg", "no-size", "ftp-url", "file-url", "data-url", "fifo-url", "redirect-loop",
                   "redirect-file", "redirect-page-loop", "metadata-bomb", "drip-headers", "drip-body", "drip-metadata",
                   "huge-page", "html-page", "not-json", "500-echo", "401", "404", "never-answer", "close-early",
                   "wrong-length", "chunked-endless", "non-utf8", "gzip-bomb", "api-99", "filename-dotdot",
                   "filename-abs", "range-ignored", "range-lies", "empty"]


def server_cases(s: "Servers") -> list[Case]:
    cases = []
    for scenario in INDEX_SCENARIOS:
        for dry in (["--dry-run"], *([[]] if scenario in ("ok", "relative", "drip-body", "metadata-bomb", "fifo-url") else [])):
            cases.append(Case("servers", f"refresh {scenario} {' '.join(dry)}", ["refresh", "--index-url",
                              s.index.simple(scenario), *dry], env={"IMAGEGEN_REFRESH_DEADLINE": "5"}, timeout=60,
                              expect="ok" if scenario in ("ok", "relative") else "any"))
    wh = lambda c: copy_tree(s.f / "wheelhouse", c / "cwd" / "wh")  # noqa: E731
    for scenario in ("drip-page", "drip-upload", "redirect-page-loop", "redirect-upload", "huge-page", "500-echo",
                     "never-answer", "close-early", "chunked-endless", "401", "echo-page", "html-odd", "gzip-bomb",
                     "page-no-hash", "page-deep-html"):
        upload = s.index.url(scenario) + "legacy/"
        for dry in ([], ["--dry-run"]):
            cases.append(Case("servers", f"publish pypi {scenario} {' '.join(dry)}", ["publish", "@C@/cwd/wh", "--to",
                              f"pypi:{upload}", *dry], setup=wh,
                              env={"TWINE_USERNAME": LOGIN, "TWINE_PASSWORD": TOKEN, "IMAGEGEN_PUBLISH_DEADLINE": "6"},
                              timeout=90))
    for scenario in ("git-drip", "git-redirect-loop", "git-500-echo", "git-huge-refs", "git-never-answer", "git-401",
                     "git-reflect", "git-garbage"):
        for command in ("plan", "build"):
            cases.append(Case("servers", f"{command} --git {scenario}", [command, *TINY_GIT, "--git",
                              s.index.url(scenario) + "tiny.git@v0.1.0", *matrix_tail(command)], timeout=150))
    return cases


# ---- 6. manifests and build records --------------------------------------------------------

MANIFEST_KINDS = ["fifo", "sparse-3gib", "dev-zero", "deep", "dir", "loop", "to-passwd", "invalid", "list", "cells-5",
                  "entry-5", "wheel-dotdot", "wheel-abs", "sha-5", "archs-5", "huge-string", "non-utf8", "bom",
                  "nan", "dup-keys"]


def hostile_manifest(path: Path, kind: str) -> None:
    if path.exists() or path.is_symlink():
        path.unlink()
    doc = {"schema": 1, "cells": {"x": {"wheel": "x.whl"}}}
    if kind == "fifo":
        os.mkfifo(path)
    elif kind == "sparse-3gib":
        with path.open("wb") as fh:
            fh.truncate(3 << 30)
    elif kind == "dev-zero":
        path.symlink_to("/dev/zero")
    elif kind == "deep":
        path.write_text('{"schema": 1, "cells": ' + "[" * 200_000 + "]" * 200_000 + "}")
    elif kind == "dir":
        path.mkdir()
    elif kind == "loop":
        path.symlink_to(path.name)
    elif kind == "to-passwd":
        path.symlink_to("/etc/passwd")
    elif kind == "invalid":
        path.write_text("{not json")
    elif kind == "list":
        path.write_text("[1, 2]")
    elif kind == "cells-5":
        path.write_text('{"schema": 1, "cells": 5}')
    elif kind == "entry-5":
        path.write_text('{"schema": 1, "cells": {"x": 5, "y": [], "z": null}}')
    elif kind == "wheel-dotdot":
        path.write_text(json.dumps({"schema": 1, "cells": {"x": {"wheel": "../../../../etc/passwd", "sha256": "0" * 64}}}))
    elif kind == "wheel-abs":
        path.write_text(json.dumps({"schema": 1, "cells": {"x": {"wheel": "/etc/passwd", "sha256": "0" * 64}}}))
    elif kind == "sha-5":
        path.write_text(json.dumps({"schema": 1, "cells": {"x": {"wheel": "x.whl", "sha256": 5, "archs": 5}}}))
    elif kind == "archs-5":
        path.write_text(json.dumps({"schema": 1, "cells": {"x": {"wheel": 5, "archs": {"a": 1}, "torch": []}}}))
    elif kind == "huge-string":
        path.write_text(json.dumps({"schema": 1, "cells": {"x": {"wheel": "x" * (20 * MIB)}}}))
    elif kind == "non-utf8":
        path.write_bytes(b'{"schema": 1, "cells": {"\xff\xfe": {}}}')
    elif kind == "bom":
        path.write_bytes(b"\xef\xbb\xbf" + json.dumps(doc).encode())
    elif kind == "nan":
        path.write_text('{"schema": NaN, "cells": {"x": {"wheel": Infinity}}}')
    elif kind == "dup-keys":
        path.write_text('{"schema": 1, "cells": {}, "cells": {"x": {"wheel": "a.whl"}}}')


def manifest_cases(s: "Servers") -> list[Case]:
    cases = []
    for kind in MANIFEST_KINDS:
        def wh(c: Path, kind=kind) -> None:
            copy_tree(s.f / "wheelhouse", c / "cwd" / "wh")
            hostile_manifest(next((c / "cwd" / "wh").rglob("manifest.json")), kind)

        def exp(c: Path, kind=kind) -> None:
            copy_tree(s.f / "exported", c / "cwd" / "wh")
            record = next((c / "cwd" / "wh").rglob("*.imagegen.json"))
            hostile_manifest(record.parent / "manifest.json", kind)

        def rec(c: Path, kind=kind) -> None:
            copy_tree(s.f / "exported", c / "cwd" / "wh")
            hostile_manifest(next((c / "cwd" / "wh").rglob("*.imagegen.json")), kind)
        for what, setup, argv in (
                ("collect manifest", exp, ["collect", "@C@/cwd/wh"]),
                ("collect record", rec, ["collect", "@C@/cwd/wh"]),
                ("index manifest", wh, ["index", "@C@/cwd/wh"]),
                ("publish manifest", wh, ["publish", "@C@/cwd/wh", "--to", "pypi:http://127.0.0.1:9/legacy/", "--dry-run"]),
                ("build up-to-date", wh, ["build", "tiny-kernel" if False else "--source", str(ROOT / "tests" / "fixtures" / "tiny_kernel"),
                                          *TINY_CELL, "--out", "@C@/cwd/wh", "--work", "@C@/cwd/work"])):
            cases.append(Case("manifests", f"{what} {kind}", argv, setup=setup, allowed=("cwd/wh",), timeout=90))
    return cases


# ---- 7. wheels ----------------------------------------------------------------------------


def hostile_wheel(path: Path, kind: str, src: Path) -> Path:
    """A wheel named like ``src`` at ``path``'s folder, hostile in ``kind``."""
    import io
    import zipfile

    from tests.unit.test_hostile_reads import _deflated, _zip, bomb_wheel, zeros_member
    path.parent.mkdir(parents=True, exist_ok=True)
    dest = path.parent / src.name
    if kind == "bomb-data":
        return bomb_wheel(src, dest, "tiny_kernel/data.bin", 600)
    if kind == "bomb-so":
        with zipfile.ZipFile(src) as zf:
            members = [(i.filename, *_deflated(zf.read(i))) for i in zf.infolist() if not i.filename.endswith(".so")]
            so = next(i.filename for i in zf.infolist() if i.filename.endswith(".so"))
        members.insert(0, (so, *zeros_member(600)))
        dest.write_bytes(_zip(members))
    elif kind == "fifo":
        os.mkfifo(dest)
    elif kind == "dev-zero":
        dest.symlink_to("/dev/zero")
    elif kind == "dir":
        dest.mkdir()
    elif kind == "not-zip":
        dest.write_bytes(b"PK\x03\x04 this is not a zip" * 100)
    elif kind == "truncated":
        dest.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    elif kind == "empty":
        dest.write_bytes(b"")
    elif kind in ("dotdot", "absolute", "drive", "backslash"):
        name = {"dotdot": "../../escape.py", "absolute": "/tmp/escape.py", "drive": "C:/escape.py",
                "backslash": "..\\..\\escape.py"}[kind]
        shutil.copyfile(src, dest)
        with zipfile.ZipFile(dest, "a") as zf:
            zf.writestr(name, "ESCAPED = True\n")
    elif kind == "symlink-member":
        shutil.copyfile(src, dest)
        with zipfile.ZipFile(dest, "a") as zf:
            info = zipfile.ZipInfo("tiny_kernel/link")
            info.external_attr = (stat.S_IFLNK | 0o777) << 16
            zf.writestr(info, "/etc/passwd")
    elif kind == "many-members":
        buf = io.BytesIO()
        with zipfile.ZipFile(src) as zin, zipfile.ZipFile(buf, "w") as zout:
            for i in zin.infolist():
                zout.writestr(i, zin.read(i))
            for n in range(60000):
                zout.writestr(f"tiny_kernel/f{n}.py", "")
        dest.write_bytes(buf.getvalue())
    elif kind == "size-lies":
        data = bytearray(src.read_bytes())
        # every central-directory entry claims 1 byte uncompressed
        i = data.find(b"PK\x01\x02")
        while i != -1:
            data[i + 24:i + 28] = (1).to_bytes(4, "little")
            i = data.find(b"PK\x01\x02", i + 4)
        dest.write_bytes(bytes(data))
    elif kind == "dup-names":
        shutil.copyfile(src, dest)
        with zipfile.ZipFile(dest, "a") as zf:
            zf.writestr("tiny_kernel/__init__.py", "raise SystemExit('the second copy')\n")
    elif kind == "bad-name":
        bad = path.parent / "not a wheel name.whl"
        shutil.copyfile(src, bad)
        return bad
    elif kind == "dotdot-name":
        bad = path.parent / "..whl"
        shutil.copyfile(src, bad)
        return bad
    return dest


WHEEL_KINDS = ["bomb-data", "bomb-so", "fifo", "dev-zero", "dir", "not-zip", "truncated", "empty", "dotdot", "absolute",
               "drive", "backslash", "symlink-member", "many-members", "size-lies", "dup-names", "bad-name", "dotdot-name"]


def wheel_cases(s: "Servers") -> list[Case]:
    cases = []
    for kind in WHEEL_KINDS:
        def setup(c: Path, kind=kind) -> None:
            w = hostile_wheel(c / "in" / "w" / "x.whl", kind, s.f / "wheel" / WHEEL_NAME)
            (c / "in" / "name").write_text(w.name)
        for what, argv, extra in (
                ("verify", ["verify", "@W@", "--arch", "8.0"], {}),
                ("verify --python-exe", ["verify", "@W@", "--arch", "8.0", "--python-exe", sys.executable], {}),
                ("check", ["check", "@W@", "--recipe-dir", "@F@/check/recipes", "--recipe", "tiny-kernel"],
                 {"PYTHONPATH": "@F@/check/torch-gpu"}),
                ("repair", ["repair", "@W@", "--out", "@C@/cwd/fixed"], {})):
            cases.append(Case("wheels", f"{what} {kind}", argv, setup=setup, env=extra, timeout=120))
        def exported(c: Path, kind=kind) -> None:
            copy_tree(s.f / "exported", c / "cwd" / "wh")
            record = next((c / "cwd" / "wh").rglob("*.imagegen.json"))
            wheel = record.with_name(record.name[: -len(".imagegen.json")])
            wheel.unlink()
            made = hostile_wheel(wheel, kind, s.f / "wheel" / WHEEL_NAME)
            if made.name != wheel.name:
                record.rename(made.with_name(made.name + ".imagegen.json"))
        cases.append(Case("wheels", f"collect {kind}", ["collect", "@C@/cwd/wh"], setup=exported, allowed=("cwd/wh",),
                          timeout=120))
    return cases


# ---- 8. former exit 70s -------------------------------------------------------------------


def exit70_cases(s: "Servers") -> list[Case]:
    cases = []
    fields = {"patches": [5, "x", [5], [{"name": 5}], {"a": 1}, None], "cell": [5, [], {}, None, "../x"],
              "archs": [5, [], {}, "not;archs"], "smoke": [5, "x", [], {"ok": "yes"}, {"ok": True, "imports": 5}],
              "verify": [5, "x", {"ok": 5}], "inputs": [5, [], None], "torch": [5, {}], "sha256": [5, "zz"],
              "wheel": [5, "../x.whl", "/etc/passwd"], "audit": [5, "x", {"verdict": 5}], "seconds": ["x", -1, 1e308]}
    for field, values in fields.items():
        for value in values:
            def setup(c: Path, field=field, value=value) -> None:
                copy_tree(s.f / "exported", c / "cwd" / "wh")
                set_json_field(next((c / "cwd" / "wh").rglob("*.imagegen.json")), field, value)
            cases.append(Case("exit70", f"collect record {field}={json.dumps(value)[:20]}", ["collect", "@C@/cwd/wh"],
                              setup=setup, allowed=("cwd/wh",)))
    for field, value in (("cells", {"x": {"archs": 5}}), ("cells", {"x": {"wheel": "x.whl", "smoke": 5}}),
                         ("schema", "x"), ("cells", {"x": {"wheel": "tiny_kernel-0.1.0+cu130torch2.11-cp311-cp311-linux_x86_64.whl",
                                                           "sha256": None, "archs": None}})):
        def wh(c: Path, field=field, value=value) -> None:
            copy_tree(s.f / "wheelhouse", c / "cwd" / "wh")
            set_json_field(next((c / "cwd" / "wh").rglob("manifest.json")), field, value)
        for argv in (["index", "@C@/cwd/wh"], ["publish", "@C@/cwd/wh", "--to", "pypi:http://127.0.0.1:9/legacy/",
                                               "--dry-run"], ["collect", "@C@/cwd/wh"]):
            cases.append(Case("exit70", f"{argv[0]} manifest {field}", argv, setup=wh, allowed=("cwd/wh",)))
    # --git file:// of repositories holding what an export must not carry
    for kind in ("abs-link", "out-link", "dir-link-out", "link-chain", "fifo-file", "submodule", "huge-file",
                 "non-utf8-name", "export-subst", "lfs-pointer", "gitlink-only", "empty-commit"):
        def repo(c: Path, kind=kind) -> None:
            r = c / "in" / "repo"
            copy_tree(s.f / "tinyrepo", r)
            g = lambda *a: subprocess.run(["git", "-C", str(r), *a], check=True, capture_output=True,  # noqa: E731
                                          env={**os.environ, "GIT_CONFIG_GLOBAL": "/dev/null", "GIT_AUTHOR_NAME": "t",
                                               "GIT_AUTHOR_EMAIL": "t@x", "GIT_COMMITTER_NAME": "t",
                                               "GIT_COMMITTER_EMAIL": "t@x"})
            if kind == "abs-link":
                (r / "evil").symlink_to("/etc/passwd")
            elif kind == "out-link":
                (r / "evil").symlink_to("../../../../outside")
            elif kind == "dir-link-out":
                (r / "csrc" / "up").symlink_to("../..")
            elif kind == "link-chain":
                (r / "a").symlink_to("b")
                (r / "b").symlink_to("/etc")
            elif kind == "fifo-file":
                write(r / "notes.txt", "x\n")
            elif kind == "submodule":
                write(r / ".gitmodules", '[submodule "s"]\n\tpath = s\n\turl = ../../../../etc\n')
            elif kind == "huge-file":
                with (r / "big.bin").open("wb") as fh:
                    fh.truncate(200 * MIB)
            elif kind == "non-utf8-name":
                (r / os.fsdecode(b"name-\xff.txt")).write_text("x\n")
            elif kind == "export-subst":
                write(r / ".gitattributes", "* export-subst\n")
                write(r / "v.txt", "$Format:%H %(describe)$\n")
            elif kind == "lfs-pointer":
                write(r / ".gitattributes", "*.bin filter=lfs diff=lfs merge=lfs -text\n")
                write(r / "x.bin", "version https://git-lfs.github.com/spec/v1\noid sha256:00\nsize 1\n")
            elif kind == "gitlink-only":
                g("update-index", "--add", "--cacheinfo", "160000," + "1" * 40 + ",vendored")
            if kind != "empty-commit":
                g("add", "-A")
            g("commit", "-q", "--allow-empty", "-m", kind)
            g("tag", "-f", "-a", "v0.1.0", "-m", "0.1.0")
        for command in ("plan", "render"):
            cases.append(Case("exit70", f"{command} --git file:// {kind}", [command, *TINY_GIT, "--git",
                              "file://@C@/in/repo@v0.1.0", *matrix_tail(command)], setup=repo, timeout=120))
    return cases


# ---- 9. layouts ---------------------------------------------------------------------------

LAYOUTS = ["/".join(["{package}"] * 9), "/".join(["x"] * 20), "{{package}}", "{package}/../x", "/abs/{package}",
           "{unknown}", "", "x" * 300, "~/{package}", "{package}\n", "{", "{package", "..", "{cuda}\\{python}",
           "C:/{package}", "{package}/$HOME", "{package}/${IMAGEGEN_PIP_CERT}", "{0}", "{package!r}", "{package:>300}",
           "{package.__class__}"]


def layout_cases(s: "Servers") -> list[Case]:
    cases = []
    for layout in LAYOUTS:
        for command in ("plan", "bake", "build"):
            cases.append(Case("layouts", f"{command} --layout {layout[:20]!r}", [command, "sage", *CELL, "--layout",
                              layout, *matrix_tail(command)]))
        def config(c: Path, layout=layout) -> None:
            write(c / "in" / "imagegen.toml", f"layout = {json.dumps(layout)}\n")
        cases.append(Case("layouts", f"config layout {layout[:20]!r}", ["plan", "sage", *CELL, "--config",
                          "@C@/in/imagegen.toml"], setup=config))
    return cases


# ---- 10. silently ignored input -----------------------------------------------------------


def ignored_cases(s: "Servers") -> list[Case]:
    cases = []
    tree = str(ROOT / "tests" / "fixtures" / "tiny_kernel")
    refuse = [
        (["--base-image", ""], "empty base image"), (["--base-image", "12.8="], "CUDA= nothing"),
        (["--base-image", ","], "comma"), (["--base-image", "img,"], "trailing comma"),
        (["--base-image", "=img"], "=img"), (["--base-image", "12.8=,x"], "12.8=,x"),
        (["--arch", ""], "empty arch"), (["--torch", ""], "empty torch"), (["--cuda", ""], "empty cuda"),
        (["--python", ""], "empty python"), (["--platform", ""], "empty platform"), (["--env", ""], "empty env"),
        (["--env", "NAME"], "env without ="), (["--env", "=x"], "env without name"),
        (["--env", "TORCH_CUDA_ARCH_LIST=7.0"], "env imagegen sets"), (["--env", "MAX_JOBS=99"], "env MAX_JOBS"),
        (["--version", ""], "empty version"), (["--version", "9.9.9"], "unknown version"),
        (["--flavor", "pypi", "--flavor", "runpod"], "two flavors"), (["--gpu-check-device", ""], "empty device"),
        (["--torch", "2.8", "--torch", "banana"], "one bad torch of two"), (["--arch", "9.0", "--arch", ""], "empty second arch"),
        (["--python", "3.12", "--python", "2.7"], "python 2.7"), (["--cuda", "12.8", "--cuda", "cu999"], "cu999"),
        (["--fetch", "sdist", "--source", tree], "fetch sdist with source"),
        (["--ref", "main", "--source", tree], "ref with source"),
    ]
    for extra, what in refuse:
        for command in ("plan", "render", "build"):
            argv = [command, *(["sage"] if "--source" not in extra else []), *CELL, *extra, *matrix_tail(command)]
            cases.append(Case("ignored-input", f"{command} {what}", argv, expect="refuse"))
    for command in ("plan", "render", "bake", "build"):
        cases.append(Case("ignored-input", f"{command} --source --version", [command, "--source", tree, *TINY_CELL,
                          "--version", "7.7", *matrix_tail(command)], expect="refuse"))
    for name in ("5", "5.0", "true", "[a]", "{a: 1}", "null", '""', "'../x'"):
        def recipe(c: Path, name=name) -> None:
            text = (ROOT / "tests" / "fixtures" / "tiny_git_recipe" / "tiny.yaml").read_text()
            write(c / "in" / "recipes" / "tiny.yaml", text.replace("name: tiny", f"name: {name}"))
        cases.append(Case("ignored-input", f"recipe name: {name}", ["plan", "tiny", "--recipe-dir", "@C@/in/recipes",
                          *TINY_CELL], setup=recipe, expect="refuse"))
    for flag, value in (("--max-jobs", "0"), ("--max-jobs", "-1"), ("--max-jobs", "99999999999999999999"),
                        ("--nvcc-threads", "0"), ("--nvcc-threads", "-3"), ("--max-jobs", "nan")):
        cases.append(Case("ignored-input", f"build {flag} {value}", ["build", "sage", *CELL, flag, value,
                          *matrix_tail("build")], expect="refuse"))
    for value in ("-1", "0", "nan", "inf", "1e400", "x"):
        cases.append(Case("ignored-input", f"check --timeout {value}", ["check", "@DEMO@", "--recipe-dir",
                          "@F@/check/recipes", "--timeout", value], env={"PYTHONPATH": "@F@/check/torch-gpu"},
                          expect="refuse"))
    for argv, what in ((["render", "sage", *CELL, "--audit"], "render --audit without -o?"),
                       (["plan", "sage", *CELL, "--only", "skipped", "--json"], "plan --only skipped --json"),
                       (["archs", ""], "archs empty"), (["archs", "9.0", "--cuda", ""], "archs --cuda empty"),
                       (["verify", f"@F@/wheel/{WHEEL_NAME}", "--arch", ""], "verify --arch empty"),
                       (["index", "@F@/wheelhouse", "--base-url", ""], "index --base-url empty"),
                       (["publish", "@F@/wheelhouse", "--to", ""], "publish --to empty"),
                       (["refresh", "--index-url", ""], "refresh --index-url empty"),
                       (["repair", f"@F@/wheel/{WHEEL_NAME}", "--plat", ""], "repair --plat empty"),
                       (["repair", f"@F@/wheel/{WHEEL_NAME}", "--plat", "manylinux_9_99_x86_64", "--out", "@C@/cwd/r"], "repair --plat future"),
                       (["ci", "github", "--bake-file", "@F@/ci/docker-bake.hcl", "--max-parallel", "0", "-o", "@C@/cwd/w.yml"], "ci --max-parallel 0"),
                       (["ci", "github", "--bake-file", "@F@/ci/docker-bake.hcl", "--targets", "", "-o", "@C@/cwd/w.yml"], "ci --targets empty"),
                       (["ci", "github", "--bake-file", "@F@/ci/docker-bake.hcl", "--runs-on", "", "-o", "@C@/cwd/w.yml"], "ci --runs-on empty")):
        cases.append(Case("ignored-input", what, argv, expect="any" if "--audit" in argv or "--only" in argv else "refuse"))
    return cases


# ---- 11. ci destinations ------------------------------------------------------------------


def ci_cases(s: "Servers") -> list[Case]:
    cases = []
    ci = ["ci", "github", "--bake-file", "@F@/ci/docker-bake.hcl", "-o", "@C@/cwd/wf.yml"]
    frm = ["--imagegen-from", "./tools/imagegen"]
    bad = ["pypi:ftp://h/legacy/", "pypi:https://h/legacy/,simple=https://a/,simple=https://b/", "hf:a/b@main:x/../../y",
           "hf:a--b/c", "hf:a/b@", "s3://UPPER/x", "s3://b/../x", "github:../x@t", "github:o/r", "github:o/r@",
           "pypi:https://h/le gacy/", "pypi:https://h/legacy/\nrun: x", "pypi:https://h/legacy/?x=1", "s3://b/x y",
           "hf:a/b@${{ secrets.X }}", "github:o/r@v1;rm", "pypi:https://h:99999/legacy/", "file:///etc/passwd",
           "pypi:", "hf:", "s3://", "simple=https://h/", "pypi:https://h/legacy/#frag", "pypi:javascript:alert(1)"]
    for dest in bad:
        cases.append(Case("ci-destinations", f"--publish {dest[:30]!r}", [*ci, "--publish", dest, *frm], expect="refuse"))
        cases.append(Case("ci-destinations", f"publish --to {dest[:30]!r}", ["publish", "@F@/wheelhouse", "--to", dest,
                          "--dry-run"], expect="refuse"))
    for req in ("imagegen #", "IMAGEGEN>=1", "imagegen ; python_version>'0'", "imagegen[publish]", "imagegen==1.0",
                "imagegen @ file:///etc", "-e .", "--index-url http://x imagegen", "imagegen\nrun: echo x",
                "imagegen @ git+https://github.com/o/imagegen@v1 ; os_name=='nt'", "../../../etc", "", " ",
                "${{ github.token }}", "imagegen @ https://h/x.whl#sha256=00", "Imagegen", "image-gen", "image_gen"):
        cases.append(Case("ci-destinations", f"--imagegen-from {req[:30]!r}", [*ci, "--publish",
                          "pypi:https://upload.pypi.org/legacy/", "--imagegen-from", req],
                          expect="refuse" if req.lower().startswith(("imagegen", "image")) or not req.strip()
                          or req.startswith(("-", "$")) or "\n" in req else "any"))
    for flag, value in (("--runs-on", "${{ secrets.X }}"), ("--runs-on", "a\nb"), ("--runs-on", "x, y, '"),
                        ("--registry", "ghcr.io/${{ x }}"), ("--namespace", "../x"), ("--namespace", "a b"),
                        ("--arm64-runs-on", "'; rm -rf /"), ("--max-parallel", "-1"), ("--max-parallel", "1e9"),
                        ("--windows", "sage;x"), ("--windows-timeout", "0"), ("--windows-timeout", "99999999"),
                        ("--windows-runs-on", "${{ x }}"), ("--windows-arch", "''"), ("--targets", "a,,b"),
                        ("--group", "../x"), ("--bake-file", "/etc/passwd"), ("--bake-file", "/dev/zero")):
        cases.append(Case("ci-destinations", f"ci {flag} {value[:20]!r}", [*ci, flag, value], expect="refuse"))
    return cases


# ---- 12. repair members -------------------------------------------------------------------


def repair_cases(s: "Servers") -> list[Case]:
    import zipfile
    cases = []
    # The first nine leave the wheel (absolute, a drive, a '..' part: refused); the others are odd names that
    # stay inside it (pip installs them where they say).
    leaving = ("../x.py", "../../etc/cron.d/x", "/abs.py", "tiny_kernel/../../x.py", "C:/x.py", "C:x.py",
               "\\\\server\\share\\x.py", "..\\x.py", "tiny_kernel-0.1.0.dist-info/../../x")
    for name in (*leaving, "tiny_kernel/./x.py", "tiny_kernel//x.py", "./x.py", "tiny_kernel/" + "d/" * 200 + "x.py",
                 "x" * 300 + ".py", "tiny_kernel/\u202ex.py", "tiny_kernel/x\n.py", ".../x.py"):
        def setup(c: Path, name=name) -> None:
            w = c / "in" / (s.f / "wheel" / WHEEL_NAME).name
            shutil.copyfile(s.f / "wheel" / WHEEL_NAME, w)
            with zipfile.ZipFile(w, "a") as zf:
                zf.writestr(name, "BAD = 1\n")
        real = (s.f / "wheel" / WHEEL_NAME).name
        cases.append(Case("repair-members", f"repair member {name[:30]!r}", ["repair", f"@C@/in/{real}", "--out",
                          "@C@/cwd/fixed"], setup=setup, expect="refuse" if name in leaving else "any", timeout=120))
        cases.append(Case("repair-members", f"verify member {name[:30]!r}", ["verify", f"@C@/in/{real}", "--arch", "8.0",
                          "--python-exe", sys.executable], setup=setup, timeout=120))
    return cases


# ---- 13. messages -------------------------------------------------------------------------

NASTY = ["\x1b[31mred\x1b[0m", "a\rb", "a\x7fb", "\u202eevil", "line\u2028two", "\x00"[:0] + "\x07bell", "a\x9bb",
         "x" * 100_000, "日本語-café", "\udcff", "$(touch /tmp/campaign-x)", "`id`", "%PATH%", "'\"", "a\x0cb", "\u2066x"]


def message_cases(s: "Servers") -> list[Case]:
    cases = []
    for value in NASTY:
        for argv in (["plan", value, *CELL], ["plan", "sage", "--torch", value],
                     ["render", "sage", *CELL, "--env", f"X={value}", "-o", "@C@/cwd/D"],
                     ["verify", value, "--arch", "9.0"], ["publish", "@F@/wheelhouse", "--to", value],
                     ["plan", "tiny", "--git", value, "--recipe-dir", str(ROOT / "tests" / "fixtures" / "tiny_git_recipe")],
                     ["render", "sage", *CELL, "--shell", "cmd", "--env", f"X={value}", "-o", "@C@/cwd/b.cmd"]):
            cases.append(Case("messages", f"{argv[0]} {ascii(value)[:16]}", argv))
    for scenario in ("git-500-echo", "git-garbage", "git-401"):
        cases.append(Case("messages", f"ls-remote {scenario}", ["plan", *TINY_GIT, "--git",
                          s.index.url(scenario) + "tiny.git@v0.1.0"], expect="refuse"))
    cases.append(Case("messages", "ls-remote missing file://", ["plan", *TINY_GIT, "--git", "file:///nonexistent/x@v1"],
                      expect="refuse"))
    for argv in (["doctor"], ["doctor", "--json"], ["doctor", "--no-engine"], ["doctor", "--python-exe", "/nonexistent"]):
        cases.append(Case("messages", " ".join(argv), argv, after=lambda c, r: None))
    return cases


# ---- 14. long paths -----------------------------------------------------------------------


def long_path_cases(s: "Servers") -> list[Case]:
    cases = []
    deep = "/".join(["d" * 200] * 20)  # ~4 KiB
    for what, target in (("name 255", "n" * 255), ("name 256", "n" * 256), ("path 4 KiB", deep),
                         ("path 8 KiB", deep + "/" + deep), ("many levels", "/".join(["a"] * 2000))):
        for argv in (["render", "sage", *CELL, "-o", f"@C@/cwd/{target}/D"], ["bake", "sage", *CELL, "-f", f"@C@/cwd/{target}.hcl"],
                     ["collect", f"@C@/cwd/{target}"], ["index", f"@C@/cwd/{target}"], ["verify", f"@C@/cwd/{target}.whl", "--arch", "9.0"],
                     ["repair", f"@F@/wheel/{WHEEL_NAME}", "--out", f"@C@/cwd/{target}"], ["build", "sage", *CELL, "--out", f"@C@/cwd/{target}",
                                                                           "--work", "@C@/cwd/work"],
                     ["plan", "--source", f"@C@/cwd/{target}", *CELL]):
            cases.append(Case("long-paths", f"{argv[0]} {what}", argv))

    def deep_wheelhouse(c: Path) -> None:
        folder = c / "cwd" / "wh" / "/".join(["p" * 120] * 7)
        folder.mkdir(parents=True)
        shutil.copyfile(s.f / "wheel" / WHEEL_NAME, folder / (s.f / "wheel" / WHEEL_NAME).name)
        shutil.copyfile(s.f / "wheel" / WHEEL_NAME, folder / ("bad name " + "q" * 200 + ".whl"))
    for argv in (["index", "@C@/cwd/wh"], ["collect", "@C@/cwd/wh"], ["publish", "@C@/cwd/wh", "--to",
                                                                       "pypi:http://127.0.0.1:9/legacy/", "--dry-run"]):
        cases.append(Case("long-paths", f"{argv[0]} deep wheelhouse", argv, setup=deep_wheelhouse, allowed=("cwd/wh",)))
    for tmp in ("t" * 200, "/".join(["t" * 100] * 30)):
        for argv in (["verify", f"@F@/wheel/{WHEEL_NAME}", "--arch", "8.0", "--python-exe", sys.executable],
                     ["repair", f"@F@/wheel/{WHEEL_NAME}", "--out", "@C@/cwd/r"], ["index", "@C@/cwd/wh"]):
            def setup(c: Path, tmp=tmp) -> None:
                (c / "tmp" / tmp).mkdir(parents=True)
                copy_tree(s.f / "wheelhouse", c / "cwd" / "wh")
            cases.append(Case("long-paths", f"{argv[0]} TMPDIR {len(tmp)}", argv, setup=setup,
                              env={"TMPDIR": f"@C@/tmp/{tmp}"}, allowed=("cwd/wh",)))
    return cases


# ---- 15. concurrency ----------------------------------------------------------------------


def concurrency_cases(s: "Servers") -> list[Case]:
    cases = []

    def setup(c: Path) -> None:  # an export (wheel and build record), collected once: what every command reads
        copy_tree(s.f / "exported", c / "cwd" / "wh")
        proc = subprocess.run([sys.executable, "-m", "imagegen", "collect", str(c / "cwd" / "wh")], capture_output=True,
                              text=True, cwd=c / "cwd", env={**os.environ, "PYTHONPATH": str(ROOT), "HOME": str(c / "home"),
                                                            "TMPDIR": str(c / "tmp"), "IMAGEGEN_DEBUG": "1"})
        if proc.returncode != 0:
            raise RuntimeError(f"collect: {proc.returncode} {proc.stderr[-800:]}")

    def manifest_ok(c: Path, results: list) -> str | None:
        for m in (c / "cwd" / "wh").rglob("manifest.json"):
            try:
                doc = json.loads(m.read_text())
            except (OSError, ValueError) as exc:
                return f"{m} unreadable after concurrent writers: {exc}"
            if not isinstance(doc.get("cells"), dict) or not doc["cells"]:
                return f"{m} lost its entries"
        # (index keeps its lock file .imagegen-index.lock on purpose; a cell folder's lock goes with its writer)
        left = [p.name for p in (c / "cwd" / "wh").rglob("*")
                if p.name == ".manifest.json.lock" or p.name.endswith((".tmp", ".partial"))]
        return f"left behind: {left}" if left else None
    pairs = [(["collect", "@C@/cwd/wh"], ["collect", "@C@/cwd/wh"]), (["collect", "@C@/cwd/wh"], ["index", "@C@/cwd/wh"]),
             (["index", "@C@/cwd/wh"], ["index", "@C@/cwd/wh"]),
             (["collect", "@C@/cwd/wh"], ["publish", "@C@/cwd/wh", "--to", "pypi:http://127.0.0.1:9/legacy/", "--dry-run"]),
             (["collect", "@C@/cwd/wh"], ["repair", f"@F@/wheel/{WHEEL_NAME}", "--out", "@C@/cwd/wh"])]
    for i in range(4):
        for a, b in pairs:
            cases.append(Case("concurrency", f"{a[0]} + {b[0]} #{i}", [a, b], setup=setup, after=manifest_ok,
                              allowed=("cwd/wh", "cwd/wh2"), timeout=120))
    return cases


# ---- 16. refusals before any build --------------------------------------------------------


def refusal_cases(s: "Servers") -> list[Case]:
    cases = []
    tree = str(ROOT / "tests" / "fixtures" / "tiny_kernel")
    for archs in ("9.0", "8.6", "8.0;9.0", "12.0+PTX", "8.0", "8.0;9.0+PTX"):
        for command in ("build", "pull"):
            argv = [command, "--source", tree, *TINY_CELL[:6], "--flavor", "pypi", "--arch", archs,
                    *matrix_tail(command)]
            argv[argv.index("--out") + 1] = "@C@/cwd/wh"
            cases.append(Case("refusals", f"{command} over a wheel of other archs {archs}", argv,
                              setup=lambda c: copy_tree(s.f / "wheelhouse", c / "cwd" / "wh"), allowed=("cwd/wh",),
                              expect="refuse" if archs != "8.0;9.0+PTX" else "any"))
            cases.append(Case("refusals", f"{command} --force over other archs {archs}", [*argv, "--force"],
                              setup=lambda c: copy_tree(s.f / "wheelhouse", c / "cwd" / "wh"), allowed=("cwd/wh",)))
    for platform in ("linux/arm64", "linux/arm64,linux/amd64", "linux/s390x", "windows/amd64", "linux/arm64/v8"):
        cases.append(Case("refusals", f"build --platform {platform}", ["build", "sage", *CELL, "--platform", platform,
                          *matrix_tail("build")]))
    for argv in (["build", "sage", *CELL, "--native", "--netrc", "/etc/passwd"],
                 ["build", "sage", *CELL, "--native", "--gpu-check-device", "nvidia.com/gpu=all"],
                 ["build", "sage", *CELL, "--native", "--platform", "linux/arm64"],
                 ["build", "sage", "--native", "--python-exe", "/nonexistent/python"],
                 ["build", "sage", "--native", "--python-exe", "/dev/zero"],
                 ["build", "sage", *CELL, "--flat"], ["build", "sage", *CELL, "--src-dir", "/etc"],
                 ["build", "sage", *CELL, "--print-env"]):
        cases.append(Case("refusals", " ".join(a for a in argv[2:] if a.startswith("--"))[:40], argv, expect="refuse"))
    return cases


GENERATORS = {"credentials": credential_cases, "planted-trees": planted_cases, "writes-outside": writes_outside_cases,
              "cdi-spec": cdi_cases, "servers": server_cases, "manifests": manifest_cases, "wheels": wheel_cases,
              "exit70": exit70_cases, "layouts": layout_cases, "ignored-input": ignored_cases,
              "ci-destinations": ci_cases, "repair-members": repair_cases, "messages": message_cases,
              "long-paths": long_path_cases, "concurrency": concurrency_cases, "refusals": refusal_cases}


# ----------------------------------------------------------------------------------------------
# servers (threads of this process, 127.0.0.1 only)


class HostileHTTP:
    """One HTTP server; the first part of a request's path names its scenario (see ``answer``)."""

    def __init__(self, fixtures: Path) -> None:
        import http.server

        self.stop = threading.Event()
        self.fixtures = fixtures
        owner = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def do_GET(self) -> None:
                owner.answer(self)

            do_POST = do_HEAD = do_PUT = do_GET

        class Server(http.server.ThreadingHTTPServer):
            daemon_threads = True

            def handle_error(self, request, client_address) -> None:
                pass

        self.server = Server(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        self._pages: dict[str, bytes] = {}

    def url(self, scenario: str) -> str:
        """The scenario's root: its PEP 691 index is ``simple/`` below it, a legacy upload ``legacy/``."""
        return f"{self.base}/{scenario}/"

    def simple(self, scenario: str) -> str:
        return self.url(scenario) + "simple/"

    def close(self) -> None:
        self.stop.set()
        self.server.shutdown()

    # -- answers

    def send(self, h, body: bytes, status: int = 200, ctype: str = "application/vnd.pypi.simple.v1+json",
             headers: dict | None = None) -> None:
        h.send_response(status)
        h.send_header("Content-Type", ctype)
        for k, v in (headers or {}).items():
            h.send_header(k, v)
        h.send_header("Content-Length", str(len(body)))
        h.end_headers()
        if h.command != "HEAD":
            h.wfile.write(body)

    def drip(self, h, head: bytes, body: bytes = b"") -> None:
        """``head`` at once and ``body`` one byte every 2 s; without a body, the head that way."""
        h.close_connection = True
        try:
            if body:
                h.wfile.write(head)
                h.wfile.flush()
            for i in range(len(body or head)):
                if self.stop.wait(2.0):
                    return
                h.wfile.write((body or head)[i:i + 1])
                h.wfile.flush()
        except OSError:
            return

    def answer(self, h) -> None:
        parts = h.path.split("?")[0].split("/")
        scenario, rest = parts[1], "/".join(parts[2:])
        length = int(h.headers.get("Content-Length") or 0)
        if length and h.command in ("POST", "PUT"):
            try:
                h.rfile.read(min(length, 64 * MIB))
            except OSError:
                return
        echo = f"you sent: {h.command} {h.path} {dict(h.headers)}".encode()
        if scenario.startswith("git-"):
            return self.git(h, scenario, rest, echo)
        page = self.pages(scenario)
        if scenario in ("401",):
            return self.send(h, b"who are you? " + echo, 401, "text/plain", {"WWW-Authenticate": 'Basic realm="x"'})
        if scenario in ("404",):
            return self.send(h, b"no such thing", 404, "text/plain")
        if scenario in ("500-echo", "403-echo"):
            return self.send(h, b"boom\n" * 3 + echo, int(scenario[:3]), "text/plain")
        if scenario == "echo-page":
            return self.send(h, echo, 200, "text/html")
        if scenario == "never-answer":
            self.stop.wait(600)
            return
        if scenario == "close-early":
            h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 1000\r\n\r\n{\"files\"")
            h.close_connection = True
            return
        if scenario == "chunked-endless":
            h.send_response(200)
            h.send_header("Content-Type", "text/html")
            h.send_header("Transfer-Encoding", "chunked")
            h.end_headers()
            try:
                while not self.stop.is_set():
                    h.wfile.write(b"4000\r\n" + b"<a>" * 5461 + b"x\r\n")
            except OSError:
                return
            return
        if scenario == "redirect-loop" or (scenario == "redirect-page-loop") or (scenario == "redirect-upload" and h.command == "POST"):
            return self.send(h, b"", 302, "text/plain", {"Location": h.path})
        if scenario == "redirect-file":
            return self.send(h, b"", 302, "text/plain", {"Location": "file:///etc/passwd"})
        if scenario in ("drip-headers",):
            return self.drip(h, b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n")
        if scenario in ("drip-body", "drip-page") and (rest.startswith("simple/") or scenario == "drip-page") \
                and h.command == "GET":
            return self.drip(h, b"HTTP/1.1 200 OK\r\nContent-Type: text/html\r\nContent-Length: 100\r\n\r\n",
                             b"{" + b" " * 99)
        if scenario == "drip-upload" and h.command == "POST":
            return self.drip(h, b"HTTP/1.1 200 OK\r\nContent-Type: text/plain\r\nContent-Length: 100\r\n\r\n", b"o" * 100)
        if scenario == "huge-page":
            h.send_response(200)
            h.send_header("Content-Type", "text/html")
            h.send_header("Content-Length", str(200 * MIB))
            h.end_headers()
            try:
                for _ in range(200):
                    h.wfile.write(b" " * MIB)
            except OSError:
                pass
            return
        if scenario == "gzip-bomb":
            import gzip
            body = gzip.compress(b" " * (300 * MIB), 9)
            return self.send(h, body, 200, "text/html", {"Content-Encoding": "gzip"})
        if scenario == "wrong-length":
            h.wfile.write(b"HTTP/1.1 200 OK\r\nContent-Length: 99999999\r\n\r\n{}")
            h.close_connection = True
            return
        if scenario in ("html-odd", "page-no-hash", "page-deep-html") and rest.startswith("simple/"):
            body = {"html-odd": b"<html><a href='file:///etc/passwd'>tiny_kernel-0.1.0.whl</a><a href=\x00>",
                    "page-no-hash": b"<a href='../../x/tiny_kernel-0.1.0+cu130torch2.11-cp311-cp311-linux_x86_64.whl'>w</a>",
                    "page-deep-html": b"<div>" * 200_000}[scenario]
            return self.send(h, body, 200, "text/html")
        if rest in page:
            route = page[rest]
            return route(h) if callable(route) else self.send(h, route)
        if h.command == "POST":  # an upload the scenario has no answer for: accepted
            return self.send(h, b"OK", 200, "text/plain")
        return self.send(h, b"not here", 404, "text/plain")

    def git(self, h, scenario: str, rest: str, echo: bytes) -> None:
        if scenario == "git-drip":
            return self.drip(h, b"HTTP/1.1 200 OK\r\nContent-Type: application/x-git-upload-pack-advertisement\r\n"
                                b"Content-Length: 500\r\n\r\n", b"0" * 500)
        if scenario == "git-redirect-loop":
            return self.send(h, b"", 302, "text/plain", {"Location": h.path})
        if scenario == "git-500-echo":
            return self.send(h, b"error: the server broke\nline two\n" + echo, 500, "text/plain")
        if scenario == "git-401":
            return self.send(h, b"no\n" + echo, 401, "text/plain", {"WWW-Authenticate": 'Basic realm="git"'})
        if scenario == "git-never-answer":
            self.stop.wait(600)
            return
        if scenario == "git-huge-refs":
            h.send_response(200)
            h.send_header("Content-Type", "application/x-git-upload-pack-advertisement")
            h.end_headers()
            h.close_connection = True
            try:
                h.wfile.write(b"001e# service=git-upload-pack\n0000")
                line = b"%04x" % (4 + 41 + 40) + b"1" * 40 + b" refs/tags/v" + b"9" * 28 + b"\n"
                for _ in range(2_000_000):
                    h.wfile.write(line[:4 + 41 + 40])
            except OSError:
                pass
            return
        if scenario == "git-reflect":  # a server that asks for credentials and then reflects them
            if h.headers.get("Authorization"):
                return self.send(h, b"denied for " + echo, 403, "text/plain")
            return self.send(h, b"login", 401, "text/plain", {"WWW-Authenticate": 'Basic realm="git"'})
        return self.send(h, bytes(range(256)) * 100, 200, "application/x-git-upload-pack-advertisement")

    def pages(self, scenario: str) -> dict[str, object]:
        """PEP 691 pages of torch and cuda-toolkit as imagegen's tables know them, hostile per scenario."""
        if scenario in self._pages:
            return self._pages[scenario]
        from tests.unit import test_hostile_reads as thr
        fake = thr.Server.__new__(thr.Server)  # its routes and base, without a server of its own
        fake.routes = {}
        fake.base = self.base + "/" + scenario
        relative = scenario == "relative"
        change = {
            "files-5": None, "no-url": lambda e: {k: v for k, v in e.items() if k != "url"},
            "url-5": lambda e: {**e, "url": 5}, "size-abc": lambda e: {**e, "size": "abc", "core-metadata": False},
            "size-neg": lambda e: {**e, "size": -3, "core-metadata": False},
            "no-size": lambda e: {k: v for k, v in e.items() if k not in ("size", "core-metadata")},
            "ftp-url": lambda e: {**e, "url": "ftp://127.0.0.1/x.whl"},
            "file-url": lambda e: {**e, "url": "file:///etc/passwd", "core-metadata": False},
            "data-url": lambda e: {**e, "url": "data:,x", "core-metadata": False},
            "fifo-url": lambda e: {**e, "url": f"file://{self.fixtures}/fifo", "core-metadata": False},
            "redirect-page-loop": None,
            "filename-dotdot": lambda e: {**e, "filename": "../../../../etc/torch-9.9.9-cp312-cp312-linux_x86_64.whl"},
            "filename-abs": lambda e: {**e, "filename": "/etc/torch-9.9.9-cp312-cp312-linux_x86_64.whl"},
            "metadata-bomb": lambda e: {**e, "url": f"{fake.base}/files/bomb.whl", "size": 1 << 20, "core-metadata": False},
            "range-ignored": lambda e: {**e, "url": f"{fake.base}/files/whole.whl", "size": 4096, "core-metadata": False},
            "range-lies": lambda e: {**e, "url": f"{fake.base}/files/lies.whl", "size": 1 << 30, "core-metadata": False},
        }.get(scenario)
        thr.pypi(fake, change, relative=relative)
        pages: dict[str, object] = {k.lstrip("/"): v for k, v in fake.routes.items()}
        torch_page = "simple/torch/"
        if scenario == "files-5":
            pages[torch_page] = b'{"meta": {"api-version": "1.1"}, "name": "torch", "files": 5}'
        elif scenario == "files-mixed":
            pages[torch_page] = b'{"meta": {"api-version": "1.1"}, "name": "torch", "files": [5, "x", null, []]}'
        elif scenario == "deep":
            pages[torch_page] = b"[" * 200_000 + b"]" * 200_000
        elif scenario == "deep-files":
            pages[torch_page] = b'{"files": ' + b"[" * 200_000 + b"]" * 200_000 + b"}"
        elif scenario == "html-page":
            pages[torch_page] = b"<html><a href='torch-9.9.9-cp312-cp312-linux_x86_64.whl'>x</a></html>"
        elif scenario == "not-json":
            pages[torch_page] = b"{nope"
        elif scenario == "non-utf8":
            pages[torch_page] = b'{"files": [{"filename": "\xff\xfe.whl", "url": "x"}]}'
        elif scenario == "api-99":
            pages[torch_page] = b'{"meta": {"api-version": "99.0"}, "name": "torch", "files": []}'
        elif scenario == "empty":
            pages[torch_page] = b""
        elif scenario == "redirect-page-loop":
            pages[torch_page] = lambda h: self.send(h, b"", 301, "text/plain", {"Location": h.path})
        elif scenario == "metadata-bomb":
            latest = max(thr.compat.torch_table().values(), key=lambda s: s.key)
            bomb = thr._zip([("torch/__init__.py", *thr._deflated(b"")),
                             (f"torch-{latest.latest}.dist-info/METADATA", *thr.zeros_member(1536))])
            pages["files/bomb.whl"] = thr.ranged(bomb)
        elif scenario == "range-ignored":
            pages["files/whole.whl"] = bytes(4096)  # a 200 with the whole body for every range asked
        elif scenario == "range-lies":
            pages["files/lies.whl"] = lambda h: self.send(h, b"PK" * 10, 206, "application/octet-stream",
                                                          {"Content-Range": "bytes 0-19/1073741824"})
        elif scenario == "drip-metadata":
            for path in [p for p in pages if p.endswith(".metadata")]:
                pages[path] = lambda h: self.drip(h, b"HTTP/1.1 200 OK\r\nContent-Length: 100\r\n\r\n", b"M" * 100)
        self._pages[scenario] = pages
        return pages


class Servers:
    def __init__(self, fixtures: Path) -> None:
        from tests.git_server import GitServer
        from tests.publish_servers import FakeGitHub, FakeHub, FakeIndex
        self.f = fixtures
        self.index = HostileHTTP(fixtures)
        self.git_private = GitServer(fixtures / "srv", auth=(LOGIN, TOKEN)).__enter__()
        self.git_private.base = self.git_private.url("").rstrip("/")
        self.fake_index = FakeIndex(LOGIN, TOKEN).__enter__()
        self.fake_hub = FakeHub(TOKEN).__enter__()
        self.fake_github = FakeGitHub(TOKEN, ("org/repo",)).__enter__()

    def close(self) -> None:
        self.index.close()
        for s in (self.git_private, self.fake_index, self.fake_hub, self.fake_github):
            if s is not None:
                s.__exit__(None, None, None)


# ----------------------------------------------------------------------------------------------
# fixtures, sandbox, running


def make_fixtures(f: Path) -> None:
    """What the cases copy or read (read-only once made)."""
    sys.path.insert(0, str(ROOT))
    from tests.git_server import git, tiny_kernel_repo
    from tests.publish_servers import wheelhouse
    from tests.unit import test_check
    from tests.unit.executor_fixtures import WHEEL
    from tests.unit.test_collecting import exported

    f.mkdir(parents=True)
    (f / "wheel").mkdir()
    shutil.copyfile(WHEEL, f / "wheel" / WHEEL.name)
    wheelhouse(f / "wheelhouse")
    exported(f / "exp")
    (f / "exp" / "export").rename(f / "exported")
    shutil.rmtree(f / "exp")
    repo, _ = tiny_kernel_repo(f / "repos")
    shutil.move(str(repo), f / "tinyrepo")
    (f / "srv").mkdir()
    git(f / "srv", "clone", "-q", "--bare", str(f / "tinyrepo"), "tiny.git")
    (f / "check").mkdir()
    test_check.demo_wheel(f / "check")
    test_check.recipe_dir(f / "check", test_check.PASSING)
    test_check.fake_torch(f / "check", cuda=True)
    with (f / "check" / "recipes" / "tiny-kernel.yaml").open("w") as fh:
        fh.write(test_check.RECIPE.format(name="tiny-kernel", dist="tiny_kernel", imports="tiny_kernel")
                 + "  gpu_check: |\n    import torch, tiny_kernel\n    assert torch.cuda.is_available()\n")
    os.mkfifo(f / "fifo")
    env = dict(os.environ, PYTHONPATH=str(ROOT), HOME=str(f / "home"), DOCKER_HOST="unix:///nonexistent")
    (f / "ci").mkdir()
    subprocess.run([sys.executable, "-m", "imagegen", "bake", "sage", *CELL, "-f", "docker-bake.hcl"],
                   check=True, capture_output=True, env=env, cwd=f / "ci")


def fake_docker(folder: Path) -> None:
    """`docker` first on PATH: `buildx bake --print` goes to buildx (no engine), the rest is refused."""
    write(folder / "docker", f"""#!/bin/sh
[ -n "$CAMPAIGN_DOCKER_LOG" ] && echo "$*" >> "$CAMPAIGN_DOCKER_LOG"
if [ "$1 $2" = "buildx bake" ]; then
  for a in "$@"; do [ "$a" = "--print" ] && exec {REAL_DOCKER} "$@"; done
fi
echo "Cannot connect to the Docker daemon (the hostile campaign runs without an engine)" >&2
exit 1
""")
    (folder / "docker").chmod(0o755)


def enter_sandbox(work: Path) -> None:
    """In a mount namespace of this process's own (made by unshare): / read-only, ``work`` writable, /dev a
    tmpfs with the usual nodes and NVIDIA's (char devices that are never opened: cdi-spec only looks)."""
    def mount(*args: str) -> None:
        subprocess.run(["mount", *args], check=True)
    real_dev = work / ".realdev"
    real_dev.mkdir(exist_ok=True)
    mount("--make-rprivate", "/")
    mount("--bind", str(work), str(work))
    mount("--rbind", "/dev", str(real_dev))
    mount("-t", "tmpfs", "-o", "mode=755", "campaign-dev", "/dev")
    for name, major, minor in (("null", 1, 3), ("zero", 1, 5), ("full", 1, 7), ("random", 1, 8), ("urandom", 1, 9),
                               ("tty", 5, 0), ("nvidiactl", 195, 255), ("nvidia0", 195, 0), ("nvidia-uvm", 511, 0)):
        os.mknod(f"/dev/{name}", 0o666 | stat.S_IFCHR, os.makedev(major, minor))
    for name in ("shm", "pts"):
        os.mkdir(f"/dev/{name}")
        mount("--bind", str(real_dev / name), f"/dev/{name}")
    for name, to in (("fd", "/proc/self/fd"), ("stdin", "/proc/self/fd/0"), ("stdout", "/proc/self/fd/1"),
                     ("stderr", "/proc/self/fd/2"), ("ptmx", "pts/ptmx")):
        os.symlink(to, f"/dev/{name}")


def lock_down(fixtures: Path) -> None:
    """/ read-only (the work folder stays writable: a mount of its own), the fixtures read-only too."""
    subprocess.run(["mount", "-o", "remount,bind,ro", "/"], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", "/sys"], capture_output=True)
    readonly(fixtures)


def readonly(path: Path) -> None:
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)


def snapshot(folder: Path) -> dict[str, tuple]:
    found = {}
    for dirpath, dirnames, filenames in os.walk(folder):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            try:
                st = os.lstat(p)
            except OSError:
                continue
            found[os.path.relpath(p, folder)] = (stat.S_IFMT(st.st_mode), st.st_size, st.st_mtime_ns)
    return found


def limits() -> None:
    os.setsid()
    resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))
    resource.setrlimit(resource.RLIMIT_FSIZE, (256 << 20, 256 << 20))


def run_one(case: Case, index: int, ctx: dict, base_env: dict, keep: bool) -> dict:
    c = ctx["cases"] / f"{index:04d}"
    for sub_folder in ("cwd", "home", "tmp", "in"):
        (c / sub_folder).mkdir(parents=True)
    local = {**ctx["fmt"], "C": str(c)}
    error = None
    try:
        if case.setup:
            case.setup(c)
        if (c / "in" / "name").is_file():
            local["W"] = str(c / "in" / "w" / (c / "in" / "name").read_text())
    except Exception as exc:  # a fixture the case could not make: said, not run
        error = f"setup failed: {exc.__class__.__name__}: {exc}"
    argvs = case.argv if case.argv and isinstance(case.argv[0], list) else [case.argv]
    argvs = [[sub(a, local) for a in argv] for argv in argvs]
    before = snapshot(c)
    env = {**base_env, "HOME": str(c / "home"), "TMPDIR": str(c / "tmp"), "XDG_CACHE_HOME": str(c / "home" / ".cache"),
           "XDG_CONFIG_HOME": str(c / "home" / ".config"), "IMAGEGEN_COMPAT_DIR": str(c / "home" / "compat"),
           "CAMPAIGN_DOCKER_LOG": str(c / "docker.log")}
    env.update({k: sub(v, local) for k, v in case.env.items()})
    if "PYTHONPATH" in case.env:
        env["PYTHONPATH"] = f"{ROOT}:{env['PYTHONPATH']}"
    cwd = env.pop("CAMPAIGN_CWD", str(c / "cwd"))
    t0 = time.monotonic()
    outcomes = []
    if error is None:
        procs = [subprocess.Popen([sys.executable, "-m", "imagegen", *argv], cwd=cwd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.PIPE, stdin=subprocess.DEVNULL, preexec_fn=limits)
                 for argv in argvs]
        for proc in procs:
            timed_out = False
            try:
                out, err = proc.communicate(timeout=max(1.0, case.timeout - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                timed_out = True
                try:
                    os.killpg(proc.pid, signal.SIGKILL)
                except OSError:
                    pass
                out, err = proc.communicate()
            outcomes.append((proc.returncode, out, err, timed_out))
    seconds = time.monotonic() - t0
    flags: list[str] = []
    kinds = []
    forms = secret_forms()
    planted = {os.path.normpath(p) for p in case.planted}
    for rc, out, err, timed_out in outcomes:
        text_out, text_err = out.decode("utf-8", "replace"), err.decode("utf-8", "replace")
        kind = classify(rc, text_out, text_err, timed_out)
        kinds.append(kind)
        if leaks(out + err, forms):
            flags.append("leak:output")
        if "read-only file system" in (text_out + text_err).lower() and not case.erofs_ok:
            flags.append("outside:erofs")
        if kind in ("refused", "messy") and unsafe_text("\n".join(line for line in text_err.splitlines()
                                                                  if line.startswith("imagegen: "))):
            flags.append("unsafe")
    after = snapshot(c)
    allowed = ("cwd", "home", "tmp", "marks", "docker.log", *case.allowed)
    inside = lambda rel: any(rel == a or rel.startswith(a.rstrip("/") + "/") for a in allowed)  # noqa: E731
    changed = sorted({rel for rel in set(before) | set(after) if before.get(rel) != after.get(rel)
                      and not inside(rel)})
    if changed:
        flags.append("outside:" + ",".join(changed)[:200])
    for rel, meta in after.items():
        if meta[0] == stat.S_IFREG and os.path.normpath(rel) not in planted and meta[1] < 64 * MIB:
            try:
                data = (c / rel).read_bytes()
            except OSError:
                continue
            if leaks(data, forms):
                flags.append(f"leak:{rel}")
    if (c / "docker.log").is_file() and any(line.split()[:2] != ["buildx", "bake"] or "--print" not in line
                                            for line in (c / "docker.log").read_text().splitlines()):
        flags.append("engine")
    if case.after is not None and error is None:
        more = case.after(c, outcomes)
        if more:
            flags.append(("planted:" if case.cls == "planted-trees" else "after:") + more)
    kind = "setup" if error else next((k for k in ("hang", "crash", "traceback", "exit70", "messy") if k in kinds),
                                      "refused" if "refused" in kinds else "ok")
    unexpected = (case.expect == "refuse" and "ok" in kinds) or (case.expect == "ok" and kind != "ok")
    if unexpected:
        flags.append(f"unexpected:{case.expect}")
    result = {"index": index, "cls": case.cls, "what": case.what, "argv": [ascii(a)[:300] for a in argvs[0]],
              "kind": kind, "rc": [o[0] for o in outcomes], "flags": flags, "seconds": round(seconds, 2),
              "stderr": (error or "\n".join(o[2].decode("utf-8", "replace")[-600:] for o in outcomes))[-1200:]}
    defect = kind not in ("ok", "refused") or any(not f.startswith("engine") for f in flags)
    if not keep and not defect:
        shutil.rmtree(c, ignore_errors=True)
        if c.exists():
            subprocess.run(["rm", "-rf", str(c)], capture_output=True)
    return result


SUMMARY_COLUMNS = ["cases", "ok", "refused", "messy", "exit70", "traceback", "crash", "hang", "leak", "outside",
                   "code-run", "unsafe", "unexpected", "engine", "seconds"]


def summarize(results: list[dict]) -> dict[str, dict[str, float]]:
    table: dict[str, dict[str, float]] = {}
    for r in results:
        row = table.setdefault(r["cls"], dict.fromkeys(SUMMARY_COLUMNS, 0))
        row["cases"] += 1
        row["seconds"] += r["seconds"]
        if r["kind"] in row:
            row[r["kind"]] += 1
        for name, prefix in (("leak", "leak:"), ("outside", "outside:"), ("code-run", "planted:"), ("unsafe", "unsafe"),
                             ("unexpected", "unexpected:"), ("engine", "engine")):
            if any(f.startswith(prefix) for f in r["flags"]):
                row[name] += 1
        for f in r["flags"]:
            if f.startswith("after:"):
                row["messy"] += 0  # counted as a defect in the listing
    total = dict.fromkeys(SUMMARY_COLUMNS, 0)
    for row in table.values():
        for k in SUMMARY_COLUMNS:
            total[k] += row[k]
    table["total"] = total
    return table


def render_table(table: dict[str, dict[str, float]]) -> str:
    lines = ["| class | " + " | ".join(SUMMARY_COLUMNS) + " |", "|---|" + "---:|" * len(SUMMARY_COLUMNS)]
    for cls in [*CLASSES, "total"]:
        if cls in table:
            row = table[cls]
            lines.append(f"| {cls} | " + " | ".join(f"{row[k]:.0f}" for k in SUMMARY_COLUMNS) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, default=Path("/tmp/imagegen-campaign"))
    parser.add_argument("--jobs", "-j", type=int, default=2)
    parser.add_argument("--only", nargs="*", choices=list(CLASSES), help="these classes only")
    parser.add_argument("--match", help="only cases whose description holds this text")
    parser.add_argument("--list", action="store_true", help="list the cases per class and exit")
    parser.add_argument("--keep", action="store_true", help="keep every case's folder (else only a defect's)")
    parser.add_argument("--no-sandbox", action="store_true", help="run without the read-only mount namespace")
    parser.add_argument("--seed", type=int, default=32)
    args = parser.parse_args(argv)
    work = args.work.resolve()
    if not args.list and not args.no_sandbox and os.environ.get("CAMPAIGN_IN_SANDBOX") != "1":
        if os.geteuid() != 0:
            parser.error("the sandbox needs root (unshare -m): run as root, or pass --no-sandbox")
        if work.exists():
            subprocess.run(["rm", "-rf", str(work)], check=True)
        work.mkdir(parents=True)
        outside = Path(str(work) + "-outside")
        if outside.exists():
            subprocess.run(["rm", "-rf", str(outside)], check=True)
        os.execvpe("unshare", ["unshare", "-m", "--propagation", "private", sys.executable, __file__,
                               *(argv if argv is not None else sys.argv[1:])],
                   {**os.environ, "CAMPAIGN_IN_SANDBOX": "1"})
    sys.path.insert(0, str(ROOT))
    if os.environ.get("CAMPAIGN_IN_SANDBOX") == "1":
        enter_sandbox(work)
    elif not args.list:
        if work.exists():
            shutil.rmtree(work)
        work.mkdir(parents=True)
        shutil.rmtree(Path(str(work) + "-outside"), ignore_errors=True)
    fixtures = work / "fixtures"
    t0 = time.monotonic()
    if not args.list:
        make_fixtures(fixtures)
        fake_docker(work / "bin")
        make_canary(Path(str(work) + "-outside") / "canary", fixtures)
    servers = Servers(fixtures if not args.list else ROOT / "tests" / "fixtures")
    try:
        cases = []
        for cls in args.only or CLASSES:
            cases += [c for c in GENERATORS[cls](servers) if not args.match or args.match in c.what]
        if args.list:
            for cls in CLASSES:
                n = sum(1 for c in cases if c.cls == cls)
                if n:
                    print(f"{cls:16} {n:5}  {CLASSES[cls]}")
            print(f"{'total':16} {len(cases):5} cases, "
                  f"{sum(len(c.argv) if isinstance(c.argv[0], list) else 1 for c in cases)} invocations")
            return 0
        controls = plant_controls(work / "controls") if "planted-trees" in (args.only or CLASSES) else {}
        if controls:
            print(f"plain git runs the planted commands of {sum(controls.values())} of {len(controls)} kinds"
                  f" (not: {', '.join(k for k, v in controls.items() if not v) or 'none'})", flush=True)
        if os.environ.get("CAMPAIGN_IN_SANDBOX") == "1":
            lock_down(fixtures)
        random.Random(args.seed).shuffle(cases)  # the slow ones spread over the run
        base_env = {k: v for k, v in os.environ.items() if not k.startswith(("TWINE_", "HF_", "GITHUB_", "AWS_", "NETRC",
                                                                             "IMAGEGEN_", "DOCKER_", "XDG_", "CAMPAIGN_"))}
        base_env.update(PATH=f"{work / 'bin'}:{os.environ.get('PATH', '/usr/bin:/bin')}", PYTHONPATH=str(ROOT),
                        PYTHONDONTWRITEBYTECODE="1", DOCKER_HOST="unix:///nonexistent/docker.sock", LC_ALL="C.UTF-8",
                        http_proxy="http://127.0.0.1:9", https_proxy="http://127.0.0.1:9", HTTP_PROXY="http://127.0.0.1:9",
                        HTTPS_PROXY="http://127.0.0.1:9", no_proxy="127.0.0.1,localhost", NO_PROXY="127.0.0.1,localhost",
                        GIT_TERMINAL_PROMPT="0")
        demo = next((fixtures / "check" / "dist").glob("*.whl"))
        ctx = {"cases": work / "cases", "fmt": {"F": str(fixtures), "O": str(work) + "-outside", "T": TOKEN,
                                                "DEMO": str(demo)}}
        results: list[dict] = []
        lock = threading.Lock()
        print(f"hostile campaign: {len(cases)} cases ({sum(len(c.argv) if isinstance(c.argv[0], list) else 1 for c in cases)}"
              f" invocations), {args.jobs} at a time, fixtures in {time.monotonic() - t0:.0f} s", flush=True)
        with (work / "results.jsonl").open("w") as log, \
                concurrent.futures.ThreadPoolExecutor(max_workers=args.jobs) as pool:
            futures = [pool.submit(run_one, case, i, ctx, base_env, args.keep) for i, case in enumerate(cases)]
            for done, future in enumerate(concurrent.futures.as_completed(futures), 1):
                r = future.result()
                with lock:
                    results.append(r)
                    log.write(json.dumps(r) + "\n")
                    log.flush()
                bad = r["kind"] not in ("ok", "refused") or any(not f.startswith("engine") for f in r["flags"])
                if bad:
                    print(f"  DEFECT [{r['cls']}] {r['what']}: {r['kind']} {r['flags']} :: "
                          f"{r['stderr'].strip().splitlines()[-1:] if r['stderr'].strip() else ''}", flush=True)
                if done % 100 == 0:
                    print(f"  {done}/{len(cases)} in {time.monotonic() - t0:.0f} s", flush=True)
        table = summarize(results)
        wall = time.monotonic() - t0
        (work / "summary.json").write_text(json.dumps({"wall_seconds": wall, "token": "(not kept)", "table": table,
                                                       "invocations": sum(len(r["rc"]) for r in results),
                                                       "plant_controls": controls}, indent=1))
        print(render_table(table))
        print(f"wall time {wall:.0f} s; results in {work / 'results.jsonl'}")
        defects = [r for r in results if r["kind"] not in ("ok", "refused")
                   or any(not f.startswith("engine") for f in r["flags"])]
        return 1 if defects else 0
    finally:
        servers.close()


if __name__ == "__main__":
    sys.exit(main())
