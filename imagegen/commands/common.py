"""Shared by the commands: the config and catalogue a command reads, its flags made into Options (the one
place argparse's namespace becomes plain values), the native cell, and the checks of the values it hands
on (registry, builders, cache specs, CA bundle, executables)."""

from __future__ import annotations

import argparse
import dataclasses
import errno
import os
import re
import shlex
import shutil
import stat
import sys
from pathlib import Path
from typing import Sequence

from imagegen import safety
from imagegen.errors import ImagegenError, UsageError
from imagegen.model.catalogue import Catalogue, load_catalogue
from imagegen.outputs import shown
from imagegen.plan import options, request
from imagegen.plan.config import Config, load_config
from imagegen.shipped.builder import imagegen_rules as rules


def flags(args: argparse.Namespace) -> options.Flags:
    """What the command line gave, as plain values: each of Flags' fields that this command's parser has."""
    return options.Flags(**{f.name: getattr(args, f.name) for f in dataclasses.fields(options.Flags)
                            if getattr(args, f.name, None) is not None})


def resolved(args: argparse.Namespace, config: Config) -> options.Options:
    """The command's options: its flags, then the config file, then the defaults (imagegen.plan.options)."""
    return options.resolve(flags(args), config)


def config(args: argparse.Namespace) -> Config:
    return load_config(args.config, search_from=Path.cwd()) if args.config else load_config(search_from=Path.cwd())


def catalogue(args: argparse.Namespace, config: Config) -> Catalogue:
    return load_catalogue(tuple(config.recipe_dirs) + tuple(args.recipe_dir))


def optional_catalogue(args: argparse.Namespace, config: Config) -> Catalogue | None:
    """The recipes, for a command that also runs without them (collect, verify, reuse): None where they do not
    load, except that a broken --recipe-dir is the user's error, said as such."""
    try:
        return catalogue(args, config)
    except ImagegenError:
        if args.recipe_dir:
            raise
        return None


def lock(args: argparse.Namespace):
    from imagegen.plan.registry import LOCK_FILE, Lock

    path = getattr(args, "lock", None)
    if path is not None and not str(path).strip():
        raise UsageError("--lock: give the lock file's path")
    if path is not None and not safety.is_file(path) and args.command not in ("lock", "push"):
        raise UsageError(f"--lock {shown(path)}: no such file (imagegen lock writes it)")
    return Lock.load(path or Path(LOCK_FILE))


def validate_wheel_file(wheel: Path) -> None:
    """A wheel argument (verify, repair) is an existing file, or a one-line UsageError."""
    try:
        found = wheel.is_file()
    except OSError as exc:  # a 5000-character name
        raise UsageError(f"{shown(wheel)}: {exc.strerror or 'not a usable path'}") from None
    if not found:
        raise UsageError(f"{shown(wheel)}: no such wheel file")


def registry(opts: options.Options) -> str:
    from imagegen.plan.registry import validate_registry

    value = opts.registry
    if not value:
        raise UsageError("no registry: pass --registry HOST[:PORT]/NAMESPACE, or set it once for the project:"
                         " registry = \"ghcr.io/myteam\" under [tool.imagegen] in pyproject.toml (or in imagegen.toml)")
    return validate_registry(value)


BUILDER = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.+-]{0,99}")


def validate_builders(values: Sequence[str] | str | None) -> None:
    for v in [values] if isinstance(values, str) else values or []:
        if not BUILDER.fullmatch(v):
            raise UsageError(f"--builder {v!r}: not a buildx builder name (letters, digits, '.', '_', '+', '-')")


def validate_job_flags(args: argparse.Namespace) -> None:
    """--max-jobs and --nvcc-threads, for every command that compiles (container, native, pulled, Windows)."""
    for flag in ("max_jobs", "nvcc_threads"):
        value = getattr(args, flag, None)
        if value is not None and not 1 <= value <= 1024:
            raise UsageError(f"--{flag.replace('_', '-')} must be between 1 and 1024")


def ca_bundle(value: str | None) -> str | None:
    if value is not None and not safety.is_file(Path(value)):
        raise UsageError(f"--ca-bundle {shown(value)}: no such file (a PEM bundle, e.g. /etc/ssl/certs/ca-certificates.crt)")
    return value


