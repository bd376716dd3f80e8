"""Tests for imagegen.publish.upload: destinations parsed and refused, and the rules every destination
follows (verified wheels only, skip the same bytes, refuse and keep different ones, a file that appears
between check and upload, one failure does not stop the rest, secrets never shown), over a stand-in
destination that keeps its files in memory. The destination modules have their own tests against
real or recording servers."""

from __future__ import annotations

import pytest

from imagegen.errors import PublishError, UsageError
from imagegen.publish import upload
from imagegen.publish.upload import (
    Destination,
    Found,
    HubDest,
    S3Dest,
    found_sha256,
    publish,
)
from tests.publish_servers import rebuilt, sha256, wheelhouse
from tests.unit.executor_fixtures import WHEEL, pure_wheel, tiny_cell

# --------------------------------------------------------------------------------------------
# Destinations


# Parsed by imagegen.model.destinations: tests/unit/test_destinations.py.


def test_hub_and_s3_place_the_wheel_under_its_own_name():
    assert HubDest("", "o/r", "main", "").path_in_repo("a.whl") == "a.whl"
    assert HubDest("", "o/r", "main", "cu128").path_in_repo("a.whl") == "cu128/a.whl"
    assert S3Dest("", "b", "p/").key("a.whl") == "p/a.whl"


def test_found_sha256_compares_with_the_wheels_recorded_digest(tmp_path):
    (wheel,) = upload.verified_wheels(wheelhouse(tmp_path / "out").parents[3])
    assert found_sha256(wheel.sha256.upper(), wheel) == Found(f"sha256:{wheel.sha256.upper()}", True)
    assert not found_sha256("0" * 64, wheel).same


# --------------------------------------------------------------------------------------------
# The rules, over a stand-in destination


class MemoryTarget(Destination):
    """A destination keeping its files in memory: name -> bytes. ``appears`` is put there between the
    check and the upload (another uploader's); ``fail`` maps a wheel name to the error its upload raises;
    ``give_up`` to the message with which the destination gives up at that wheel (credentials refused)."""

    def __init__(self) -> None:
        self.files: dict[str, bytes] = {}
        self.uploads: list[str] = []
        self.appears: dict[str, bytes] = {}
        self.fail: dict[str, Exception] = {}
        self.gives_up_at: dict[str, str] = {}

    def find(self, wheel):
        data = self.files.get(wheel.path.name)
        return None if data is None else found_sha256(sha256(data), wheel)

    def upload(self, wheel):
        name = wheel.path.name
        if name in self.fail:
            raise self.fail[name]
        if name in self.gives_up_at:
            raise self.give_up(self.gives_up_at[name])
        if name in self.appears:
            self.files[name] = self.appears.pop(name)
            return None
        self.uploads.append(name)
        self.files[name] = wheel.path.read_bytes()
        return f"mem://{name}"


@pytest.fixture
def targets(monkeypatch) -> dict[str, MemoryTarget]:
    """One MemoryTarget per destination text, handed out by upload.connect."""
    made: dict[str, MemoryTarget] = {}
    monkeypatch.setattr(upload, "connect", lambda dest, env, write, out=None: made.setdefault(dest.text, MemoryTarget()))
    return made


def _two_wheels(out):
    first = wheelhouse(out)
    second = wheelhouse(out, pure_wheel(out.parent / "src" / "demo-1.0-py3-none-any.whl", {"demo/__init__.py": ""}),
                        tiny_cell(python="3.12"))
    return first, second


