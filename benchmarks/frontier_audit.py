#!/usr/bin/env python3
"""Issue 37 item 3, native half: the catalogue at the frontier (torch 2.12-2.15), measured.

For every catalogue recipe x pinned version, run
    imagegen plan RECIPE --version V --audit --native --python-exe VENV/bin/python --src-dir SRC \
        --arch 9.0 --torch T --cuda C --python 3.11 --json
with one torch venv at a time (CUDA_HOME: the venv's PyPI CUDA toolkit merged into one folder, as the
`pypi` flavor's builder does), and record the verdict, the header probe's result and the seconds.

    frontier_audit.py sources ROOT            export each pinned version's tree from $IMAGEGEN_MIRRORS
                                              (sdist-only versions: ROOT/sdist/*.tar.gz, downloaded first)
    frontier_audit.py cudahome VENV HOME      merge VENV's nvidia/* trees into HOME (hard links)
    frontier_audit.py run ROOT VENV HOME T C OUT.jsonl [recipe[/version] ...]
                                              audit every cell (one at a time), append one JSON line each
    frontier_audit.py engine ROOT T OUT.jsonl [recipe[/version] ...]
                                              the same cells in the builder image (Docker engine, `pypi`
                                              flavor, Python $FRONTIER_PYTHON (3.11) on the base image
                                              $IMAGEGEN_TEST_BASE_IMAGE (the local test image; Python 3.12:
                                              imagegen-test/python:3.12-noble, scripts/make-base-image.sh)): imagegen
                                              plan --audit --source TREE --torch T --flavor pypi ...
    frontier_audit.py table OUT.jsonl...      the Markdown table and the per-torch totals / time summary
"""
from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tarfile
import time
from pathlib import Path

import yaml

REPO = Path(__file__).resolve().parents[1]
RECIPES = REPO / "imagegen" / "resources" / "recipes"
MIRRORS = Path(os.environ.get("IMAGEGEN_MIRRORS", "mirrors"))  # <owner>+<name>/repo git mirrors


def catalogue():
    """(recipe, version, source git URL, commit or None, sdist URL or None, subdir) for every pin."""
    out = []
    for f in sorted(RECIPES.glob("*.yaml")):
        doc = yaml.safe_load(f.read_text())
        src = doc["source"]
        for v, body in doc["versions"].items():
            body = body or {}
            out.append((doc["name"], str(v), src["git"], body.get("commit"), (body.get("sdist") or {}).get("url"),
                        src.get("subdir")))
    return out


def mirror(git_url):
    owner, name = git_url.rstrip("/").removesuffix(".git").split("/")[-2:]
    return MIRRORS / f"{owner}+{name}" / "repo"


def export(git_dir, commit, dest):
    """git archive COMMIT | tar -x; blobs a mirror lacks (its largest files: PDFs, images) are left out."""
    dest.mkdir(parents=True, exist_ok=True)
    git = ["git", "--git-dir", str(git_dir)]
    rows = subprocess.run(git + ["ls-tree", "-r", "-z", commit], check=True, capture_output=True).stdout.split(b"\0")
    blobs = [(r.split(b"\t", 1)[0].split()[2], r.split(b"\t", 1)[1]) for r in rows if b" blob " in r.split(b"\t", 1)[0]]
    check = subprocess.run(git + ["cat-file", "--batch-check"], input=b"".join(o + b"\n" for o, _ in blobs),
                           check=True, capture_output=True).stdout.splitlines()
    skip = [path.decode() for (_, path), line in zip(blobs, check) if line.endswith(b" missing")]
    if skip:
        print(f"  left out (blobs not in the mirror): {len(skip)} files, e.g. {skip[0]}", flush=True)
    p = subprocess.run(git + ["archive", commit, "--", "."] + [f":(exclude,literal){s}" for s in skip], capture_output=True)
    if p.returncode:
        raise SystemExit(p.stderr.decode())
    subprocess.run(["tar", "-x", "-C", str(dest)], input=p.stdout, check=True)


def submodule_commit(git_dir, commit, path):
    out = subprocess.run(["git", "--git-dir", str(git_dir), "ls-tree", commit, path], check=True,
                         capture_output=True, text=True).stdout.split()
    return out[2] if len(out) >= 3 and out[1] == "commit" else None


