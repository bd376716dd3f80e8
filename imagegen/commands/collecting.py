"""`imagegen collect OUT`: take the wheels builder images exported (each with its build record) into the
wheelhouse's manifests, once each is verified (imagegen.wheelhouse.records). A wheel that fails stays out and is
named; the others are recorded. Exit 6 when any failed, 2 when there is nothing to collect.

`imagegen collect WHEEL... --external --arch LIST --out WHEELHOUSE`: wheels imagegen did not build (no build
record), verified against --arch and recorded as external (imagegen.wheelhouse.external)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from imagegen import safety
from imagegen.wheelhouse import collect
from imagegen.wheelhouse import records
from imagegen.commands import common
from imagegen.errors import BuildRecordError, UsageError, VerifyError, printable
from imagegen.outputs import shown
from imagegen.wheelhouse.manifest import read_manifest


def cmd_collect(args: argparse.Namespace) -> int:
    from imagegen.finish.verify import expected_for_wheel, verify_wheel

    if args.external:
        return _collect_external(args)
    if args.wheelhouse is not None or args.arch is not None:
        raise UsageError("--out and --arch are for --external wheels: `imagegen collect WHEEL... --external --arch"
                         " LIST --out WHEELHOUSE`; a builder export is collected in place (`imagegen collect OUT`)")
    if len(args.out) != 1:
        raise UsageError(f"collect takes one exported folder, not {len(args.out)} paths (wheels imagegen did not"
                         " build: `imagegen collect WHEEL... --external --arch LIST --out WHEELHOUSE`)")
    out: Path = args.out[0]
    try:
        is_dir = out.is_dir()
    except OSError as exc:  # a name too long, a loop of links
        raise UsageError(f"{shown(out)}: {exc.strerror or 'not a usable path'}") from None
    if not is_dir:
        raise UsageError(f"{shown(out)} is not a folder: give the folder a bake export or `docker run -v OUT:/out` wrote")
    # collect writes a manifest.json into each folder below OUT that holds a build record (no deeper
    # than wheelhouse.MAX_WALK_DEPTH, never through a symlink): OUT must be a wheelhouse of its own.
    safety.wheelhouse_folder(out, "imagegen collect", UsageError)
    found, bare = records.find(out)
    if not found:
        hint = f" ({len(bare)} wheel{'s' if len(bare) != 1 else ''} without one: check those with `imagegen verify --arch`)" \
            if bare else ""
        raise UsageError(f"no build record (*.whl.imagegen.json) under {shown(out)}{hint}: it is written by builder"
                         " images of this imagegen version, beside each wheel that passed its smoke test")
    # the recipes say how each package compiles a request; without them a wheel is held to it as written
    cat = common.optional_catalogue(args, common.config(args))
    results: list[dict] = []
    by_folder: dict[Path, dict[str, dict]] = {}
    manifests: dict[Path, dict] = {}  # each folder's manifest, read once
    for path in found:
        result: dict = {"wheel": str(path.with_name(path.name[: -len(records.RECORD_SUFFIX)])), "record": str(path)}
        results.append(result)
        try:
            record = records.read(path)
        except BuildRecordError as exc:
            result.update(status="failed", problems=[f"build record: {exc}"])
            continue
        if path.parent not in manifests:
            unread: list[str] = []  # a FIFO, a link to a device, a huge or deep file: read bounded, started afresh
            manifests[path.parent] = read_manifest(path.parent, problems=unread)
            for line in unread:
                print(f"imagegen: warning: {printable(line)[:400]} (a new one replaces it)", file=sys.stderr)
        existing = manifests[path.parent]["cells"].get(record.cell)
        if isinstance(existing, dict) and existing.get("sha256") == record.doc["sha256"] \
                and existing.get("wheel") == record.wheel.name:
            result.update(status="recorded before", cell=record.cell)
            continue
        expected, knowledge = expected_for_wheel(cat, record.wheel, record.requested)
        report = verify_wheel(record.wheel, expected, strict=args.strict, extension_archs=knowledge)
        result.update(cell=record.cell, expected_archs=str(expected), verify=report.as_dict())
        if not report.ok:
            result.update(status="failed", problems=list(report.problems))
            continue
        by_folder.setdefault(path.parent, {})[record.cell] = records.manifest_entry(record, expected, report.as_dict())
        result.update(status="recorded", warnings=list(report.warnings))
    for folder, entries in by_folder.items():
        collect.record_entries(folder, entries)
    failed = [r for r in results if r["status"] == "failed"]
    if args.json:
        json.dump({"results": results, "without_record": [str(b) for b in bare]}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in results:
            mark = "FAIL" if r["status"] == "failed" else "ok  "
            print(f"{mark} {shown(r['wheel'], 300)}: {r['status']}"
                  + (f" ({r['cell']}, SASS/PTX for {r['expected_archs']})" if r.get("expected_archs") else ""))
            for line in r.get("warnings", []) + r.get("problems", []):
                print(f"     {printable(line)}")
        for wheel in bare:
            print(f"imagegen: warning: {shown(wheel, 300)} has no build record: left out (imagegen verify --arch checks it)",
                  file=sys.stderr)
    if failed:
        raise VerifyError(f"{len(failed)} of {len(results)} wheels were not recorded: "
                          f"{Path(failed[0]['wheel']).name}: {failed[0]['problems'][0]}")
    return 0


def _collect_external(args: argparse.Namespace) -> int:
    """collect --external: each wheel verified against --arch and, once it passes, placed flat in --out
    and recorded there as external; the others are named (exit 6)."""
    from imagegen.finish.verify import expected_for_wheel, verify_wheel
    from imagegen.model.arch_parse import parse_arch_list
    from imagegen.wheelhouse import external

    if args.arch is None or args.wheelhouse is None:
        missing = " and ".join(f for f, v in (("--arch LIST", args.arch), ("--out WHEELHOUSE", args.wheelhouse))
                               if v is None)
        raise UsageError(f"collect --external needs {missing}: the archs the wheels must carry (e.g. '12.0' for an"
                         " RTX 5090) and the wheelhouse to record them in")
    archs = parse_arch_list(args.arch)
    for wheel in args.out:
        external.refuse_unless_wheel(wheel)
    into: Path = args.wheelhouse
    try:
        if into.exists() and not into.is_dir():
            raise UsageError(f"--out {shown(into)}: not a folder")
    except OSError as exc:
        raise UsageError(f"--out {shown(into)}: {exc.strerror or 'not a usable path'}") from None
    safety.wheelhouse_folder(into, "--out", UsageError)
    # the recipes say how each package compiles a request; without them a wheel is held to it as written
    cat = common.optional_catalogue(args, common.config(args))
    results: list[dict] = []
    for wheel in args.out:
        result: dict = {"wheel": str(wheel), "external": True}
        results.append(result)
        expected, knowledge = expected_for_wheel(cat, wheel, archs)
        result["expected_archs"] = str(expected)
        try:
            report = verify_wheel(wheel, expected, strict=args.strict, extension_archs=knowledge)
        except VerifyError as exc:  # not a zip, too big to read
            result.update(status="failed", problems=[str(exc)])
            continue
        result["verify"] = report.as_dict()
        if not report.ok:
            result.update(status="failed", problems=list(report.problems))
            continue
        try:
            into.mkdir(parents=True, exist_ok=True)
            placed = collect.place_external(into, wheel, external.cell_key(wheel),
                                            external.entry(wheel, archs, expected, report))
        except OSError as exc:
            why = exc.strerror or exc.__class__.__name__
            raise UsageError(f"--out {shown(into)}: cannot write there ({why})") from None
        result.update(status="recorded external", placed=str(placed), tags=list(report.tags),
                      warnings=list(report.warnings))
    failed = [r for r in results if r["status"] == "failed"]
    if args.json:
        json.dump({"results": results, "wheelhouse": str(into)}, sys.stdout, indent=2)
        sys.stdout.write("\n")
    else:
        for r in results:
            mark = "FAIL" if r["status"] == "failed" else "ok  "
            print(f"{mark} {shown(r['wheel'], 300)}: {r['status']} (SASS/PTX for {r['expected_archs']}"
                  + (f"; tags {', '.join(r['tags'])}; in {shown(r['placed'], 300)}" if r.get("placed") else "") + ")")
            for line in r.get("warnings", []) + r.get("problems", []):
                print(f"     {printable(line)}")
        if len(failed) < len(results):
            print(f"imagegen: external wheels are recorded with what was checked (file name and tags, SASS/PTX,"
                  f" sha256; no smoke test): imagegen index {shown(into, 200)}, imagegen publish {shown(into, 200)}"
                  " --to DEST take them", file=sys.stderr)
    if failed:
        raise VerifyError(f"{len(failed)} of {len(results)} external wheels were not recorded: "
                          f"{Path(failed[0]['wheel']).name}: {failed[0]['problems'][0]}")
    return 0