def test_uploads_every_verified_wheel_then_skips_them(tmp_path, targets):
    first, second = _two_wheels(tmp_path / "out")
    report = publish(tmp_path / "out", ["s3://bucket-a", "s3://bucket-b"], env={})
    assert [(o.dest, o.wheel, o.status) for o in report.outcomes] == [
        ("s3://bucket-a", second.name, "uploaded"), ("s3://bucket-a", first.name, "uploaded"),
        ("s3://bucket-b", second.name, "uploaded"), ("s3://bucket-b", first.name, "uploaded")]
    assert targets["s3://bucket-a"].files == {first.name: first.read_bytes(), second.name: second.read_bytes()}
    assert report.outcomes[1].detail == f"mem://{first.name}"
    assert report.outcomes[1].sha256 == sha256(first.read_bytes())
    again = publish(tmp_path / "out", ["s3://bucket-a"], env={})
    assert [o.status for o in again.outcomes] == ["skipped", "skipped"] and not again.failures
    assert again.outcomes[0].detail == "already there, same sha256"
    assert targets["s3://bucket-a"].uploads == [second.name, first.name]


def test_a_different_file_of_the_same_name_is_refused_and_kept_and_the_rest_goes_on(tmp_path, targets):
    first, second = _two_wheels(tmp_path / "out")
    target = targets.setdefault("s3://bucket-a", MemoryTarget())
    theirs = b"someone else's build"
    target.files[first.name] = theirs
    report = publish(tmp_path / "out", ["s3://bucket-a"], env={})
    by_name = {o.wheel: o for o in report.outcomes}
    assert by_name[first.name].status == "refused" and by_name[second.name].status == "uploaded"
    assert f"sha256:{sha256(theirs)}" in by_name[first.name].detail
    assert "not overwritten" in by_name[first.name].detail
    assert target.files[first.name] == theirs and report.failures == [by_name[first.name]]


@pytest.mark.parametrize("there, status", [(None, "skipped"), (b"other bytes", "refused")])
def test_a_file_that_appears_between_check_and_upload_is_checked_again(tmp_path, targets, there, status):
    wheel = wheelhouse(tmp_path / "out")
    target = targets.setdefault("s3://bucket-a", MemoryTarget())
    target.appears[wheel.name] = wheel.read_bytes() if there is None else there
    (outcome,) = publish(tmp_path / "out", ["s3://bucket-a"], env={}).outcomes
    assert outcome.status == status and target.uploads == []
    assert target.files[wheel.name] == (wheel.read_bytes() if there is None else there)


def test_a_destination_error_fails_the_rest_of_that_destination_only(tmp_path, targets):
    first, second = _two_wheels(tmp_path / "out")
    broken = targets.setdefault("s3://bucket-a", MemoryTarget())
    broken.gives_up_at[second.name] = "credentials refused"
    report = publish(tmp_path / "out", ["s3://bucket-a", "s3://bucket-b"], env={})
    assert [(o.dest, o.status, o.detail) for o in report.outcomes[:2]] == [
        ("s3://bucket-a", "failed", "credentials refused"), ("s3://bucket-a", "failed", "credentials refused")]
    assert [o.status for o in report.outcomes[2:]] == ["uploaded", "uploaded"] and broken.uploads == []


def test_a_wheel_error_or_an_unforeseen_one_fails_that_wheel_only(tmp_path, targets):
    first, second = _two_wheels(tmp_path / "out")
    target = targets.setdefault("s3://bucket-a", MemoryTarget())
    target.fail[second.name] = ConnectionResetError("peer reset")
    report = publish(tmp_path / "out", ["s3://bucket-a"], env={})
    assert [(o.status, o.detail) for o in report.outcomes] == [
        ("failed", "ConnectionResetError: peer reset"), ("uploaded", f"mem://{first.name}")]
    target.fail[second.name] = PublishError("the index answered HTTP 500")
    assert publish(tmp_path / "out", ["s3://bucket-a"], env={}).outcomes[0].detail == "the index answered HTTP 500"


def test_a_destination_that_cannot_connect_fails_its_wheels(tmp_path, monkeypatch):
    wheelhouse(tmp_path / "out")

    def refuse(dest, env, write, out=None):
        raise PublishError("HF_TOKEN is not set")

    monkeypatch.setattr(upload, "connect", refuse)
    (outcome,) = publish(tmp_path / "out", ["hf:o/r"], env={}).outcomes
    assert (outcome.status, outcome.detail) == ("failed", "HF_TOKEN is not set")


