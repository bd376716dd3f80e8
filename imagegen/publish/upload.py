"""`imagegen publish`: the verified wheels of a wheelhouse uploaded to one or more destinations, with
the same rules everywhere and each wheel's outcome reported.

Destinations, as ``--to`` names them (every part reaches a URL, so each is matched against a strict
pattern before anything is contacted, by imagegen.model.destinations; a malformed one is a UsageError,
exit 2):

- ``pypi:UPLOAD_URL[,simple=INDEX_URL]``: a PyPI-compatible legacy upload endpoint (twine), e.g.
  ``pypi:https://upload.pypi.org/legacy/`` or pypiserver's ``pypi:http://host:8080/``. What is already
  there is read from the index's PEP 503 page ``INDEX_URL/<project>/``; INDEX_URL defaults to
  https://pypi.org/simple/ (test.pypi.org's for TestPyPI), else to the upload URL with a final
  ``legacy/`` replaced by ``simple/`` (pypiserver, warehouse); other servers (devpi:
  ``,simple=https://host/user/index/+simple/``) name it.
- ``hf:OWNER/REPO[@REVISION][:PATH]``: a Hugging Face Hub model repository (that exists, or that
  ``--create`` creates), on branch REVISION (default main), in folder PATH (default the top).
- ``github:OWNER/REPO@TAG``: the assets of the release of TAG (created when there is none).
- ``s3://BUCKET[/PREFIX][,layout=wheelhouse]``: objects under PREFIX.

A wheel lands under its own file name (pip reads name, version and tags from it), flat: DEST/<wheel>; with
``layout=wheelhouse`` at its path in the wheelhouse, and after the wheels the files the wheelhouse is served
with (imagegen.publish.served_files: metadata files, manifests, index pages), which unlike wheels are
overwritten (they change every run), and only once every wheel is there (a page must not link a wheel that
is not). A wheelhouse without an index is refused there before any wheel is uploaded.

The rules, the same for every destination (the destination modules only read what is there and upload):

- only verified wheels are uploaded (imagegen.wheelhouse.manifest.verified_wheels: listed in a manifest.json
  with the sha256 they still have); a listed wheel that is missing or changed, or two different
  wheels of one name, are refused;
- a file already there under the wheel's name with the same sha256 is skipped;
- a different file under that name is refused and never overwritten. Each upload is also conditional
  where it can be (an index refuses a name it has, a Hub commit names its parent commit, GitHub refuses a
  second asset of one name, S3 writes with If-None-Match: *), so a file that appears between the check
  and the upload is not overwritten either: it is then checked again, and skipped or refused;
- one refused or failed wheel does not stop the others; a destination that cannot be used at all
  (credentials refused, repository missing) fails its remaining wheels, and the other destinations go on.

Credentials come from the environment only, never from the command line: TWINE_USERNAME /
TWINE_PASSWORD or a netrc entry (PyPI-compatible), HF_TOKEN or the token `huggingface-cli login` stored
(and HF_ENDPOINT), GITHUB_TOKEN (and
GITHUB_API_URL), AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN (and AWS_ENDPOINT_URL,
AWS_REGION). A dry run (``dry_run``, `publish --dry-run`) contacts no destination (``offline``): it lists
the verified wheels each destination would be given, and works with no network and no credentials; a
checking dry run (``offline=False``, `publish --check`) reads what is there (with the credentials if they
are set, anonymously if not), so says what would be skipped or refused, and uploads nothing. Every
message a destination or its client library gives is stripped of the secret values before it is shown.
"""

from __future__ import annotations

import importlib
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Mapping, Protocol, Sequence

from imagegen import untrusted
from imagegen.errors import PublishError, UsageError, bounded, printable
# The destinations' grammar (``--to``), shared with `ci github --publish`; the destination modules import
# the parsed forms from here.
from imagegen.model.destinations import Dest, GithubDest, HubDest, PypiDest, S3Dest, parse_destination  # noqa: F401
from imagegen.safety import redact
from imagegen.wheelhouse.external import is_external
from imagegen.wheelhouse.manifest import VerifiedWheel, verified_wheels

# --------------------------------------------------------------------------------------------
# What a destination module provides


@dataclass(frozen=True)
class Found:
    """A file already at the destination under a wheel's name."""

    digest: str  # what it is, as the service records it: "sha256:<hex>", "git-sha1:<hex>", "<n> bytes"
    same: bool  # whether it is the wheel's bytes


def found_sha256(remote_hex: str, wheel: VerifiedWheel) -> Found:
    return Found(f"sha256:{remote_hex}", remote_hex.lower() == wheel.sha256)