def tree_dir(root, recipe, version):
    return Path(root) / "src" / f"{recipe}-{version}"


def sources(root):
    root = Path(root)
    for recipe, version, git, commit, sdist, _subdir in catalogue():
        dest = tree_dir(root, recipe, version)
        if dest.exists():
            continue
        if commit:
            export(mirror(git), commit, dest)
        else:  # pinned by its PyPI sdist alone: `pip download --no-deps --no-binary :all:` into ROOT/sdist
            tgz = root / "sdist" / sdist.rsplit("/", 1)[-1]
            with tarfile.open(tgz) as t:
                top = t.getnames()[0].split("/")[0]
                t.extractall(root / "src", filter="data")
            (root / "src" / top).rename(dest)
        # The same local workarounds as docs/records/audit-catalogue.md's top (exports have no submodules; the
        # real build clones them).
        if recipe == "flash-attn":
            h = dest / "csrc/cutlass/include/cutlass/cutlass.h"
            h.parent.mkdir(parents=True, exist_ok=True)
            h.touch()
        if recipe == "xformers":
            (dest / "third_party/cutlass/include").mkdir(parents=True, exist_ok=True)
            sub = submodule_commit(mirror(git), commit, "third_party/flash-attention")
            if sub and (version.startswith("0.0.32") or version.startswith("0.0.33")):
                export(MIRRORS / "Dao-AILab+flash-attention" / "repo", sub, dest / "third_party/flash-attention")
                # its own CUTLASS submodule: setup.py wants the folder (empty, like xformers' own above)
                (dest / "third_party/flash-attention/csrc/cutlass/include").mkdir(parents=True, exist_ok=True)
        print(f"{recipe} {version}: {dest}", flush=True)


def cudahome(venv, home):
    """The `pypi` flavor's CUDA_HOME (imagegen_toolchain.assemble_cuda_home), made of hard links."""
    py = Path(venv) / "bin" / "python"
    roots = subprocess.check_output([str(py), "-c", "import nvidia; print('\\n'.join(nvidia.__path__))"],
                                    text=True).split()
    home = Path(home)
    home.mkdir(parents=True, exist_ok=True)
    for r in reversed(roots):
        for part in sorted(Path(r).iterdir()):
            if not part.is_dir() or not ((part / "include").is_dir() or (part / "bin").is_dir()):
                continue
            for sub in ("bin", "include", "lib", "nvvm"):
                if (part / sub).is_dir():
                    subprocess.run(["cp", "-al", "--remove-destination", f"{part / sub}/.", str(home / sub)], check=True)
    lib = home / "lib"
    lib.mkdir(exist_ok=True)
    for f in sorted(os.listdir(lib)):
        m = re.match(r"(lib[\w+-]+\.so)\.\d+$", f)
        if m and not (lib / m.group(1)).exists():
            os.symlink(f, lib / m.group(1))
    if not (home / "lib64").exists():
        os.symlink("lib", home / "lib64")
    subprocess.run([str(home / "bin" / "nvcc"), "--version"], check=True)


def summarize(rec):
    """(verdict, reason, probe, seconds) of one recorded cell."""
    plan = rec.get("plan")
    if not plan and "cannot build" in (rec.get("stderr") or ""):
        return "plan-refused", rec["stderr"].strip().splitlines()[-1].split(" here: ", 1)[-1], "not run", None
    if not plan and "no cell of this matrix can build" in (rec.get("stderr") or ""):  # a container plan's refusal
        why = next((ln.split("] rejected: ", 1)[1] for ln in rec["stderr"].splitlines() if "] rejected: " in ln), "")
        return "plan-refused", why, "not run", None
    if not plan:
        return "error", (rec.get("stderr") or rec.get("stdout") or "").strip().splitlines()[-1:] or [""], "-", rec["wall_s"]
    cell, audit = plan.get("cell") or {}, plan.get("audit")
    if cell.get("status") != "buildable" or audit is None:
        why = "; ".join(cell.get("reasons") or []) or "no audit"
        return f"plan: {cell.get('status')}", why, "not run", None
    probes = [p for e in audit.get("extensions") or [] for p in e.get("probe") or []]
    if not probes:
        probe = "not run" + (f" ({audit['probe'].get('mode')})" if audit.get("probe") else "")
    elif all(p.get("ok") for p in probes):
        probe = "ok (%d)" % len(probes)
    else:
        bad = [p for p in probes if p.get("ok") is False]
        probe = ("failed: " + bad[0]["compiler"] + ": " + bad[0]["error"]) if bad else "not run: " + probes[0].get("error", "")
    verdict = "buildable" if audit.get("verdict") == "ok" else "refused"
    reason = "; ".join(audit.get("refusals") or [])
    return verdict, reason, probe, audit.get("seconds")


