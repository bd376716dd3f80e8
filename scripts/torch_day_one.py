#!/usr/bin/env python3
"""A torch came out today: from its release to verified wheels of the catalogue, one timed run.

    scripts/torch_day_one.py TORCH [--arch 9.0] [--recipes sage,causal-conv1d] [--out wheelhouse]
        [--work DIR] [--record runbook.jsonl] [--steps refresh,plan,audit,build,verify,check,index]
        [--native --python-exe VENV/bin/python] [--with RECIPE=ARGS ...]
        [-- EXTRA imagegen ARGS for plan/audit/build, e.g. --flavor pypi --base-image IMAGE --fetch sdist]

The steps, each an imagegen command run as a user would run it, in this order:
  refresh  add the new torch series to imagegen's tables from PyPI (imagegen refresh)
  plan     the catalogue at that torch: which cells build and why not (imagegen plan --json)
  audit    each buildable cell's own build with stand-in compilers (imagegen plan --audit)
  build    each audited cell compiled, verified and smoke-imported (imagegen build)
  verify   each wheel's SASS/PTX against the list (imagegen verify)
  check    the recipe's numerical GPU check (imagegen check), where this machine has a GPU
  index    a pip index of the verified wheels (imagegen index)
A cell that fails a step keeps the others going (its later steps are skipped, saying why). Each step's
wall and CPU seconds (the imagegen process and its children) go to --record as one JSON line, and the
end prints a table per recipe with what a 16-core host and a farm of hosted runners would take for the
builds, from each recipe's measured build cost (imagegen.model.build_cost), so "release to verified
wheels" is a number. Exit 0 when every planned cell reached its last step, else 1.
"""
from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

STEPS = ("refresh", "plan", "audit", "build", "verify", "check", "index")
IMAGEGEN = [sys.executable, "-m", "imagegen"]


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    return r.ru_utime + r.ru_stime


def _machine_cpu() -> float:
    """Every process's CPU seconds on this machine (/proc/stat): an engine build compiles in the engine's
    processes, not imagegen's children (0 where /proc/stat cannot be read)."""
    try:
        fields = Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:]
    except OSError:
        return 0.0
    user, nice, system = (int(v) for v in fields[:3])
    return (user + nice + system) / os.sysconf("SC_CLK_TCK")


def timed(argv: list[str], log: Path) -> dict:
    """Run one imagegen command (stdout kept for the JSON steps, stderr to ``log``): exit, wall, CPU."""
    log.parent.mkdir(parents=True, exist_ok=True)
    cpu0, machine0, t0 = _cpu(), _machine_cpu(), time.monotonic()
    with log.open("ab") as err:
        err.write(("$ " + " ".join(argv) + "\n").encode())
        err.flush()
        proc = subprocess.run(argv, stdout=subprocess.PIPE, stderr=err, check=False)
        err.write(proc.stdout)  # the log holds both (stdout is also kept for the JSON steps)
    return {"argv": argv, "exit": proc.returncode, "wall_s": round(time.monotonic() - t0, 1),
            "cpu_s": round(_cpu() - cpu0, 1), "machine_cpu_s": round(_machine_cpu() - machine0, 1),
            "stdout": proc.stdout.decode("utf-8", "replace")}


