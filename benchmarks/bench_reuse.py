"""Reuse before rebuilding: `imagegen reuse` over real wheels and real torch releases, as a matrix.

Each extension wheel (built for one torch) is checked against each torch release's libraries, with the
torch it was built for as --built-with; with --venvs, also imported with that torch (an environment per
release). Prints a Markdown table (benchmarks/RESULTS.md, "Reuse before rebuilding") and, with --json,
every result.

The torch wheels are half a GB each: they are kept in a cache outside the repository, never committed.
Filling it (cp311, x86_64; 2.15.0 is cu132 on PyPI):

    mkdir -p /var/cache/imagegen-tests/torch-wheels && cd /var/cache/imagegen-tests/torch-wheels
    for v in 2.11.0 2.12.1 2.13.0 2.14.1 2.15.0; do
      python3 -m pip download --no-deps --only-binary=:all: --python-version 3.11 --implementation cp \\
        --platform manylinux_2_28_x86_64 -d . "torch==$v"; done
    # unpack only the libraries (and version.py) the check reads:
    for w in torch-*.whl; do v=$(echo $w | cut -d- -f2); mkdir -p ../torch-libs/$v
      unzip -q -o $w 'torch/lib/*.so*' torch/version.py -d ../torch-libs/$v; done

Run: python benchmarks/bench_reuse.py --libs /var/cache/imagegen-tests/torch-libs \\
        --built-with 2.11.0 WHEEL... [--venvs /var/cache/imagegen-tests/venvs] [--json out.json]
(--venvs: a folder of venvs named torch<version>, e.g. made with `uv venv` and `uv pip install torch==<version>`.)
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from imagegen.errors import ImagegenError  # noqa: E402
from imagegen.finish.reuse import check_reuse  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("wheels", nargs="+", type=Path)
    ap.add_argument("--libs", type=Path, required=True, help="a folder with one unpacked torch per release")
    ap.add_argument("--built-with", action="append", default=[], metavar="WHEEL=VERSION or VERSION",
                    help="the torch release a wheel was built for (VERSION alone: every wheel)")
    ap.add_argument("--venvs", type=Path, help="a folder of venvs torch<version> to import with")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    releases = sorted((p for p in args.libs.iterdir() if (p / "torch" / "lib" / "libc10.so").is_file()),
                      key=lambda p: [int(x) if x.isdigit() else x for x in p.name.replace("+", ".").split(".")])
    built: dict[str, str] = {}
    for value in args.built_with:
        name, _, version = value.rpartition("=")
        built[name or "*"] = version
    rows, results = [], []
    for wheel in args.wheels:
        source = built.get(wheel.name, built.get("*"))
        for release in releases:
            venv = args.venvs / f"torch{release.name}" / "bin" / "python" if args.venvs else None
            t0 = time.monotonic()
            try:
                res = check_reuse(wheel, torch=None, torch_wheel=None if venv and venv.exists() else release,
                                  python_exe=str(venv) if venv and venv.exists() else None,
                                  source_torch=args.libs / source if source else None)
            except ImagegenError as exc:
                rows.append(f"| {wheel.name} | {release.name} | error | {exc} |")
                continue
            seconds = time.monotonic() - t0
            missing = [m for e in res.extensions for m in e.missing]
            lacking = sorted({lib for e in res.extensions for lib in e.lacking_libraries})
            why = []
            if missing:
                why.append(f"{len(missing)} missing: " + ", ".join(sorted({m.demangled.split("(")[0] for m in missing})))
            if lacking:
                why.append("lacks " + ", ".join(lacking))
            if res.import_status == "failed":
                why.append("import: " + res.import_note.split("failed: ", 1)[-1][:140])
            why += [p for p in res.problems if p.startswith("its METADATA")]
            verdict = "reusable" if res.reusable else "NOT reusable"
            rows.append(f"| {wheel.name} | {res.target} | {verdict} | symbols {res.symbols}, import {res.import_status}"
                        f"{'; ' + '; '.join(why) if why else ''} | {seconds:.1f} s |")
            results.append(res.as_dict())
    print("| wheel | checked against | verdict | why | time |")
    print("|---|---|---|---|---|")
    print("\n".join(rows))
    if args.json:
        args.json.write_text(json.dumps(results, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