def stds(rec):
    audit = (rec.get("plan") or {}).get("audit") or {}
    return " ".join(sorted({e.get("cxx_std") or "-" for e in audit.get("extensions") or []}))


def table(files):
    latest = {}  # a cell run again (after a fix) replaces its earlier line
    for f in files:
        for line in open(f):
            if line.strip():
                r = json.loads(line)
                latest[(r["torch"], r["recipe"], r["version"])] = r
    rows = list(latest.values())
    print("| recipe | version | torch | CUDA | verdict | -std | probe | audit+probe s |")
    print("|---|---|---|---|---|---|---|---|")
    per_torch, secs = {}, []
    for r in rows:
        verdict, reason, probe, sec = summarize(r)
        shown = verdict if not reason else f"{verdict}: {reason}"
        print(f"| {r['recipe']} | {r['version']} | {r['torch']} | {r['cuda']} | {shown} | {stds(r)} | {probe} |"
              f" {'-' if sec is None else f'{sec:.1f}'} |")
        per_torch.setdefault(r["torch"], {}).setdefault(verdict, 0)
        per_torch[r["torch"]][verdict] += 1
        if sec is not None:
            secs.append(sec)
        if verdict == "buildable" and not probe.startswith("ok"):
            print(f"<!-- DISAGREE: {r['recipe']} {r['version']} torch {r['torch']}: buildable, probe {probe} -->")
    print()
    for t, counts in per_torch.items():
        print(f"- torch {t}: " + ", ".join(f"{v} {n}" for v, n in sorted(counts.items())))
    if secs:
        print(f"- audit + probe seconds per audited cell ({len(secs)} cells): median {statistics.median(secs):.1f},"
              f" max {max(secs):.1f}, min {min(secs):.1f}")


def run(root, venv, home, torch, cuda, out, only=()):
    env = dict(os.environ, PYTHONPATH=str(REPO), CUDA_HOME=str(home),
               PATH=f"{home}/bin:{Path(venv) / 'bin'}:{os.environ['PATH']}")
    py = Path(venv) / "bin" / "python"
    for recipe, version, _git, commit, _sdist, _subdir in catalogue():
        if only and recipe not in only and f"{recipe}/{version}" not in only:
            continue
        src = tree_dir(root, recipe, version)
        work = Path(root) / "work" / f"{recipe}-{version}-{torch}"
        # A version pinned by its sdist alone: the unpacked sdist is given without --version (with --src-dir,
        # --version asks imagegen to unpack the pinned sdist there); its PKG-INFO names the version and the
        # recipe's by_version range applies, as docs/records/audit-catalogue.md's session-12 audit ran it.
        pin = ["--version", version] if commit else []
        cmd = [sys.executable, "-m", "imagegen", "plan", recipe, *pin, "--audit", "--native",
               "--python-exe", str(py), "--src-dir", str(src), "--work", str(work), "--arch", "9.0",
               "--torch", torch, "--cuda", cuda, "--python", "3.11", "--json"]
        audit_cell(cmd, env, out, {"recipe": recipe, "version": version, "torch": torch, "cuda": cuda})