class Runbook:
    def __init__(self, args: argparse.Namespace) -> None:
        self.args = args
        self.work = Path(args.work).resolve()
        self.out = Path(args.out).resolve()
        self.record = Path(args.record).resolve()
        self.rows: list[dict] = []
        self.failed: dict[str, str] = {}  # recipe -> the step it failed at

    def run(self, step: str, recipe: str | None, argv: list[str]) -> dict:
        name = f"{step}-{recipe}" if recipe else step
        result = timed(argv, self.work / "logs" / f"{name}.log")
        row = {"step": step, "recipe": recipe, "torch": self.args.torch, **{k: v for k, v in result.items()
                                                                           if k != "stdout"}}
        self.rows.append(row)
        with self.record.open("a") as f:
            f.write(json.dumps(row) + "\n")
        state = "ok" if result["exit"] == 0 else f"exit {result['exit']}"
        print(f"{step:8} {recipe or '':20} {state:8} {result['wall_s']:8.1f} s wall {result['cpu_s']:9.1f} s CPU"
              f" ({result['machine_cpu_s']:.0f} s on the machine)", file=sys.stderr, flush=True)
        if result["exit"] != 0 and recipe:
            self.failed.setdefault(recipe, step)
        return result

    def cell_args(self) -> list[str]:
        a = self.args
        host = ["--native", "--python-exe", a.python_exe] if a.native else []
        return ["--torch", a.torch, "--arch", a.arch, *host, *a.extra]

    def src_args(self, recipe: str) -> list[str]:
        """A recipe's own arguments (--with RECIPE=ARGS): where its source comes from, mostly."""
        import shlex

        given = dict(item.split("=", 1) for item in self.args.with_args)
        return shlex.split(given[recipe]) if recipe in given else []

    def main(self) -> int:
        a, steps = self.args, set(self.args.steps.split(","))
        self.work.mkdir(parents=True, exist_ok=True)
        if "refresh" in steps:
            self.run("refresh", None, [*IMAGEGEN, "refresh"])
        recipes = a.recipes.split(",") if a.recipes else None
        # a native plan is the host's one cell: one plan a recipe
        plans = [[r] for r in recipes] if a.native else [recipes or []]
        cells = []
        for names in plans:
            planned = self.run("plan", names[0] if a.native else None,
                               [*IMAGEGEN, "plan", *names, *self.cell_args(), *(self.src_args(names[0]) if a.native else []),
                                "--json"])
            try:
                cells += json.loads(planned["stdout"])["cells"]
            except (json.JSONDecodeError, KeyError):
                if not a.native:
                    print("the catalogue's plan printed no JSON: see its log", file=sys.stderr)
                    return 1
                self.failed[names[0]] = "plan: this host cannot build it (its log says why)"
        names = [c["recipe"] for c in cells if c["status"] in ("buildable", "unchecked")]
        for c in cells:
            if c["status"] not in ("buildable", "unchecked"):
                self.failed[c["recipe"]] = "plan: " + "; ".join(c.get("reasons") or [c["status"]])
        wheels: dict[str, Path] = {}
        for recipe in names:
            per = [recipe, *self.cell_args(), *self.src_args(recipe)]
            if "audit" in steps and self.run("audit", recipe, [*IMAGEGEN, "plan", *per, "--audit", "--work",
                                                              str(self.work / recipe)])["exit"] != 0:
                continue
            if "build" not in steps:
                continue
            built = self.run("build", recipe, [*IMAGEGEN, "build", *per, "--out", str(self.out), "--work",
                                               str(self.work / recipe)])
            wheel = self.built_wheel(cells, recipe, built["stdout"])
            if built["exit"] == 0 and wheel is not None:
                wheels[recipe] = wheel
            elif built["exit"] == 0:
                self.failed.setdefault(recipe, "build: no wheel in the wheelhouse's manifest")
        for recipe, wheel in wheels.items():
            if "verify" in steps and self.run("verify", recipe, [*IMAGEGEN, "verify", str(wheel), "--arch",
                                                                a.arch])["exit"] != 0:
                continue
            if "check" in steps:
                if shutil.which("nvidia-smi") and subprocess.run(["nvidia-smi", "-L"], capture_output=True).returncode == 0:
                    py = ["--python-exe", a.python_exe] if a.python_exe else []
                    self.run("check", recipe, [*IMAGEGEN, "check", str(wheel), *py])
                else:
                    print(f"check    {recipe:20} skipped: no GPU on this machine (its check runs where one is)",
                          file=sys.stderr)
        if "index" in steps and wheels:
            self.run("index", None, [*IMAGEGEN, "index", str(self.out)])
        self.summary(names, wheels)
        return 0 if names and not self.failed else 1

    def built_wheel(self, cells: list[dict], recipe: str, stdout: str) -> Path | None:
        """The wheel a build of ``recipe``'s cell left: the path a native build prints, else the one the
        manifest of its wheelhouse folder records for the cell (an engine build's)."""
        # a native build prints the path; a build's summary rows end with it (CELL  STATE  -  PATH)
        printed = [ln.split()[-1] for ln in stdout.splitlines() if ln.endswith(".whl")]
        if printed:
            return Path(printed[-1])
        for c in cells:
            if c["recipe"] != recipe:
                continue
            try:
                entry = json.loads((self.out / c["wheel_dir"] / "manifest.json").read_text())["cells"][c["name"]]
            except (OSError, ValueError, KeyError):
                return None
            return self.out / c["wheel_dir"] / entry["wheel"]
        return None

    def summary(self, names: list[str], wheels: dict[str, Path]) -> None:
        """The figures per recipe, and the builds' estimate on a 16-core host and a hosted-runner farm."""
        from imagegen.model.arch_parse import parse_arch_list
        from imagegen.model.build_cost import cell_cost, hosted_hours
        from imagegen.model.catalogue import load_catalogue

        cat = load_catalogue()
        targets = len(parse_arch_list(self.args.arch))
        # CPU s: imagegen and its children (a native build's compiler); machine CPU s: every process here
        # (an engine build compiles in the engine; other work on the machine counts too)
        print("\n| recipe | steps | wall s | CPU s | machine CPU s | 16-core host (est. h) | hosted 4-CPU runner (est. h) |"
              " result |")
        print("|---|---|---:|---:|---:|---:|---:|---|")
        longest = 0.0
        for recipe in sorted(set(names) | set(self.failed)):
            rows = [r for r in self.rows if r["recipe"] == recipe]
            reached = rows[-1]["step"] if rows else "plan"
            cost = cell_cost(cat.get(recipe), targets)
            host = f"{hosted_hours(cost.cpu_hours, 16, cost.wall_hours):.2f}" if cost else "-"
            runner = hosted_hours(cost.cpu_hours, 4, cost.wall_hours) if cost else None
            longest = max(longest, runner or 0.0)
            print(f"| {recipe} | {', '.join(r['step'] for r in rows) or 'plan'} | {sum(r['wall_s'] for r in rows):.0f} |"
                  f" {sum(r['cpu_s'] for r in rows):.0f} | {sum(r.get('machine_cpu_s', 0) for r in rows):.0f} | {host} | {f'{runner:.2f}' if runner else '-'} |"
                  f" {'failed at ' + self.failed[recipe] if recipe in self.failed else 'wheel ok' if recipe in wheels else reached + ' ok'} |")
        total = sum(r["wall_s"] for r in self.rows)
        print(f"\nthis run: {total:.0f} s wall for {len(names)} planned cells; a farm with a runner per cell takes"
              f" about its longest build, {longest:.2f} h on hosted 4-CPU runners (estimate)")