def compile_cache(value: str | None) -> str | None:
    """``--compile-cache URL`` (or $IMAGEGEN_COMPILE_CACHE): a ccache remote storage URL, redis:// or
    http://, checked and returned as ccache takes it (its password percent-encoded, said in one line);
    its user, password, query and fragment are never shown."""
    if value is None or not value.strip():
        return None
    try:
        url, _, note = rules.compile_cache_url(value)
    except ValueError as exc:
        raise UsageError(f"--compile-cache {rules.compile_cache_redacted(value)}: {exc}; give redis://HOST:PORT[/DB]"
                         " (a password before HOST, ending in '@') or http://HOST:PORT/PATH (ccache's remote storage)"
                         ) from None
    if note:
        print(f"imagegen: --compile-cache: {note}", file=sys.stderr)
    return url


def validate_cache_specs(values: Sequence[str]) -> list[str]:
    for v in values:
        if safety.has_credentials(v):
            # the spec goes into the bake file imagegen writes: a registry's credential belongs to docker login
            raise UsageError(f"cache spec {safety.describe(safety.redact(v), 80)} carries a credential, which would be"
                             " written into the bake file: log in to the registry with docker login instead")
        if not CACHE_SPEC.fullmatch(v):
            raise UsageError(f"cache spec {v!r}: expected buildx's key=value,... form, e.g. type=registry,ref=HOST/NS/cache:TAG")
    return list(values)


CACHE_SPEC = re.compile(r"type=[a-z]+(,[a-z-]+=[A-Za-z0-9._:/@=-]+)*|[a-z0-9.-]+(:[0-9]+)?/[A-Za-z0-9._/:@-]+")


def command_line(argv: Sequence[str]) -> str:
    """The command line as one line (it becomes a comment in generated files): an argument with a
    newline or another control character is written in bash's $'...' form."""
    return "imagegen " + " ".join(quote_arg(a) for a in argv)


def quote_arg(arg: str) -> str:
    if all(c.isprintable() for c in arg):
        return shlex.quote(arg)
    return "$'" + "".join(c if c.isprintable() and c not in "\\'" else
                          ("\\" + c if c in "\\'" else c.encode("unicode_escape").decode("ascii")) for c in arg) + "'"


def validate_exe(value: str | None, flag: str) -> str | None:
    """A --python-exe here: an existing, executable regular file (or a name on PATH), else one line (exit 2)."""
    if value is None:
        return None
    if not value.strip() or len(value) > 4096 or not all(c.isprintable() for c in value):
        raise UsageError(f"{flag} {shown(value, 80)}: not a usable interpreter path")
    exe = value if (os.sep in value or (os.altsep and os.altsep in value)) else shutil.which(value)
    if exe is None:
        raise UsageError(f"{flag} {shown(value, 80)}: no such interpreter on PATH")
    try:
        st = os.stat(exe)
    except OSError as exc:
        why = {errno.ELOOP: "a symlink loop", errno.ENAMETOOLONG: "the name is too long",
               errno.ENOENT: "no such file"}.get(exc.errno or 0, exc.strerror)
        raise UsageError(f"{flag} {shown(value, 80)}: {why}") from None
    if not stat.S_ISREG(st.st_mode):
        raise UsageError(f"{flag} {shown(value, 80)}: not a file")
    if not os.access(exe, os.X_OK):
        raise UsageError(f"{flag} {shown(value, 80)}: not executable (permission denied)")
    # A relative path made absolute (the audit and build run it from their own folders), not resolved: a
    # venv's python is a link, and it must stay the venv's.
    return os.path.abspath(value) if exe == value else value


def native_cell(args: argparse.Namespace, cat: Catalogue, opts: options.Options):
    """The one cell a native build (or audit) makes on this host (plan.request.native_request), after the
    refusals of what goes with a container build only; and the host's toolchain."""
    from imagegen.executors import host as host_toolchain
    sources = getattr(args, "source", None) or []
    for flag in ("gpu_check_device", "dockerfile_frontend"):
        if getattr(args, flag, None) is not None:
            raise UsageError(f"--{flag.replace('_', '-')} goes with a container build, not --native (run the"
                             " recipe's gpu_check on a natively built wheel with `imagegen check WHEEL`)")
    if getattr(args, "platform", None):
        raise UsageError("--platform goes with a container build, not --native (a native build makes a wheel for"
                         " this host's platform)")
    if len(args.recipes) > 1 or len(sources) > 1 or not (args.recipes or sources):
        # NAME --source TREE is one: that recipe, built from that tree (request.recipe_from_tree)
        raise UsageError("--native builds one recipe (or one --source) at a time, for this host's torch")
    host = host_toolchain.probe(validate_exe(args.python_exe, "--python-exe"))
    cell = request.native_request(opts, cat, args.recipes[0] if args.recipes else None, sources[0] if sources else None,
                                  getattr(args, "src_dir", None), host)
    return cell, host