class Target(Protocol):
    """A connected destination: each destination module's ``connect`` returns one, or raises PublishError
    when the destination cannot be used at all (no credentials, a client library not installed)."""

    secrets: tuple[str, ...]  # credentials it found beyond the environment's (a netrc password): never shown
    unusable: str  # why it cannot be used any more, once it cannot (credentials refused, no such repository)

    def find(self, wheel: VerifiedWheel) -> Found | None:
        """What is there under the wheel's name; None if nothing. Raises PublishError."""

    def upload(self, wheel: VerifiedWheel) -> str | None:
        """Upload the wheel; returns where it is now, or None when the service refused it because a file
        of that name is there now (one that appeared after ``find``). Raises PublishError."""


class Destination:
    """What the destination modules' targets share."""

    secrets: tuple[str, ...] = ()
    unusable = ""

    def give_up(self, message: str) -> PublishError:
        """The error that ends this destination (credentials refused, no such repository): the wheels not
        yet done there fail with ``message`` instead of being tried."""
        self.unusable = message
        return PublishError(message)


MODULES = {PypiDest: "pypi_upload", HubDest: "hub_upload", GithubDest: "github_upload", S3Dest: "s3_upload"}


def connect(dest: Dest, env: Mapping[str, str], *, write: bool, out: Path | None = None,
            create: bool = False) -> Target:
    """The destination's module (imported only now: each brings a client library) connected to it; an S3
    bucket is told the wheelhouse ``out`` (with layout=wheelhouse, a wheel's key is its path below it); a
    Hub repository is created first with ``create`` (--create) when writing."""
    module = importlib.import_module(f"imagegen.publish.{MODULES[type(dest)]}")
    if isinstance(dest, S3Dest):
        return module.connect(dest, env, write=write, out=out)
    if isinstance(dest, HubDest):
        return module.connect(dest, env, write=write, create=create)
    return module.connect(dest, env, write=write)


def missing_library(package: str) -> PublishError:
    return PublishError(f"{package} is not installed: pip install 'imagegen-wheels[publish]'")


# --------------------------------------------------------------------------------------------
# Outcomes

UPLOADED, WOULD_UPLOAD, SKIPPED, REFUSED, FAILED = "uploaded", "would-upload", "skipped", "refused", "failed"


@dataclass(frozen=True)
class Outcome:
    dest: str
    wheel: str  # file name
    sha256: str
    status: str  # uploaded | would-upload | skipped | refused | failed
    detail: str = ""
    external: bool = False  # a wheel imagegen did not build (collect --external)

    def as_dict(self) -> dict:
        return {"dest": self.dest, "wheel": self.wheel, "sha256": self.sha256, "status": self.status,
                "detail": self.detail, **({"external": True} if self.external else {})}

    def line(self) -> str:
        wheel = f"{self.wheel} [external]" if self.external else self.wheel
        return f"{self.status.replace('-', ' '):<12} {wheel} -> {self.dest}" + (
            f" ({self.detail})" if self.detail else "")


@dataclass
class Report:
    dry_run: bool
    outcomes: list[Outcome] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # wheels of the wheelhouse not considered, and why

    @property
    def failures(self) -> list[Outcome]:
        return [o for o in self.outcomes if o.status in (REFUSED, FAILED)]

    def count(self, status: str) -> int:
        return sum(o.status == status for o in self.outcomes)

    def summary(self) -> str:
        counts = ", ".join(f"{n} {s.replace('-', ' ')}" for s in (UPLOADED, WOULD_UPLOAD, SKIPPED, REFUSED, FAILED)
                           if (n := self.count(s)))
        return counts or "nothing to publish"

    def as_dict(self) -> dict:
        return {"dry_run": self.dry_run, "outcomes": [o.as_dict() for o in self.outcomes], "problems": self.problems}


# --------------------------------------------------------------------------------------------
# The orchestration

# Time: one exchange with a destination (connecting, reading what is there, uploading one wheel and
# checking it) gets DEADLINE seconds ($IMAGEGEN_PUBLISH_DEADLINE), plus a second per MiB of the wheel
# it uploads; then its connections are shut down (untrusted.connections_within), so a server that drips
# or never answers fails that wheel, and the destination, in bounded time.
DEADLINE = 300.0
UPLOAD_RATE = 1 << 20  # bytes per second an upload may be as slow as


def deadline_seconds(env: Mapping[str, str], size: int = 0) -> float:
    raw = (env.get("IMAGEGEN_PUBLISH_DEADLINE") or "").strip()
    try:
        base = float(raw) if raw else DEADLINE
    except ValueError:
        base = float("nan")
    if not 0 < base <= 86400:
        raise UsageError(f"IMAGEGEN_PUBLISH_DEADLINE={raw[:40]!r}: give a number of seconds (at most 86400)")
    return base + size / UPLOAD_RATE


