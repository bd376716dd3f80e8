"""Static checks of imagegen's own Python: pyflakes over the package, its scripts, benchmarks and tests.

Several code paths (bake builds, push/pull) run only in the integration suite; an undefined name
there would pass the unit tests and fail minutes into CI (it happened: a helper extracted from
`execute.build` left `ca` undefined at its call sites). pyflakes comes from the test extras; a missing
tool fails the test, it is not a skip.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
CHECKED = ("imagegen", "scripts", "benchmarks", "tests")


def test_pyflakes_finds_nothing() -> None:
    proc = subprocess.run([sys.executable, "-m", "pyflakes", *CHECKED], cwd=ROOT, capture_output=True, text=True)
    assert "No module named pyflakes" not in proc.stderr, "pyflakes is missing: pip install -e '.[test]'"
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_pyflakes_would_catch_an_undefined_name(tmp_path: Path) -> None:
    # The check above is only worth something if pyflakes reports what broke CI once.
    bad = tmp_path / "bad.py"
    bad.write_text("def build(run_dir):\n    return run_dir, ca\n")
    proc = subprocess.run([sys.executable, "-m", "pyflakes", str(bad)], capture_output=True, text=True)
    assert proc.returncode != 0 and "undefined name 'ca'" in proc.stdout, proc.stdout + proc.stderr