def audit_cell(cmd, env, out, rec):
    """Run one cell's `imagegen plan --audit ... --json`, append its record (``rec`` with the exit, the wall
    time, the plan's JSON or the output's end) to ``out`` and say how it went."""
    t0 = time.monotonic()
    p = subprocess.run(cmd, capture_output=True, text=True, env=env, cwd=str(REPO))
    wall = time.monotonic() - t0
    rec = {**rec, "rc": p.returncode, "wall_s": round(wall, 1), "cmd": " ".join(cmd[1:])}
    try:
        planned = json.loads(p.stdout)  # native: one {cell, audit}; in the builder image: a list of them
        rec["plan"] = planned[0] if isinstance(planned, list) and planned else planned
        if rec.get("where") == "engine":
            rec["cuda"] = (rec["plan"].get("cell") or {}).get("cuda") or rec["cuda"]
    except (ValueError, AttributeError):
        rec["stdout"] = p.stdout[-4000:]
    rec["stderr"] = p.stderr[-4000:]
    with open(out, "a") as fh:
        fh.write(json.dumps(rec) + "\n")
    where = " (engine)" if rec.get("where") == "engine" else ""
    print(f"{rec['recipe']} {rec['version']} torch {rec['torch']}{where}: rc {p.returncode} {wall:.1f} s", flush=True)


def exported_repo(root, recipe, version):
    """FILE@COMMIT of a one-commit repository holding the exported tree of ``recipe`` ``version`` (the
    mirror itself lacks blobs, which `git archive` of the pinned commit then cannot export); made once."""
    repo = Path(root).resolve() / "git" / f"{recipe}-{version}"
    if not (repo / ".git").is_dir():
        subprocess.run(["cp", "-a", str(tree_dir(root, recipe, version)), str(repo)], check=True)
        git = ["git", "-C", str(repo), "-c", "user.name=frontier", "-c", "user.email=frontier@localhost"]
        for args in (["init", "-q"], ["add", "-A"], ["commit", "-qm", f"{recipe} {version} export"]):
            subprocess.run(git + args, check=True)
    head = subprocess.run(["git", "-C", str(repo), "rev-parse", "HEAD"], check=True, capture_output=True,
                          text=True).stdout.strip()
    return f"{repo}@{head}"


def engine(root, torch, out, only=()):
    """Item 3's other half: each cell audited (and probed) in its builder image, as `imagegen plan --audit`
    does it without --native: the toolchain layer (torch T and its PyPI CUDA toolkit) made once per torch,
    then the exported tree copied in and the audit run there. The tree is given as --source (a tree of a
    package the catalogue knows is planned with that recipe's rules at the tree's version)."""
    base = os.environ.get("IMAGEGEN_TEST_BASE_IMAGE", "imagegen-test/python:3.11-bookworm")
    python = os.environ.get("FRONTIER_PYTHON", "3.11")
    for recipe, version, git, commit, _sdist, subdir in catalogue():
        if only and recipe not in only and f"{recipe}/{version}" not in only:
            continue
        src = tree_dir(root, recipe, version)
        work = Path(root) / "work-engine" / f"{recipe}-{version}-{torch}" if python == "3.11" else \
            Path(root) / "work-engine" / f"{recipe}-{version}-{torch}-py{python}"
        pin = ["--version", version] if commit else []
        # A recipe built from a subfolder of another package's repository (flash-attn-3: flash-attention's
        # hopper/): --source of the whole tree is that other package, so the pinned commit comes from the
        # mirror by --git, with the recipe named.
        what = [recipe, "--git", f"file://{exported_repo(root, recipe, version)}"] if subdir and commit \
            else ["--source", str(src)]
        cmd = [sys.executable, "-m", "imagegen", "plan", "--audit", *what, *pin, "--torch", torch,
               "--python", python, "--flavor", "pypi", "--base-image", base, "--arch", "9.0", "--work", str(work),
               "--json"]
        audit_cell(cmd, dict(os.environ, PYTHONPATH=str(REPO)), out, {
            "recipe": recipe, "version": version, "torch": torch, "cuda": "pypi default", "where": "engine",
            "python": python})


if __name__ == "__main__":
    cmd, *args = sys.argv[1:]
    if cmd == "sources":
        sources(*args)
    elif cmd == "cudahome":
        cudahome(*args)
    elif cmd == "run":
        run(*args[:6], only=tuple(args[6:]))
    elif cmd == "engine":
        engine(*args[:3], only=tuple(args[3:]))
    elif cmd == "table":
        table(args)
    else:
        sys.exit(__doc__)