def _expired(seconds: float) -> str:
    return (f"no complete answer within the {seconds:.0f} s this exchange may take (a stalled or dripping server?):"
            " the destination is given up")


# Environment variables whose values are secrets: no message may show them.
SECRET_VARIABLES = ("TWINE_PASSWORD", "HF_TOKEN", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")
MAX_DETAIL = 300


def publish(out: Path, to: Sequence[str], *, dry_run: bool = False, env: Mapping[str, str] | None = None,
            create: bool = False, offline: bool = False) -> Report:
    """Upload the verified wheels of ``out`` to every destination of ``to`` (all parsed before any is
    contacted), or with ``dry_run`` say what would be done. ``create`` (--create): a Hub repository of ``to``
    that does not exist yet is created (huggingface_hub's create_repo, exist_ok). ``offline`` (with
    ``dry_run``): no destination is contacted, no client library imported; every wheel would be uploaded.
    Never raises for one wheel or destination: their failures are in the report."""
    env = os.environ if env is None else env
    dests = [parse_destination(text) for text in to]
    if create and not any(isinstance(d, HubDest) for d in dests):
        raise UsageError("--create makes a Hugging Face Hub repository: give an hf:OWNER/REPO destination (a GitHub"
                         " release is created without it; an index or a bucket must exist)")
    deadline_seconds(env)  # a malformed $IMAGEGEN_PUBLISH_DEADLINE is said before anything is read
    report = Report(dry_run=dry_run)
    wheels = _unique_names(verified_wheels(Path(out), problems=report.problems), report.problems)
    if not wheels and not report.problems:
        raise PublishError(f"{out}: no verified wheel here (imagegen build lists the wheels it verified in each"
                           " folder's manifest.json; publish uploads only those)")
    secrets = [v for name in SECRET_VARIABLES if (v := env.get(name))]
    for dest in dests:
        if dry_run and offline:
            report.outcomes += _offline(dest, wheels, Path(out))
            continue
        report.outcomes += _publish_to(dest, wheels, env=env, dry_run=dry_run, secrets=secrets, out=Path(out),
                                       create=create)
    return report


def _unique_names(wheels: list[VerifiedWheel], problems: list[str]) -> list[VerifiedWheel]:
    """The wheels by file name (a destination is flat): one of several copies with the same bytes;
    two different wheels of one name are both refused."""
    by_name: dict[str, list[VerifiedWheel]] = {}
    for wheel in wheels:
        by_name.setdefault(wheel.path.name, []).append(wheel)
    unique = []
    for name, group in by_name.items():
        if len({w.sha256 for w in group}) > 1:
            folders = ", ".join(str(w.path.parent) for w in group)
            problems.append(f"{name}: {len(group)} different wheels of this name ({folders}): a destination holds"
                            " one file per name; publish them from separate wheelhouses")
        else:
            unique.append(group[0])
    return unique


def _publish_to(dest: Dest, wheels: list[VerifiedWheel], *, env: Mapping[str, str], dry_run: bool,
                secrets: list[str], out: Path, create: bool = False) -> list[Outcome]:
    outcomes: list[Outcome] = []
    if not wheels:
        return outcomes
    broken = ""  # why the destination cannot be used: the remaining wheels fail with it
    if isinstance(dest, S3Dest) and dest.wheelhouse:
        from imagegen.publish.served_files import served_files
        try:
            served_files(out, wheels)  # no index to serve them with: not one wheel is uploaded
        except PublishError as exc:
            broken = str(exc)
    limit = deadline_seconds(env)
    with untrusted.connections_within(limit) as watch:
        try:
            if broken:
                raise PublishError(broken)
            target = connect(dest, env, write=not dry_run, out=out, **({"create": True} if create else {}))
            secrets = secrets + list(target.secrets)
        except Exception as exc:  # PublishError, or a client library's own error that its module did not foresee
            broken = _redact(_reason(exc), secrets)
    if watch.expired:
        broken = _expired(limit)
    for wheel in wheels:
        if broken:
            outcomes.append(Outcome(dest.text, wheel.path.name, wheel.sha256, FAILED, broken,
                                    is_external(wheel.entry)))
            continue
        limit = deadline_seconds(env, 0 if dry_run else wheel.path.stat().st_size)
        with untrusted.connections_within(limit) as watch:
            try:
                status, detail = _one(target, wheel, dry_run)
            except Exception as exc:  # this wheel failed; the next is tried unless the destination gave up
                status, detail = FAILED, _reason(exc)
        if watch.expired:  # whatever the client made of its cut connections
            status, detail = FAILED, _expired(limit)
            target.unusable = target.unusable or detail
        broken = _redact(target.unusable, secrets)
        outcomes.append(Outcome(dest.text, wheel.path.name, wheel.sha256, status, _redact(detail, secrets),
                                is_external(wheel.entry)))
    if isinstance(dest, S3Dest) and dest.wheelhouse:
        outcomes.append(_publish_served(dest, None if broken else target, out, wheels, outcomes, env=env,
                                        dry_run=dry_run, secrets=secrets))
    return outcomes


NOT_CONTACTED = "not checked: a dry run contacts no destination; --check reads what is there"


def _offline(dest: Dest, wheels: list[VerifiedWheel], out: Path) -> list[Outcome]:
    """A dry run's outcomes at ``dest`` without contacting it: each wheel would be uploaded (whether one is
    there already is not known), then, for a wheelhouse bucket, the files it is served with."""
    outcomes = [Outcome(dest.text, w.path.name, w.sha256, WOULD_UPLOAD, NOT_CONTACTED, is_external(w.entry))
                for w in wheels]
    if wheels and isinstance(dest, S3Dest) and dest.wheelhouse:
        from imagegen.publish.served_files import served_files
        try:
            files = served_files(out, wheels)
        except PublishError as exc:
            outcomes = [Outcome(dest.text, w.path.name, w.sha256, FAILED, str(exc), is_external(w.entry))
                        for w in wheels]
            return outcomes + [Outcome(dest.text, SERVED, "", FAILED,
                                       "not uploaded: no index to serve the wheels with")]
        count = f"{len(files)} file{'s' if len(files) != 1 else ''}"
        outcomes.append(Outcome(dest.text, SERVED, "", WOULD_UPLOAD, f"{count} to write or leave unchanged at"
                                f" s3://{dest.bucket}/{dest.prefix} ({NOT_CONTACTED})"))
    return outcomes


SERVED = "index, manifests and metadata"  # the outcome line of a wheelhouse destination's served files


def _publish_served(dest: S3Dest, target, out: Path, wheels: list[VerifiedWheel], outcomes: list[Outcome], *,
                    env: Mapping[str, str], dry_run: bool, secrets: list[str]) -> Outcome:
    """After the wheels (layout=wheelhouse): the files the wheelhouse is served with (served_files), each
    overwritten, in their order; only when every wheel is there, as a page must not link a wheel that is
    not. One outcome for all of them."""
    from imagegen.publish.served_files import served_files

    failed = [o for o in outcomes if o.status in (REFUSED, FAILED)]
    if target is None or failed:
        why = f"{len(failed)} wheel{'s' if len(failed) != 1 else ''} not there" if failed else "the destination failed"
        return Outcome(dest.text, SERVED, "", FAILED, f"not uploaded: {why}, which the pages would link")
    written = same = 0
    limit = deadline_seconds(env)
    with untrusted.connections_within(limit) as watch:
        try:
            files = served_files(out, wheels)
            for file in files:
                if target.put_served(file, dry_run=dry_run):
                    written += 1
                else:
                    same += 1
            status, detail = (WOULD_UPLOAD if dry_run else UPLOADED), (
                f"{written} file{'s' if written != 1 else ''} {'to write' if dry_run else 'written'}, {same} unchanged,"
                f" at s3://{dest.bucket}/{dest.prefix}")
        except Exception as exc:  # PublishError, or a client library's own
            status, detail = FAILED, f"after {written} of them: {_reason(exc)}"
    if watch.expired:
        status, detail = FAILED, _expired(limit)
    return Outcome(dest.text, SERVED, "", status, _redact(detail, secrets))


def _reason(exc: Exception) -> str:
    return str(exc) if isinstance(exc, PublishError) else f"{exc.__class__.__name__}: {exc}"


def _one(target: Target, wheel: VerifiedWheel, dry_run: bool) -> tuple[str, str]:
    found = target.find(wheel)
    if found is None:
        if dry_run:
            return WOULD_UPLOAD, ""
        where = target.upload(wheel)
        if where is not None:
            return UPLOADED, where
        found = target.find(wheel)  # refused as there now: what is it?
        if found is None:
            raise PublishError("the destination refused it as already there, but shows no file of that name")
    if found.same:
        return SKIPPED, "already there, same sha256"
    return REFUSED, (f"a different file of that name is there ({found.digest}; this wheel is sha256:{wheel.sha256}):"
                     " not overwritten; publish a new version, or remove that file first")


def _redact(text: str, secrets: list[str]) -> str:
    """``text`` as a report shows it: every secret value replaced by *** (longest first: one may contain
    another), on one line, at most MAX_DETAIL characters (a server's error page is not echoed whole)."""
    return bounded(printable(" ".join(redact(text, secrets).split())), MAX_DETAIL)