def parse(argv: list[str]) -> argparse.Namespace:
    extra: list[str] = []
    if "--" in argv:
        i = argv.index("--")
        argv, extra = argv[:i], argv[i + 1:]
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("torch", help="the new torch release, e.g. 2.15.0")
    p.add_argument("--arch", default="9.0", help="the arch list every cell builds (default 9.0)")
    p.add_argument("--recipes", help="comma-separated recipe names (default: the whole catalogue)")
    p.add_argument("--out", default="wheelhouse", help="the wheelhouse")
    p.add_argument("--work", default=".imagegen/day-one", help="sources, logs and build folders")
    p.add_argument("--record", default="runbook.jsonl", help="one JSON line per step (appended)")
    p.add_argument("--steps", default=",".join(STEPS), help=f"which steps, of {','.join(STEPS)}")
    p.add_argument("--native", action="store_true", help="build on this host with --python-exe's torch")
    p.add_argument("--python-exe", help="with --native: the Python whose torch is the new release")
    p.add_argument("--with", dest="with_args", action="append", default=[], metavar="RECIPE=ARGS",
                   help="imagegen arguments for one recipe's plan, audit and build, e.g. sage='--git"
                        " file:///mirrors/sage@v2.2.0', causal-conv1d='--fetch sdist', or with --native"
                        " mamba-ssm='--src-dir TREE'")
    args = p.parse_args(argv)
    args.extra = extra
    unknown = set(args.steps.split(",")) - set(STEPS)
    if unknown:
        p.error(f"--steps: unknown step(s) {', '.join(sorted(unknown))}")
    if args.native and not (args.python_exe and args.recipes):
        p.error("--native needs --python-exe (the venv whose torch is the new release) and --recipes")
    if any("=" not in s for s in args.with_args):
        p.error("--with takes RECIPE=ARGS")
    return args


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    sys.exit(Runbook(parse(sys.argv[1:])).main())
