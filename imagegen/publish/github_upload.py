"""A GitHub release as a publish destination (``github:OWNER/REPO@TAG``), through PyGithub: the wheels
become assets of the release of TAG (created, on that tag, when there is none), which pip installs from
``https://github.com/OWNER/REPO/releases/download/TAG/<wheel>`` or finds with ``--find-links`` on a
page listing them.

- What is there: the release's assets by name. GitHub records a ``digest`` ("sha256:<hex>") for every
  asset uploaded since mid-2025, which is compared with the wheel's; an older asset (or a GitHub
  Enterprise Server without digests) of the same size is downloaded and hashed, one of another size
  differs. No ``.sha256`` companion asset is written: it would be one more file to keep in step, and
  the digest covers new assets.
- Upload: ``upload_asset_from_memory`` from the open file (PyGithub's ``upload_asset`` leaves its file
  open). GitHub refuses a second asset of one name (HTTP 422 already_exists): the wheel is then
  checked again, and skipped or refused. A digest GitHub returns for the new asset must be the wheel's.
- Credentials: GITHUB_TOKEN only (it needs ``contents: write`` on OWNER/REPO); the API is
  GITHUB_API_URL (set on GitHub Actions runners; default https://api.github.com), which also lets the
  tests point PyGithub at their own server (GitHub Enterprise Server's /api/v3 layout).

Tried: against a local HTTP server that answers the REST calls this path makes and records them
(tests/unit/test_github_upload.py, tests/integration/test_publish.py): the release looked up by tag,
created when missing, the asset's name and bytes, the download of a digest-less asset, the
Authorization header carrying GITHUB_TOKEN, and that the token is in no output. Not tried against
api.github.com itself (no token or network here): the answers are modelled on GitHub's REST
documentation and PyGithub's client code.
"""

from __future__ import annotations

import hashlib
from typing import Mapping

from imagegen.errors import PublishError
from imagegen.publish.upload import Destination, Found, GithubDest, found_sha256, missing_library
from imagegen.wheelhouse.manifest import VerifiedWheel

DEFAULT_API = "https://api.github.com"
TIMEOUT_S = 60
CHUNK = 1 << 20


def connect(dest: GithubDest, env: Mapping[str, str], *, write: bool) -> GithubRelease:
    try:
        from github import Auth, Github
    except ImportError:
        raise missing_library("PyGithub") from None
    token = env.get("GITHUB_TOKEN") or None
    if write and not token:
        raise PublishError(f"GITHUB_TOKEN is not set: a token that may write the releases of {dest.repo}"
                           " (contents: write)")
    client = Github(auth=Auth.Token(token) if token else None, base_url=env.get("GITHUB_API_URL") or DEFAULT_API,
                    timeout=TIMEOUT_S, lazy=True)
    return GithubRelease(dest, client)


class GithubRelease(Destination):
    def __init__(self, dest: GithubDest, client) -> None:
        self.dest = dest
        self.repo = client.get_repo(dest.repo)  # lazy: no request until the release is asked for
        self._release = None
        self._assets: dict | None = None  # name -> asset, read once, then kept up to date

    def find(self, wheel: VerifiedWheel) -> Found | None:
        asset = self._assets_by_name().get(wheel.path.name)
        if asset is None:
            return None
        digest = self._call(lambda: asset.digest) or ""
        if digest.startswith("sha256:"):
            return found_sha256(digest.split(":", 1)[1], wheel)
        if asset.size != wheel.path.stat().st_size:
            return Found(f"{asset.size} bytes, no digest recorded", False)
        return found_sha256(self._download_sha256(asset), wheel)

    def upload(self, wheel: VerifiedWheel) -> str | None:
        from github import GithubException

        release = self._release or self._create_release()
        name = wheel.path.name
        try:
            with wheel.path.open("rb") as fh:
                asset = release.upload_asset_from_memory(fh, wheel.path.stat().st_size, name=name,
                                                         content_type="application/zip")
        except GithubException as exc:
            if exc.status == 422 and "already_exists" in str(exc.data):
                self._assets = None  # read again: the asset that took the name
                return None
            raise self._error(exc) from None
        self._assets_by_name()[name] = asset
        digest = asset.digest or ""
        if digest.startswith("sha256:") and digest.split(":", 1)[1] != wheel.sha256:
            raise PublishError(f"GitHub recorded {digest} for the uploaded {name}, not its sha256 {wheel.sha256}:"
                               " delete that asset and publish again")
        return asset.browser_download_url

    def _assets_by_name(self) -> dict:
        if self._assets is None:
            self._release = self._find_release()
            self._assets = {} if self._release is None else {
                a.name: a for a in self._call(lambda: list(self._release.get_assets()))}
        return self._assets

    def _find_release(self):
        from github import GithubException, UnknownObjectException

        try:
            return self.repo.get_release(self.dest.tag)
        except UnknownObjectException:
            # No release of the tag (or no such repository: creating the release will say so).
            return None
        except GithubException as exc:
            raise self._error(exc) from None

    def _create_release(self):
        self._release = self._call(lambda: self.repo.create_git_release(
            self.dest.tag, name=self.dest.tag, message="Wheels built and verified by imagegen."))
        return self._release

    def _download_sha256(self, asset) -> str:
        status, _, chunks = self._call(lambda: asset.download_asset(chunk_size=CHUNK))
        if status != 200:
            raise PublishError(f"{asset.name}: GitHub recorded no digest and the download answered HTTP {status}")
        h = hashlib.sha256()
        for chunk in chunks:
            h.update(chunk)
        return h.hexdigest()

    def _call(self, request):
        from github import GithubException

        try:
            return request()
        except GithubException as exc:
            raise self._error(exc) from None

    def _error(self, exc) -> PublishError:
        message = exc.data.get("message") if isinstance(exc.data, dict) else None
        if exc.status == 401:
            return self.give_up(f"GitHub refused GITHUB_TOKEN (HTTP 401 {message or 'Bad credentials'})")
        if exc.status in (403, 404):
            return self.give_up(f"GitHub answered HTTP {exc.status} ({message or 'no details'}): no repository"
                                f" {self.dest.repo}, or GITHUB_TOKEN may not write its releases (contents: write)")
        return PublishError(f"GitHub answered HTTP {exc.status} ({message or exc})")
