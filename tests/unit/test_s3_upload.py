"""Tests for imagegen.publish.s3_upload against moto's real S3 server on 127.0.0.1 (in a thread): the
object's key, bytes, sha256 metadata and checksum, skip and refuse by what the object records (or by its
bytes when it records nothing), a conditional write losing to an object that appeared, credentials from
the environment only, and refused keys (a stub answering S3's error: moto accepts any key)."""

from __future__ import annotations

import base64
import hashlib
import sys

import pytest

from imagegen.errors import PublishError
from imagegen.publish import s3_upload
from imagegen.publish.upload import parse_destination, publish
from imagegen.wheelhouse.manifest import verified_wheels
from tests.publish_servers import MotoS3, RecordingServer, Reply, sha256, wheelhouse

BUCKET = "wheels"
SECRET = "s3-unit-SECRET-0123456789"


@pytest.fixture(scope="module")
def s3():
    with MotoS3(BUCKET) as server:
        yield server


@pytest.fixture
def prefix(request) -> str:
    """A key prefix of this test's own (the bucket is shared by the module)."""
    return f"t/{request.node.name.replace('[', '-').replace(']', '')}/"


def env(s3: MotoS3, secret: str | None = SECRET) -> dict[str, str]:
    return {"AWS_ENDPOINT_URL": s3.url, "AWS_REGION": "us-east-1",
            **({"AWS_ACCESS_KEY_ID": "AKIDUNIT", "AWS_SECRET_ACCESS_KEY": secret} if secret else {})}


def test_the_object_records_its_sha256_and_a_second_run_skips(tmp_path, s3, prefix):
    wheel = wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", [f"s3://{BUCKET}/{prefix}"], env=env(s3)).outcomes
    key = f"{prefix}{wheel.name}"
    assert (outcome.status, outcome.detail) == ("uploaded", f"s3://{BUCKET}/{key}")
    client = s3.client()
    assert client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == wheel.read_bytes()
    head = client.head_object(Bucket=BUCKET, Key=key, ChecksumMode="ENABLED")
    digest = sha256(wheel.read_bytes())
    assert head["Metadata"] == {"sha256": digest}
    assert base64.b64decode(head["ChecksumSHA256"]).hex() == digest
    (again,) = publish(tmp_path / "out", [f"s3://{BUCKET}/{prefix}"], env=env(s3)).outcomes
    assert again.status == "skipped"


@pytest.mark.parametrize("record", ["metadata", "checksum", "nothing"])
def test_an_object_written_by_something_else_is_compared_by_what_it_records(tmp_path, s3, prefix, record):
    wheel = wheelhouse(tmp_path / "out")
    client, key = s3.client(), f"{prefix}{wheel.name}"
    extra = {"metadata": {"Metadata": {"sha256": sha256(wheel.read_bytes())}},
             "checksum": {"ChecksumAlgorithm": "SHA256"}, "nothing": {}}[record]
    client.put_object(Bucket=BUCKET, Key=key, Body=wheel.read_bytes(), **extra)
    (outcome,) = publish(tmp_path / "out", [f"s3://{BUCKET}/{prefix}"], env=env(s3)).outcomes
    assert outcome.status == "skipped"


@pytest.mark.parametrize("size", ["other", "same"])
def test_a_different_object_is_refused_and_kept(tmp_path, s3, prefix, size):
    wheel = wheelhouse(tmp_path / "out")
    body = b"another build" if size == "other" else bytes(wheel.stat().st_size)
    client, key = s3.client(), f"{prefix}{wheel.name}"
    client.put_object(Bucket=BUCKET, Key=key, Body=body)
    (outcome,) = publish(tmp_path / "out", [f"s3://{BUCKET}/{prefix}"], env=env(s3)).outcomes
    assert outcome.status == "refused" and client.get_object(Bucket=BUCKET, Key=key)["Body"].read() == body
    assert (f"{len(body)} bytes, no sha256 recorded" if size == "other"  # not downloaded
            else f"sha256:{hashlib.sha256(body).hexdigest()}") in outcome.detail


