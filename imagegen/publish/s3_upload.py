"""An S3 bucket (or any S3-compatible store: AWS_ENDPOINT_URL) as a publish destination
(``s3://BUCKET[/PREFIX]``), through boto3: each wheel becomes the object PREFIX/<wheel>, which pip
reads through the bucket's web endpoint (``--find-links`` on an index page such as `imagegen index`
writes, or a direct URL). With ``,layout=wheelhouse`` each wheel is PREFIX/<its path in the wheelhouse>
instead, and once every wheel is there the pages, metadata files and manifests (imagegen.publish.
served_files) follow, overwritten (``put_served``; skipped when the object records the same sha256): the
bucket served over HTTP is then the wheelhouse's pip index.

- What is there: ``head_object``. An object this module wrote carries its sha256 twice: as user
  metadata (``x-amz-meta-sha256``, hex) and as S3's own full-object checksum (``ChecksumSHA256``, which
  S3 also checked against the bytes it received). An object written by something else without either
  is compared by size, then downloaded and hashed when the sizes agree.
- Upload: one ``put_object`` per wheel with ``IfNoneMatch="*"``: S3 refuses it (412 / 409) when an
  object of that key exists, so nothing is overwritten even if one appeared after the check; the wheel
  is then checked again, and skipped or refused.
- Credentials: AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY (AWS_SESSION_TOKEN for temporary ones) only,
  never a profile, shared credentials file or instance role; the endpoint is AWS_ENDPOINT_URL, the
  region AWS_REGION or AWS_DEFAULT_REGION. A dry run without keys reads anonymously (a public bucket).

Tried against moto's S3 server (tests/unit/test_s3_upload.py, tests/integration/test_publish.py:
upload, metadata and checksum, re-publish skipped, a different object refused and kept, a conditional
write losing to an object that appeared, a missing bucket) and, for refused keys, a stub answering
S3's InvalidAccessKeyId error (moto accepts any key). Not tried against AWS S3 itself or another
S3-compatible store (no account or network here): If-None-Match on PutObject is S3's documented
conditional write (2024), and S3 checks ChecksumSHA256 against the bytes (moto stores it unchecked); a
store that ignores If-None-Match still gets the check before the upload.
"""

from __future__ import annotations

import base64
import hashlib
from pathlib import Path
from typing import Mapping

from imagegen.errors import PublishError
from imagegen.publish.served_files import ServedFile
from imagegen.publish.upload import Destination, Found, S3Dest, found_sha256, missing_library
from imagegen.wheelhouse.manifest import VerifiedWheel

CHUNK = 1 << 20
# Error codes that say the keys, not the object, are the problem.
CREDENTIAL_ERRORS = {"InvalidAccessKeyId", "SignatureDoesNotMatch", "AccessDenied", "ExpiredToken",
                     "InvalidToken", "403", "401"}


def connect(dest: S3Dest, env: Mapping[str, str], *, write: bool, out: Path | None = None) -> S3Prefix:
    """The bucket, with the wheelhouse ``out`` the wheels' keys are taken below (``layout=wheelhouse``)."""
    try:
        import boto3
        from botocore import UNSIGNED
        from botocore.config import Config
        from botocore.exceptions import BotoCoreError, ClientError
    except ImportError:
        raise missing_library("boto3") from None
    key_id, secret = env.get("AWS_ACCESS_KEY_ID") or None, env.get("AWS_SECRET_ACCESS_KEY") or None
    if write and not (key_id and secret):
        raise PublishError(f"no credentials for s3://{dest.bucket}: set AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"
                           " (and AWS_SESSION_TOKEN for temporary ones)")
    session = boto3.session.Session(aws_access_key_id=key_id, aws_secret_access_key=secret,
                                    aws_session_token=env.get("AWS_SESSION_TOKEN") or None,
                                    region_name=env.get("AWS_REGION") or env.get("AWS_DEFAULT_REGION") or None)
    # Without keys: anonymous requests, so that no other credential source (files, instance role) is read.
    config = Config(signature_version=UNSIGNED) if not (key_id and secret) else None
    client = session.client("s3", endpoint_url=env.get("AWS_ENDPOINT_URL") or None, config=config)
    return S3Prefix(dest, client, (ClientError, BotoCoreError), out)


