"""A PyPI-compatible index as a publish destination (``pypi:UPLOAD_URL[,simple=INDEX_URL]``): twine
uploads, the index's PEP 503 page says what is there.

- What is there: ``INDEX_URL/<project>/`` (HTML, PEP 503), each file with its ``#<algo>=<hex>``
  fragment; the wheel's own bytes are hashed with that algorithm to compare (sha256 on PyPI and
  pypiserver). A file listed without a hash cannot be compared and is a failure, not a guess. A
  redirect to another host means the project is not on this index (pypiserver sends a project it does
  not have to pypi.org): it is not followed.
- Upload: twine's own repository class (twine.settings.Settings -> create_repository -> upload), one
  request per wheel, so each wheel has its own outcome. An index refuses a file name it already has
  (pypiserver 409, PyPI 400 "already exists"): the wheel is then checked again, and skipped or refused.
  twine's console output (rich) is kept off imagegen's stdout.
- Credentials: TWINE_USERNAME / TWINE_PASSWORD (TWINE_PASSWORD alone is a PyPI API token, user
  __token__), else the netrc entry of the upload host (NETRC, ~/.netrc); never twine's keyring,
  prompt or ~/.pypirc. They are sent to the index page only when it is on the upload URL's host.

Tried against a real pypiserver (tests/integration/test_publish.py: upload, pip install from it,
re-publish skipped, a changed wheel refused, a wrong password, its fallback redirect to pypi.org not
followed). Not tried against pypi.org or
test.pypi.org (no account or network here): their URLs, the 400 "already exists" answer and the
simple-page derivation follow twine's and PyPI's documentation.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
from html.parser import HTMLParser
from typing import Mapping
from urllib.parse import unquote, urljoin, urlsplit

from imagegen.errors import PublishError
from imagegen.publish.upload import Destination, Found, PypiDest, missing_library
from imagegen.wheelhouse.manifest import VerifiedWheel

TIMEOUT_S = 60
MAX_INDEX_PAGE = 64 << 20  # a project page of more than this is not read
MAX_REDIRECTS = 5


def connect(dest: PypiDest, env: Mapping[str, str], *, write: bool) -> PypiIndex:
    try:
        import requests  # twine's HTTP library; its session carries twine's user agent and retries
        from twine.settings import Settings
        from twine.utils import make_requests_session
    except ImportError:
        raise missing_library("twine") from None
    username, password, secrets = credentials(dest.upload_url, env)
    host = urlsplit(dest.upload_url).hostname
    if write and not (username and password):
        raise PublishError(f"no credentials for {host}: set TWINE_USERNAME and TWINE_PASSWORD (for a PyPI API token"
                           f" TWINE_PASSWORD alone), or add a netrc entry for {host}")
    repository = None
    if write:
        try:
            settings = Settings(repository_url=dest.upload_url, username=username, password=password,
                                non_interactive=True, disable_progress_bar=True)
            repository = settings.create_repository()
        except Exception as exc:  # twine's configuration errors (TwineException and its kinds)
            raise PublishError(f"twine refused {dest.upload_url}: {exc}") from None
    # The index page is read with a session of its own: the repository's carries the upload credentials,
    # which go to the page only when it is on the upload URL's host.
    same_origin = _origin(dest.simple_url) == _origin(dest.upload_url)
    return PypiIndex(dest, make_requests_session(), (username, password) if same_origin and username and password
                     else None, repository, requests.RequestException, secrets)


def credentials(upload_url: str, env: Mapping[str, str]) -> tuple[str | None, str | None, tuple[str, ...]]:
    """(username, password, secrets found outside the environment) for the upload host."""
    password = env.get("TWINE_PASSWORD") or None
    if password:
        return env.get("TWINE_USERNAME") or "__token__", password, ()
    from requests.utils import get_netrc_auth

    found = get_netrc_auth(upload_url)
    if found and found[0] and found[1]:
        return found[0], found[1], (found[1],)
    return None, None, ()


class PypiIndex(Destination):
    def __init__(self, dest: PypiDest, session, auth: tuple[str, str] | None, repository, request_error: type,
                 secrets: tuple[str, ...]) -> None:
        self.dest = dest
        self.session = session
        self.auth = auth
        self.repository = repository  # twine's, when uploading
        self.request_error = request_error
        self.secrets = secrets

    def find(self, wheel: VerifiedWheel) -> Found | None:
        url = f"{self.dest.simple_url}{_project(wheel)}/"
        page = self._page(url, _project(wheel))
        if page is None:
            return None
        files = index_files(page)
        if wheel.path.name not in files:
            return None
        listed = files[wheel.path.name]
        if listed is None:
            raise PublishError(f"{url} lists {wheel.path.name} without a hash: cannot tell whether it is this wheel")
        algo, remote = listed
        local = wheel.sha256 if algo == "sha256" else _file_hash(wheel, algo)
        return Found(f"{algo}:{remote}", remote.lower() == local)

    def _page(self, url: str, project: str) -> str | None:
        """The project's index page, or None when the index has no such project. A redirect is followed on
        the index's own host only: pypiserver sends a project it does not have to its fallback index
        (pypi.org), whose files are not on this one."""
        for _ in range(MAX_REDIRECTS + 1):
            try:
                with self.session.get(url, headers={"Accept": "text/html"}, auth=self.auth, timeout=TIMEOUT_S,
                                      stream=True, allow_redirects=False) as resp:
                    if resp.is_redirect:
                        target = urljoin(url, resp.headers["location"])
                        if _origin(target) != _origin(url):
                            return None
                        url = target
                        continue
                    if resp.status_code == 404:
                        return None  # no such project yet
                    if resp.status_code in (401, 403):
                        raise self.give_up(f"{url} refused to list {project} (HTTP {resp.status_code}): check"
                                           " TWINE_USERNAME and TWINE_PASSWORD (or the netrc entry)")
                    if resp.status_code != 200:
                        raise PublishError(f"{url} answered HTTP {resp.status_code} {resp.reason}")
                    page = resp.raw.read(MAX_INDEX_PAGE + 1, decode_content=True)
                    encoding = resp.encoding or "utf-8"
            except self.request_error as exc:
                raise self.give_up(f"{url} cannot be read: {exc}") from None
            if len(page) > MAX_INDEX_PAGE:
                raise PublishError(f"{url} is over {MAX_INDEX_PAGE >> 20} MiB: not read")
            return page.decode(encoding, "replace")
        raise PublishError(f"{url}: more than {MAX_REDIRECTS} redirects")

    def upload(self, wheel: VerifiedWheel) -> str | None:
        from twine.package import PackageFile

        url = self.dest.upload_url
        try:
            package = PackageFile.from_filename(str(wheel.path), None)
            with contextlib.redirect_stdout(io.StringIO()):  # twine's "Uploading ..." lines: the report says it
                resp = self.repository.upload(package)
        except self.request_error as exc:
            raise self.give_up(f"{url} cannot be reached: {exc}") from None
        except Exception as exc:  # twine's own (InvalidDistribution, ...)
            raise PublishError(f"twine: {exc}") from None
        reason = f"HTTP {resp.status_code} {resp.reason}".strip()
        if resp.is_redirect:
            raise self.give_up(f"{url} redirected the upload to {resp.headers.get('location')}: give the URL it"
                               " redirects to")
        already = "already exist" in f"{resp.reason} {resp.text}".lower()
        if resp.status_code == 409 or (resp.status_code == 400 and already):
            return None  # a file of that name is there now
        if resp.status_code in (401, 403):
            raise self.give_up(f"{url} refused the credentials ({reason}): check TWINE_USERNAME and TWINE_PASSWORD"
                               " (or the netrc entry)")
        if not 200 <= resp.status_code < 300:
            raise PublishError(f"{url} refused it ({reason})")
        return f"{self.dest.simple_url}{_project(wheel)}/"


def _project(wheel: VerifiedWheel) -> str:
    from packaging.utils import canonicalize_name, parse_wheel_filename

    return canonicalize_name(parse_wheel_filename(wheel.path.name)[0])


def _origin(url: str) -> tuple:
    parts = urlsplit(url)
    return parts.scheme, parts.hostname, parts.port


def _file_hash(wheel: VerifiedWheel, algo: str) -> str:
    try:
        h = hashlib.new(algo)
    except ValueError:
        raise PublishError(f"the index gives a {algo} hash of {wheel.path.name}, which this Python cannot"
                           " compute") from None
    with wheel.path.open("rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


class _Links(HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.hrefs: list[str] = []

    def handle_starttag(self, tag: str, attrs: list) -> None:
        if tag == "a":
            self.hrefs += [value for name, value in attrs if name == "href" and value]


def index_files(page: str) -> dict[str, tuple[str, str] | None]:
    """A PEP 503 project page's files: file name -> (hash algorithm, hex) from the link's fragment,
    or None for a link without one."""
    parser = _Links()
    parser.feed(page)
    files: dict[str, tuple[str, str] | None] = {}
    for href in parser.hrefs:
        parts = urlsplit(href)
        name = unquote(parts.path.rsplit("/", 1)[-1])
        algo, sep, value = parts.fragment.partition("=")
        files[name] = (algo.lower(), value) if sep and algo and value else None
    return files