def test_a_dry_run_reads_and_uploads_nothing(tmp_path, targets):
    first, second = _two_wheels(tmp_path / "out")
    target = targets.setdefault("s3://bucket-a", MemoryTarget())
    target.files[first.name] = first.read_bytes()
    report = publish(tmp_path / "out", ["s3://bucket-a"], dry_run=True, env={})
    assert [o.status for o in report.outcomes] == ["would-upload", "skipped"] and target.uploads == []
    assert report.summary() == "1 would upload, 1 skipped" and report.as_dict()["dry_run"] is True


def test_only_verified_wheels_go_and_the_others_are_problems(tmp_path, targets):
    first, second = _two_wheels(tmp_path / "out")
    second.write_bytes(b"changed after verification")
    report = publish(tmp_path / "out", ["s3://bucket-a"], env={})
    assert [o.wheel for o in report.outcomes] == [first.name]
    assert len(report.problems) == 1 and "changed since it was built and verified" in report.problems[0]


def test_two_different_wheels_of_one_name_are_both_refused(tmp_path, targets):
    out = tmp_path / "out"
    a = wheelhouse(out)
    b = wheelhouse(out / "nested", rebuilt(WHEEL, tmp_path / "rebuilt"))
    report = publish(out, ["s3://bucket-a"], env={})
    assert report.outcomes == [] and len(report.problems) == 1
    assert f"{a.name}: 2 different wheels of this name" in report.problems[0] and str(b.parent) in report.problems[0]


def test_an_empty_wheelhouse_is_an_error(tmp_path, targets):
    (tmp_path / "out").mkdir()
    with pytest.raises(PublishError, match="no verified wheel here") as info:
        publish(tmp_path / "out", ["s3://bucket-a"], env={})
    assert info.value.exit_code == 9 and targets == {}


def test_every_destination_is_checked_before_any_is_contacted(tmp_path, targets):
    wheelhouse(tmp_path / "out")
    with pytest.raises(UsageError):
        publish(tmp_path / "out", ["s3://bucket-a", "hf:bad"], env={})
    assert targets == {}


def test_secret_values_never_reach_a_report(tmp_path, targets):
    first, second = _two_wheels(tmp_path / "out")
    target = targets.setdefault("s3://bucket-a", MemoryTarget())
    target.secrets = ("netrc-pw-1234",)
    target.fail[first.name] = PublishError("server said: bad token hf_abcdef123 for netrc-pw-1234")
    target.fail[second.name] = ValueError("key AKIA-secret-xyz\x1b[31m\nrejected " + "x" * 1000)
    env = {"HF_TOKEN": "hf_abcdef123", "AWS_SECRET_ACCESS_KEY": "AKIA-secret-xyz"}
    report = publish(tmp_path / "out", ["s3://bucket-a"], env=env)
    text = str(report.as_dict())
    assert "hf_abcdef123" not in text and "AKIA-secret-xyz" not in text and "netrc-pw-1234" not in text
    details = {o.wheel: o.detail for o in report.outcomes}
    assert details[first.name] == "server said: bad token *** for ***"
    assert details[second.name].startswith("ValueError: key ***\\x1b[31m rejected xxx")  # one line, escaped
    assert len(details[second.name]) == upload.MAX_DETAIL


def test_lines_and_dicts():
    outcome = upload.Outcome("s3://bucket-a", "x.whl", "ab", "would-upload")
    assert outcome.line() == "would upload x.whl -> s3://bucket-a"
    skipped = upload.Outcome("s3://bucket-a", "x.whl", "ab", "skipped", "why")
    assert skipped.line() == "skipped      x.whl -> s3://bucket-a (why)"
    assert outcome.as_dict() == {"dest": "s3://bucket-a", "wheel": "x.whl", "sha256": "ab", "status": "would-upload",
                                 "detail": ""}
    assert upload.Report(dry_run=False).summary() == "nothing to publish"


def test_a_missing_client_library_names_the_extra():
    assert str(upload.missing_library("boto3")) == "boto3 is not installed: pip install 'imagegen-wheels[publish]'"
