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

ROOT = Path(__file__).resolve().parents[2]
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


def _package_modules():
    import importlib
    import pkgutil

    import imagegen
    for info in pkgutil.walk_packages(imagegen.__path__, "imagegen."):
        if ".shipped." not in info.name and not info.name.endswith("__main__"):  # scripts, not modules
            yield importlib.import_module(info.name)


def test_every_error_type_lives_in_errors_py_with_its_exit_code() -> None:
    import inspect

    from imagegen import errors
    for module in _package_modules():
        for name, obj in vars(module).items():
            if inspect.isclass(obj) and issubclass(obj, BaseException) and obj.__module__ == module.__name__:
                # yamlio's loader signal must derive from PyYAML's error type; it never leaves yamlio.
                assert module is errors or module.__name__ == "imagegen.yamlio", f"{module.__name__}.{name}"
    table = {}
    for line in (ROOT / "README.md").read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0].splitlines():
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 3 and cells[0].isdigit():
            for name in cells[1].split(", "):
                table[name] = int(cells[0])
    defined = {name: obj.exit_code for name, obj in vars(errors).items()
               if isinstance(obj, type) and issubclass(obj, errors.ImagegenError)}
    assert table == defined, "README's exit-code table and imagegen/errors.py differ"
