"""Publish destinations as ``imagegen publish --to`` names them, parsed and checked: the one grammar of
a destination, which ``ci github --publish`` also checks the destinations it writes into a workflow
with (so a workflow never carries one the publish job would refuse), before anything is contacted.

- ``pypi:UPLOAD_URL[,simple=INDEX_URL]``: a PyPI-compatible legacy upload endpoint;
- ``hf:OWNER/REPO[@REVISION][:PATH]``: a Hugging Face Hub model repository;
- ``github:OWNER/REPO@TAG``: the assets of a GitHub release;
- ``s3://BUCKET[/PREFIX][,layout=wheelhouse]``: objects under PREFIX; flat (``PREFIX/<wheel>``, the default,
  ``layout=flat``), or ``layout=wheelhouse``: the wheelhouse as it is served, each wheel at its path in the
  wheelhouse (``PREFIX/<pkg>-<ver>/torch<X.Y>/cu<XYZ>/<wheel>``) and, once they all are, the index `imagegen
  index` wrote (pages, metadata files) and each cell folder's manifest, so that the bucket served over HTTP
  is a pip index (and ``ci github --skip-published`` reads its manifests).

Every part reaches a URL, so each is matched against a strict pattern; a malformed one is a UsageError
(exit 2). imagegen.publish.upload says what each destination does with a wheel.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from imagegen.errors import UsageError
from imagegen.safety import describe

_HOST = r"[A-Za-z0-9](?:[A-Za-z0-9.-]{0,251}[A-Za-z0-9])?"
# http(s), host, port and path only: no user:password@ (credentials never come from the command line),
# no query or fragment. A '..' anywhere is refused by the patterns' common look-ahead.
_HTTP_URL = rf"https?://{_HOST}(?::[0-9]{{1,5}})?(?:/[A-Za-z0-9._~%+-]*)*"
PYPI = re.compile(rf"pypi:(?!.*\.\.)(?P<upload>{_HTTP_URL})(?:,simple=(?P<simple>{_HTTP_URL}))?")
# Hub repository names: letters, digits, '.', '_', '-', no '--' or '..', at most 96 characters.
_HUB_NAME = r"[A-Za-z0-9](?:[A-Za-z0-9._-]{0,94}[A-Za-z0-9])?"
_REPO_PATH = r"[A-Za-z0-9._+-]+(?:/[A-Za-z0-9._+-]+)*"
HUB = re.compile(rf"hf:(?!.*(?:--|\.\.))(?P<repo>{_HUB_NAME}/{_HUB_NAME})"
                 rf"(?:@(?P<revision>[A-Za-z0-9][A-Za-z0-9._/-]{{0,199}}))?(?::(?P<path>{_REPO_PATH})/?)?")
GITHUB = re.compile(r"github:(?!.*\.\.)(?P<repo>[A-Za-z0-9](?:[A-Za-z0-9-]{0,38})/[A-Za-z0-9._-]{1,100})"
                    r"@(?P<tag>[A-Za-z0-9][A-Za-z0-9._+-]{0,127})")
S3 = re.compile(r"s3://(?!.*\.\.)(?P<bucket>[a-z0-9][a-z0-9.-]{1,61}[a-z0-9])(?:/(?P<prefix>[A-Za-z0-9._+=-]+"
                r"(?:/[A-Za-z0-9._+=-]+)*)?/?)?(?:,layout=(?P<layout>flat|wheelhouse))?")
FLAT, WHEELHOUSE = "flat", "wheelhouse"

FORMS = {"pypi:": ("pypi:UPLOAD_URL[,simple=INDEX_URL]", PYPI), "hf:": ("hf:OWNER/REPO[@REVISION][:PATH]", HUB),
         "github:": ("github:OWNER/REPO@TAG", GITHUB), "s3://": ("s3://BUCKET[/PREFIX][,layout=wheelhouse]", S3)}

PYPI_SIMPLE = {"https://upload.pypi.org/legacy/": "https://pypi.org/simple/",
               "https://test.pypi.org/legacy/": "https://test.pypi.org/simple/"}


@dataclass(frozen=True)
class PypiDest:
    text: str
    upload_url: str
    simple_url: str  # ends with '/': the project page is simple_url + "<normalized name>/"


@dataclass(frozen=True)
class HubDest:
    text: str
    repo_id: str
    revision: str
    path: str  # folder in the repository, "" for its top

    def path_in_repo(self, name: str) -> str:
        return f"{self.path}/{name}" if self.path else name


@dataclass(frozen=True)
class GithubDest:
    text: str
    repo: str  # OWNER/REPO
    tag: str


@dataclass(frozen=True)
class S3Dest:
    text: str
    bucket: str
    prefix: str  # "" or ending with '/'
    layout: str = FLAT  # FLAT: PREFIX/<wheel>; WHEELHOUSE: PREFIX/<path in the wheelhouse>, with its index

    def key(self, name: str) -> str:
        """The object key of ``name``: a wheel's file name (flat), or a path below the wheelhouse."""
        return self.prefix + name

    @property
    def wheelhouse(self) -> bool:
        return self.layout == WHEELHOUSE


Dest = PypiDest | HubDest | GithubDest | S3Dest


def parse_destination(text: str, flag: str = "--to") -> Dest:
    """``text`` (``publish --to``, ``ci github --publish``: ``flag``) as a destination, every part
    checked; anything else is a one-line UsageError."""
    form = next((f for prefix, f in FORMS.items() if isinstance(text, str) and text.startswith(prefix)), None)
    if form is None:
        raise UsageError(f"{flag} {describe(text)}: not a destination: use {', '.join(f for f, _ in FORMS.values())}")
    match = form[1].fullmatch(text)
    if match is None:
        raise UsageError(f"{flag} {describe(text)}: expected {form[0]} (names of letters, digits, '.', '_', '-'; URLs"
                         " with no user:password@, query, spaces or '..')")
    if form[1] is PYPI:
        upload = match["upload"]
        simple = match["simple"] or PYPI_SIMPLE.get(_slash(upload)) or default_simple(upload)
        return PypiDest(text, upload, _slash(simple))
    if form[1] is HUB:
        return HubDest(text, match["repo"], match["revision"] or "main", match["path"] or "")
    if form[1] is GITHUB:
        return GithubDest(text, match["repo"], match["tag"])
    return S3Dest(text, match["bucket"], _slash(match["prefix"]) if match["prefix"] else "", match["layout"] or FLAT)


def default_simple(upload_url: str) -> str:
    """The PEP 503 index beside an upload URL: ``.../legacy/`` -> ``.../simple/``, else ``<url>/simple/``."""
    base = _slash(upload_url)
    return base[: -len("legacy/")] + "simple/" if base.endswith("/legacy/") else base + "simple/"


def _slash(url: str) -> str:
    return url if url.endswith("/") else url + "/"