def test_the_write_is_conditional_so_an_object_that_appeared_is_not_overwritten(tmp_path, s3, prefix):
    wheel = wheelhouse(tmp_path / "out")
    (verified,) = verified_wheels(tmp_path / "out")
    target = s3_upload.connect(parse_destination(f"s3://{BUCKET}/{prefix}"), env(s3), write=True)
    assert target.find(verified) is None
    s3.client().put_object(Bucket=BUCKET, Key=f"{prefix}{wheel.name}", Body=b"theirs")  # after our check
    assert target.upload(verified) is None  # refused by the store: an object of that key is there now
    assert s3.client().get_object(Bucket=BUCKET, Key=f"{prefix}{wheel.name}")["Body"].read() == b"theirs"


def test_a_missing_bucket_fails_the_destination(tmp_path, s3):
    wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", ["s3://no-such-bucket"], env=env(s3)).outcomes
    assert (outcome.status, outcome.detail) == ("failed", "s3://no-such-bucket: no such bucket")


def test_without_keys_nothing_is_written_and_a_dry_run_reads_anonymously(tmp_path, s3, prefix):
    wheelhouse(tmp_path / "out")
    (outcome,) = publish(tmp_path / "out", [f"s3://{BUCKET}/{prefix}"], env=env(s3, None)).outcomes
    assert outcome.status == "failed" and outcome.detail.startswith(f"no credentials for s3://{BUCKET}: set"
                                                                    " AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY")
    (dry,) = publish(tmp_path / "out", [f"s3://{BUCKET}/{prefix}"], env=env(s3, None), dry_run=True).outcomes
    assert dry.status == "would-upload"
    assert s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)["KeyCount"] == 0


class RefusingS3(RecordingServer):
    """Answers every request as S3 does a key it does not know."""

    def answer(self, request):
        return Reply(403, b"<?xml version='1.0' encoding='UTF-8'?><Error><Code>InvalidAccessKeyId</Code><Message>The"
                          b" AWS Access Key Id you provided does not exist in our records.</Message></Error>",
                     {"Content-Type": "application/xml"})


def test_refused_keys_fail_the_destination_and_the_secret_is_not_shown(tmp_path):
    wheelhouse(tmp_path / "out")
    with RefusingS3() as stub:
        (outcome,) = publish(tmp_path / "out", [f"s3://{BUCKET}"], env={
            "AWS_ENDPOINT_URL": stub.base, "AWS_REGION": "us-east-1", "AWS_ACCESS_KEY_ID": "AKIDWRONG",
            "AWS_SECRET_ACCESS_KEY": SECRET}).outcomes
    # The first request is a HEAD, whose error has no body: S3's answer is its status alone.
    assert outcome.status == "failed" and "the store refused the credentials (403)" in outcome.detail
    assert SECRET not in outcome.detail and "authorization" in stub.requests[0].headers


def test_a_missing_boto3_names_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "boto3", None)
    with pytest.raises(PublishError, match=r"^boto3 is not installed: pip install 'imagegen-wheels\[publish\]'$"):
        s3_upload.connect(parse_destination(f"s3://{BUCKET}"), {}, write=False)


# ------------------------------------------------------------------------------------ layout=wheelhouse


def indexed_wheelhouse(out):
    from imagegen.publish.index import write_index

    wheel = wheelhouse(out)
    write_index(out, say=lambda message: None)
    return wheel