class S3Prefix(Destination):
    def __init__(self, dest: S3Dest, client, errors: tuple[type, ...], out: Path | None = None) -> None:
        self.dest = dest
        self.client = client
        self.errors = errors  # botocore's ClientError and BotoCoreError
        self.out = out

    def wheel_key(self, wheel: VerifiedWheel) -> str:
        """PREFIX/<wheel>, or with layout=wheelhouse PREFIX/<its path in the wheelhouse>."""
        if self.dest.wheelhouse:
            if self.out is None:
                raise PublishError(f"{self.dest.text}: the wheelhouse layout needs the wheelhouse's folder")
            return self.dest.key(wheel.path.relative_to(self.out).as_posix())
        return self.dest.key(wheel.path.name)

    def find(self, wheel: VerifiedWheel) -> Found | None:
        key = self.wheel_key(wheel)
        try:
            head = self.client.head_object(Bucket=self.dest.bucket, Key=key, ChecksumMode="ENABLED")
        except self.errors as exc:
            if _code(exc) in ("404", "NoSuchKey", "NotFound"):
                return None
            raise self._error(exc, key) from None
        recorded = head.get("Metadata", {}).get("sha256")
        if recorded:
            return found_sha256(recorded, wheel)
        checksum = head.get("ChecksumSHA256") or ""
        if checksum and "-" not in checksum and head.get("ChecksumType", "FULL_OBJECT") == "FULL_OBJECT":
            return found_sha256(base64.b64decode(checksum).hex(), wheel)
        if head.get("ContentLength") != wheel.path.stat().st_size:
            return Found(f"{head.get('ContentLength')} bytes, no sha256 recorded", False)
        return found_sha256(self._download_sha256(key), wheel)

    def upload(self, wheel: VerifiedWheel) -> str | None:
        key = self.wheel_key(wheel)
        try:
            with wheel.path.open("rb") as fh:
                self.client.put_object(Bucket=self.dest.bucket, Key=key, Body=fh, IfNoneMatch="*",
                                       ChecksumAlgorithm="SHA256",
                                       ChecksumSHA256=base64.b64encode(bytes.fromhex(wheel.sha256)).decode(),
                                       Metadata={"sha256": wheel.sha256})
        except self.errors as exc:
            if _code(exc) in ("PreconditionFailed", "ConditionalRequestConflict", "412", "409"):
                return None  # an object of that key is there now
            raise self._error(exc, key) from None
        return f"s3://{self.dest.bucket}/{key}"

    def put_served(self, file: ServedFile, *, dry_run: bool) -> bool:
        """``file`` (a page, manifest or metadata file: layout=wheelhouse) at its key, overwritten: it changes
        from run to run. False when the object there records the same sha256 already (nothing is written)."""
        key = self.dest.key(file.key)
        data = file.path.read_bytes()
        digest = hashlib.sha256(data).hexdigest()
        try:
            try:
                head = self.client.head_object(Bucket=self.dest.bucket, Key=key)
                if head.get("Metadata", {}).get("sha256") == digest:
                    return False
            except self.errors as exc:
                if _code(exc) not in ("404", "NoSuchKey", "NotFound"):
                    raise
            if not dry_run:
                self.client.put_object(Bucket=self.dest.bucket, Key=key, Body=data, ContentType=file.content_type,
                                       ChecksumAlgorithm="SHA256",
                                       ChecksumSHA256=base64.b64encode(bytes.fromhex(digest)).decode(),
                                       Metadata={"sha256": digest})
        except self.errors as exc:
            raise self._error(exc, key) from None
        return True

    def _download_sha256(self, key: str) -> str:
        h = hashlib.sha256()
        try:
            body = self.client.get_object(Bucket=self.dest.bucket, Key=key)["Body"]
            for chunk in iter(lambda: body.read(CHUNK), b""):
                h.update(chunk)
        except self.errors as exc:
            raise self._error(exc, key) from None
        return h.hexdigest()

    def _error(self, exc, key: str) -> PublishError:
        where = f"s3://{self.dest.bucket}/{key}"
        code = _code(exc)
        if code is None:  # not an answer from the store: it cannot be reached
            return self.give_up(f"{where}: {exc}")
        if code == "NoSuchBucket":
            return self.give_up(f"s3://{self.dest.bucket}: no such bucket")
        if code in CREDENTIAL_ERRORS:
            return self.give_up(f"{where}: the store refused the credentials ({code}): check AWS_ACCESS_KEY_ID and"
                                " AWS_SECRET_ACCESS_KEY, and that they may read and write this bucket")
        return PublishError(f"{where}: {code}: {exc}")


def _code(exc) -> str | None:
    response = getattr(exc, "response", None)
    return str(response.get("Error", {}).get("Code")) if isinstance(response, dict) else None
