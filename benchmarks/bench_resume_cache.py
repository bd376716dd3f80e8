#!/usr/bin/env python3
"""Issue 36 items 1 and 2, measured on the Docker engine: what a stopped-and-resumed build and a shared
compile cache save, on tests/fixtures/resumable_kernel (eight C++ sources of ~2.5 s each, a module and a
kernel; --max-jobs 1), with sources of their own per run (a fresh seed: no layer, state or cached object
of an earlier run is reused; the torch layer is).

    PYTHONPATH=. python benchmarks/bench_resume_cache.py OUT.json   (root, a running engine, redis-server)

1. cold: one `imagegen build`, the compile step's seconds (the build record's duration).
2. stopped at --budget 16s, then the same build again: both compile steps' seconds, and the steps ninja
   ran in the second (the build log's "resumed build: N step(s) run now, M done").
3. --compile-cache redis://... (Debian's redis-server on the engine's bridge): one build filling it, then
   the same sources (a new inputs hash) on a cold local ccache (another mount id, a second machine): the
   second's compile seconds and ccache's hits/remote hits.
"""
from __future__ import annotations

import json
import os
import random
import re
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
RESEED = REPO / "tests" / "fixtures" / "reseed_resumable_kernel.py"
BASE = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "9.0", "--flavor", "pypi",
        "--base-image", BASE, "--max-jobs", "1"]


def fresh(tmp: Path, name: str) -> Path:
    """The fixture reseeded (tests/fixtures/reseed_resumable_kernel.py, the engine tests' own preparation)."""
    proc = subprocess.run([sys.executable, str(RESEED), str(tmp / name), str(random.randrange(10**6, 10**7))],
                          capture_output=True, text=True, check=True)
    return Path(proc.stdout.strip())


def build(tree: Path, root: Path, *extra: str, env: dict | None = None) -> tuple[int, dict, str, float]:
    root.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    p = subprocess.run([sys.executable, "-m", "imagegen", "build", "--source", str(tree), *CELL, "--out", str(root / "out"),
                        "--work", str(root / "work"), "--json", *extra], cwd=root, capture_output=True, text=True,
                       env=dict(os.environ, PYTHONPATH=str(REPO), **(env or {})))
    wall = time.monotonic() - t0
    row = json.loads(p.stdout)[0] if p.stdout.strip().startswith("[") else {}
    return p.returncode, row, p.stderr, wall


def compile_seconds(root: Path) -> float | None:
    """The compile step's own seconds (pip wheel in the image), from the manifest's entry of the cell."""
    for manifest in root.glob("out/**/manifest.json"):
        for entry in json.loads(manifest.read_text()).get("cells", {}).values():
            record = entry.get("record") or {}
            return entry.get("duration_s") or record.get("duration_s") or entry.get("seconds")
    return None


def main(out: str) -> None:
    tmp = Path(tempfile.mkdtemp(prefix="bench-resume-"))
    result: dict = {"base_image": BASE, "fixture": "tests/fixtures/resumable_kernel", "max_jobs": 1}
    # 1. cold
    tree = fresh(tmp, "cold")
    rc, row, err, wall = build(tree, tmp / "cold")
    assert rc == 0, err[-2000:]
    result["cold"] = {"compile_s": compile_seconds(tmp / "cold"), "cell_s": row.get("seconds"), "wall_s": round(wall, 1),
                      "ccache": row.get("ccache")}
    # 2. stopped, then resumed
    tree = fresh(tmp, "resume")
    rc, row, err, wall1 = build(tree, tmp / "resume", "--budget", "16s")
    assert rc == 5 and "budget of 16 s is spent" in (row.get("error") or ""), err[-2000:]
    rc, row, err, wall2 = build(tree, tmp / "resume")
    assert rc == 0, err[-2000:]
    log = Path(row["log"]).read_text(errors="replace")
    m = re.search(r"resumed build: (\d+) step\(s\) run now, (\d+) done by the stopped build", log)
    result["resume"] = {"stopped_wall_s": round(wall1, 1), "resumed_compile_s": compile_seconds(tmp / "resume"),
                        "resumed_cell_s": row.get("seconds"),
                        "resumed_wall_s": round(wall2, 1), "steps_run_when_resumed": int(m.group(1)),
                        "steps_done_before": int(m.group(2))}
    # 3. the shared compile cache
    host = subprocess.run(["docker", "network", "inspect", "bridge", "--format",
                           "{{range .IPAM.Config}}{{.Gateway}}{{end}}"], capture_output=True, text=True).stdout.strip()
    with socket.socket() as s:
        s.bind((host, 0))
        port = s.getsockname()[1]
    password = secrets.token_hex(16)
    server = subprocess.Popen(["redis-server", "--port", str(port), "--bind", host, "--requirepass", password,
                               "--save", "", "--appendonly", "no", "--dir", str(tmp)], stdout=subprocess.DEVNULL)
    try:
        time.sleep(1)
        env = {"IMAGEGEN_COMPILE_CACHE": f"redis://{password}@{host}:{port}"}
        tree = fresh(tmp, "cache")
        rc, row1, err, _ = build(tree, tmp / "cache1", env=env)
        assert rc == 0, err[-2000:]
        (tree / "resumable_kernel" / "__init__.py").write_text("# a second machine\n")
        shim = tmp / "shim"
        shim.mkdir()
        (shim / "docker").write_text(
            f"#!{sys.executable}\nimport os, sys\nargs = sys.argv[1:]\nif args[:2] == ['buildx', 'bake']:\n"
            f"    args = args[:2] + ['--set', '*.args.IMAGEGEN_CCACHE_ID=imagegen-ccache-cold-{password[:8]}'] + args[2:]\n"
            f"os.execv({shutil.which('docker')!r}, ['docker'] + args)\n")
        (shim / "docker").chmod(0o755)
        rc, row2, err, _ = build(tree, tmp / "cache2", env=dict(env, PATH=f"{shim}:{os.environ['PATH']}"))
        assert rc == 0, err[-2000:]
        result["compile_cache"] = {"first": {"compile_s": compile_seconds(tmp / "cache1"), "cell_s": row1.get("seconds"),
                                             "ccache": row1.get("ccache")},
                                   "second_clean_machine": {"compile_s": compile_seconds(tmp / "cache2"),
                                                            "cell_s": row2.get("seconds"), "ccache": row2.get("ccache")}}
    finally:
        server.terminate()
        server.wait(timeout=20)
    Path(out).write_text(json.dumps(result, indent=2) + "\n")
    print(json.dumps(result, indent=2))
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main(sys.argv[1])