def test_the_wheelhouse_layout_puts_each_wheel_at_its_path_then_the_index_overwritable(tmp_path, s3, prefix):
    out = tmp_path / "out"
    wheel = indexed_wheelhouse(out)
    dest = f"s3://{BUCKET}/{prefix},layout=wheelhouse"
    wheel_outcome, served = publish(out, [dest], env=env(s3)).outcomes
    rel = wheel.relative_to(out).as_posix()
    assert (wheel_outcome.status, wheel_outcome.detail) == ("uploaded", f"s3://{BUCKET}/{prefix}{rel}")
    assert served.wheel == "index, manifests and metadata" and served.status == "uploaded"
    client = s3.client()
    keys = [o["Key"][len(prefix):] for o in client.list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]]
    folder = wheel.parent.relative_to(out).as_posix()
    assert set(keys) == {rel, f"{rel}.metadata", f"{folder}/manifest.json", "index.html",
                         "simple/index.html", "simple/index.json", "simple/tiny-kernel/index.html",
                         "simple/tiny-kernel/index.json", "cu130/simple/index.html", "cu130/simple/index.json",
                         "cu130/simple/tiny-kernel/index.html", "cu130/simple/tiny-kernel/index.json"}
    page = client.get_object(Bucket=BUCKET, Key=f"{prefix}simple/tiny-kernel/index.html")
    assert page["ContentType"] == "text/html; charset=utf-8"
    assert page["Body"].read() == (out / "simple" / "tiny-kernel" / "index.html").read_bytes()
    assert served.detail == f"11 files written, 0 unchanged, at s3://{BUCKET}/{prefix}"
    # A second run: the wheel skipped, the files that did not change not written again; a page that
    # changed is overwritten (a wheel never is).
    (out / "simple" / "index.html").write_bytes(b"<html>changed</html>")
    wheel_again, served_again = publish(out, [dest], env=env(s3)).outcomes
    assert wheel_again.status == "skipped"
    assert served_again.detail == f"1 file written, 10 unchanged, at s3://{BUCKET}/{prefix}"
    assert client.get_object(Bucket=BUCKET, Key=f"{prefix}simple/index.html")["Body"].read() == b"<html>changed</html>"


def test_the_served_manifest_is_uploaded_as_the_folders_manifest(tmp_path, s3, prefix):
    from imagegen.publish.index import SERVED_MANIFEST

    out = tmp_path / "out"
    wheel = indexed_wheelhouse(out)
    (wheel.parent / SERVED_MANIFEST).write_text('{"schema": 1, "cells": {"merged": true}}')
    publish(out, [f"s3://{BUCKET}/{prefix},layout=wheelhouse"], env=env(s3))
    key = f"{prefix}{wheel.parent.relative_to(out).as_posix()}/manifest.json"
    assert s3.client().get_object(Bucket=BUCKET, Key=key)["Body"].read() == (wheel.parent / SERVED_MANIFEST).read_bytes()


def test_without_an_index_no_wheel_is_uploaded(tmp_path, s3, prefix):
    out = tmp_path / "out"
    wheelhouse(out)
    wheel_outcome, served = publish(out, [f"s3://{BUCKET}/{prefix},layout=wheelhouse"], env=env(s3)).outcomes
    assert wheel_outcome.status == "failed" and wheel_outcome.detail.startswith(f"{out} has no index: run imagegen index")
    assert served.status == "failed" and "not uploaded" in served.detail
    assert s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)["KeyCount"] == 0


def test_a_refused_wheel_keeps_the_index_off_the_bucket(tmp_path, s3, prefix):
    out = tmp_path / "out"
    wheel = indexed_wheelhouse(out)
    key = f"{prefix}{wheel.relative_to(out).as_posix()}"
    s3.client().put_object(Bucket=BUCKET, Key=key, Body=b"another wheel", Metadata={"sha256": "0" * 64})
    wheel_outcome, served = publish(out, [f"s3://{BUCKET}/{prefix},layout=wheelhouse"], env=env(s3)).outcomes
    assert wheel_outcome.status == "refused"
    assert (served.status, served.detail) == ("failed", "not uploaded: 1 wheel not there, which the pages would link")
    keys = [o["Key"] for o in s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)["Contents"]]
    assert keys == [key]


def test_a_dry_run_of_the_layout_writes_nothing(tmp_path, s3, prefix):
    out = tmp_path / "out"
    indexed_wheelhouse(out)
    wheel_outcome, served = publish(out, [f"s3://{BUCKET}/{prefix},layout=wheelhouse"], env=env(s3),
                                    dry_run=True).outcomes
    assert (wheel_outcome.status, served.status) == ("would-upload", "would-upload")
    assert served.detail.startswith("11 files to write")
    assert s3.client().list_objects_v2(Bucket=BUCKET, Prefix=prefix)["KeyCount"] == 0
