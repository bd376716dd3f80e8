"""The pages of a wheelhouse's static pip index (imagegen.publish.index writes them): what a wheel and a
listed file are to a page, and the PEP 503 HTML and PEP 691 JSON made from them. Every value that reaches
a page is percent-encoded (URLs, made when the wheel is read) and HTML-escaped here."""

from __future__ import annotations

import hashlib
import html
import json
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

METADATA_SUFFIX = ".metadata"  # PEP 658: the metadata file's URL is the wheel's with this appended
API_VERSION = "1.1"  # PEP 700: JSON project pages carry versions and each file's size


@dataclass(frozen=True)
class IndexedWheel:
    """A verified wheel as the index lists it."""

    path: Path
    url_path: str  # its path below OUT, percent-encoded
    project: str  # normalized (PEP 503)
    version: Version
    sha256: str
    size: int
    requires_python: str | None
    metadata: bytes  # its METADATA, served as <wheel>.metadata
    # Listed from the index it was published to (imagegen index --merge): neither it nor its metadata file
    # is here; the page gives the metadata file's sha256, when the served page did.
    served: bool = False
    served_metadata_sha256: str | None = None
    # Built for another torch and found reusable with this one (imagegen reuse: the manifest entry's
    # reused_from), as the pages say it: "built for torch 2.11, checked against torch 2.14.1".
    reused: str | None = None

    @property
    def metadata_path(self) -> Path:
        return self.path.with_name(self.path.name + METADATA_SUFFIX)

    @property
    def metadata_sha256(self) -> str | None:
        if self.served:
            return self.served_metadata_sha256
        return hashlib.sha256(self.metadata).hexdigest()


@dataclass(frozen=True)
class IndexedFile:
    """A file the index lists that is not a wheel: a version's variants.json."""

    path: Path
    url_path: str  # its path below OUT, percent-encoded
    project: str
    version: Version
    sha256: str
    size: int


def url(wheel: IndexedWheel | IndexedFile, prefix: str | None, up: str) -> str:
    """The file's URL from a page ``up`` folders below OUT (absolute with a base URL)."""
    return f"{prefix if prefix is not None else up}{wheel.url_path}"


def href(wheel: IndexedWheel | IndexedFile, prefix: str | None, up: str) -> str:
    """The file's link in an HTML page: its URL with the hash pip checks the download against."""
    return f"{url(wheel, prefix, up)}#sha256={wheel.sha256}"


def wheel_anchor(wheel: IndexedWheel, prefix: str | None, up: str) -> str:
    attributes = {}
    if wheel.requires_python is not None:
        attributes["data-requires-python"] = wheel.requires_python
    # PEP 714's name, and PEP 658's for the pip releases before it.
    if wheel.metadata_sha256 is not None:
        attributes["data-core-metadata"] = attributes["data-dist-info-metadata"] = f"sha256={wheel.metadata_sha256}"
    if wheel.reused is None:
        return anchor(href(wheel, prefix, up), wheel.path.name, attributes)
    # A reused wheel says so beside its link (pip reads the anchors only).
    attributes["data-imagegen-reused"] = wheel.reused
    return anchor(href(wheel, prefix, up), wheel.path.name, attributes) + f" (reused: {html.escape(wheel.reused)})"


def anchor(href: str, text: str, attributes: dict[str, str] | None = None) -> str:
    extra = "".join(f' {name}="{html.escape(value, quote=True)}"' for name, value in (attributes or {}).items())
    return f'<a href="{html.escape(href, quote=True)}"{extra}>{html.escape(text)}</a>'


def page(title: str, anchors: list[str]) -> bytes:
    title = html.escape(title)
    body = "".join(f"    {a}<br>\n" for a in anchors)
    return ("<!DOCTYPE html>\n<html>\n  <head>\n    <meta charset=\"utf-8\">\n"
            f"    <meta name=\"pypi:repository-version\" content=\"{API_VERSION}\">\n"
            f"    <title>{title}</title>\n  </head>\n  <body>\n    <h1>{title}</h1>\n{body}"
            "  </body>\n</html>\n").encode()


def listed(wheels: list[IndexedWheel], variant_wheels: list[IndexedWheel],
            variant_files: list[IndexedFile]) -> list[IndexedWheel | IndexedFile]:
    """What a page lists, in its order: by project, version and file name (a variant wheel beside its
    wheel, a version's variants.json after its wheels)."""
    return sorted([*wheels, *variant_wheels, *variant_files], key=lambda f: (f.project, f.version, f.path.name))


def file_anchor(file: IndexedWheel | IndexedFile, prefix: str | None, up: str) -> str:
    if isinstance(file, IndexedWheel):
        return wheel_anchor(file, prefix, up)
    return anchor(href(file, prefix, up), file.path.name)


def project_html(project: str, files: list[IndexedWheel], prefix: str | None,
                 variant_wheels: list[IndexedWheel] = (), variant_files: list[IndexedFile] = (),
                 up: str = "../../") -> bytes:
    shown_files = listed(files, list(variant_wheels), list(variant_files))
    return page(f"Links for {project}", [file_anchor(f, prefix, up) for f in shown_files])


def find_links_html(wheels: list[IndexedWheel], prefix: str | None, variant_wheels: list[IndexedWheel] = (),
                    variant_files: list[IndexedFile] = ()) -> bytes:
    shown_files = listed(wheels, list(variant_wheels), list(variant_files))
    return page("Wheels", [file_anchor(f, prefix, "") for f in shown_files])


def project_json(project: str, files: list[IndexedWheel], prefix: str | None,
                 variant_wheels: list[IndexedWheel] = (), variant_files: list[IndexedFile] = (),
                 up: str = "../../") -> bytes:
    entries = []
    for file in listed(files, list(variant_wheels), list(variant_files)):
        entry = {"filename": file.path.name, "url": url(file, prefix, up), "hashes": {"sha256": file.sha256},
                 "size": file.size}
        if isinstance(file, IndexedWheel):
            if file.metadata_sha256 is not None:
                entry["core-metadata"] = entry["dist-info-metadata"] = {"sha256": file.metadata_sha256}
            if file.requires_python is not None:
                entry["requires-python"] = file.requires_python
            if file.reused is not None:  # PEP 691: a key with a leading underscore is the index's own
                entry["_imagegen_reused"] = file.reused
        entries.append(entry)
    versions = sorted({w.version for w in files})
    return json_bytes({"meta": {"api-version": API_VERSION}, "name": project,
                       "versions": [str(v) for v in versions], "files": entries})


def json_bytes(document: dict) -> bytes:
    return (json.dumps(document, indent=2, sort_keys=True) + "\n").encode()
