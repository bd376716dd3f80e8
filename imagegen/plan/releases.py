"""`imagegen refresh`'s second half: which catalogue packages have a release on the index that is newer
than the newest release the catalogue pins (flash-attn 2.8.3.post2 reached PyPI weeks before the catalogue
pinned it). A newer one is said with what a pin needs: its sdist's file name and sha256.

The index is untrusted. Its pages come through refresh.project_files (PEP 691 JSON, bounded, within one
deadline). Of each file only a name of the form ``<project>-<PEP 440 version>.tar.gz`` (or ``.zip``) and a
sha256 of 64 hex digits are taken, and the message shows only those: never a URL (a mirror's URL can carry
a credential). Nothing is written: the catalogue is imagegen's data, and a user's own pin goes into a
recipe folder of theirs (--recipe-dir).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from packaging.utils import canonicalize_name
from packaging.version import Version

from imagegen import untrusted
from imagegen.model.catalogue import Catalogue
from imagegen.model.recipe_facts import pep440
from imagegen.model.recipes import Recipe
from imagegen.plan import refresh

SDIST = re.compile(r"(?P<name>[A-Za-z0-9][A-Za-z0-9._-]{0,99}?)-(?P<version>[0-9][A-Za-z0-9.+!_]{0,63})"
                   r"\.(?:tar\.gz|zip)")
SHA256 = re.compile(r"[0-9a-f]{64}")


@dataclass(frozen=True)
class NewRelease:
    recipe: str
    version: Version  # the newest release on the index
    pinned: Version  # the newest release the recipe pins
    filename: str
    sha256: str

    def line(self) -> str:
        return (f"{self.recipe}: {self.version} is on the index, newer than the newest release the catalogue pins"
                f" ({self.pinned}): pin its sdist {self.filename} (sha256 {self.sha256}) in a recipe of your own"
                " (--recipe-dir), or update imagegen")


def newest_pin(recipe: Recipe) -> Version | None:
    """The newest release among the recipe's pins: a development or pre-release pin (main, 2.8.4.dev0) is
    not a release, so it hides no newer one (packaging counts a dev release as a pre-release)."""
    said = (pep440(v.source_version or label) for label, v in recipe.versions.items())
    return max((v for v in said if v is not None and not v.is_prerelease), default=None)


def newest_sdist(files: list[dict], project: str) -> tuple[Version, str, str] | None:
    """(version, file name, sha256) of the newest release with an sdist among a PEP 691 page's ``files``;
    yanked files, pre-releases, other projects' names and files without a well-formed sha256 are passed over."""
    best = None
    for f in files:
        m = SDIST.fullmatch(f["filename"])
        hashes = f.get("hashes")
        sha = hashes.get("sha256") if isinstance(hashes, dict) else None
        if not m or f.get("yanked") or canonicalize_name(m["name"]) != project or not isinstance(sha, str) \
                or not SHA256.fullmatch(sha):
            continue
        version = pep440(m["version"])
        if version is None or version.is_prerelease:  # a dev release too
            continue
        if best is None or version > best[0]:
            best = (version, m.group(0), sha)
    return best


def newer_releases(index: str, catalogue: Catalogue, deadline: untrusted.Deadline | None = None) -> list[NewRelease]:
    """Each git recipe whose distribution has a newer release on ``index`` than its newest pin. A project
    the index does not have (Block-Sparse-Attention, FA3) is passed over."""
    deadline = deadline or untrusted.Deadline(refresh.deadline_seconds())
    out = []
    for name in catalogue.names():
        recipe = catalogue.get(name)
        pinned = newest_pin(recipe)
        if recipe.source_kind != "git" or pinned is None:
            continue
        project = canonicalize_name(recipe.distribution)
        found = newest_sdist(refresh.project_files(index, project, deadline, absent_ok=True), project)
        if found is not None and found[0] > pinned:
            out.append(NewRelease(recipe.name, found[0], pinned, found[1], found[2]))
    return out


def run(index: str | None, catalogue: Catalogue, deadline: untrusted.Deadline | None = None) -> int:
    """Say each newer release, or that the pins are current. The index was validated by refresh.run;
    ``deadline``: the one the tables' half of the refresh used, so that both share it."""
    news = newer_releases(index or refresh.PYPI, catalogue, deadline)
    for release in news:
        print(release.line())
    if not news:
        print("the catalogue pins the newest release the index has of each of its packages")
    return 0
