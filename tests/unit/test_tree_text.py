"""What the tracked tree says to a reader who is not one of its developers.

- No tracked file names a development machine's own paths: the clone's folder (``/work/...``), a home
  folder (``/home/NAME/``, ``/Users/NAME``) or ``/root/work``. Records use placeholders (``$CLONE``,
  ``$MIRRORS``). Paths inside a container or an image (``/root/.cache/pip``, ``/opt/...``, ``/out``) and
  temporary folders (``/tmp/...``) are no one's machine and stay.
- Shipped text (imagegen/: help, messages, comments, docstrings, resources) and the manual (README.md,
  docs/ outside docs/records/) name the user workflows ("a team's flash-attn matrix", "a Colab user's
  fork"), never the project's internal names for them or for its own work: seed numbers, issue
  numbers, item numbers, numbered sessions.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# A path that starts here (not inside a relative path such as .src/frontier/work/, not "$dir"/work/).
_START = r"(?<![\w./~@$*}-])(?<!\w\")"
MACHINE_PATH = re.compile(_START + r"(?:/work/|/Users/[A-Za-z]|/home/[a-z][a-z0-9_-]+/|/root/work\b)")

INTERNAL_NAME = re.compile(r"(?i)\bseeds?\b|\bissues?\s+#?\d+|\bsessions?\s+\d+|\bitems?\s+\d+\b")



def tracked(*pathspecs: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z", "--", *pathspecs], cwd=ROOT, capture_output=True, check=True)
    return [ROOT / p for p in out.stdout.decode().split("\0") if p]


def text_of(path: Path) -> str | None:
    try:
        data = path.read_bytes()
    except (FileNotFoundError, IsADirectoryError):  # deleted in the work tree, a submodule
        return None
    if b"\0" in data[:8192]:
        return None  # binary
    return data.decode("utf-8", "replace")


def hits(pattern: re.Pattern[str], paths: list[Path], skip: set[str] = frozenset()) -> list[str]:
    found = []
    for path in paths:
        rel = path.relative_to(ROOT).as_posix()
        text = None if rel in skip else text_of(path)
        for m in pattern.finditer(text or ""):
            line = text.count("\n", 0, m.start()) + 1
            found.append(f"{rel}:{line}: {m.group(0)!r}")
    return found


def test_no_tracked_file_names_a_development_machines_path():
    paths = tracked()
    assert len(paths) > 500, "git ls-files found too few files: is this a clone?"
    found = hits(MACHINE_PATH, paths, skip={"tests/unit/test_tree_text.py"})  # its own examples below
    assert not found, "development machines' paths (use $CLONE, $MIRRORS or a relative path):\n" + "\n".join(found)


def test_shipped_text_and_the_manual_name_workflows_not_internal_names():
    paths = tracked("imagegen", "README.md", "docs", ":!docs/records")
    assert any(p.name == "cli.py" for p in paths)
    found = hits(INTERNAL_NAME, paths)
    assert not found, ("internal names in shipped text or the manual: name the workflow instead (\"a team's"
                       " flash-attn matrix\", \"a Colab user's fork\"):\n" + "\n".join(found))


@pytest.mark.parametrize("text", [
    "see /work/main/.venv/bin/python", '"log": "/work/.mirror/x"', "cd /home/alice/src", "/Users/bob/x",
    "PYTHONPATH=/work/main:/tmp/site", "-v /root/work:/w",
])
def test_machine_paths_are_found(text):
    assert MACHINE_PATH.search(text), text


@pytest.mark.parametrize("text", [
    "--work .src/frontier/work/x", 'cp "$dir"/work/logs/a', "match=r'.*/work/dist'", "/root/.cache/pip",
    "/opt/imagegen", "/tmp/imagegen-work-1234/x", "@C@/home/lib", "/home/u/lib",
])
def test_container_and_relative_paths_are_not(text):
    assert not MACHINE_PATH.search(text), text


@pytest.mark.parametrize("text", ["seed 004's list", "Seeds 001 and 002", "(issue 32, item 4)", "Issue #1549",
                                  "session 7", "the seed document"])
def test_internal_names_are_found(text):
    assert INTERNAL_NAME.search(text), text


@pytest.mark.parametrize("text", ["torch.manual_seed(0)", "a session of its own", "requests.Session()",
                                  "github.com/Dao-AILab/flash-attention/issues/1549", "an RTX 5090 user's builder"])
def test_ordinary_words_are_not(text):
    assert not INTERNAL_NAME.search(text), text
