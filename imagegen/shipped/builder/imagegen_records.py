"""The wheel a build makes and the build record beside it (<wheel>.imagegen.json: what built it, its
sha256, the smoke and GPU checks' results), both put in place so that no reader sees half of one, and
owned by whoever owns the output folder (`docker run -v "$PWD/out:/out"` runs as root).

Shipped beside imagegen_build.py, and written beside the Windows helper (imagegen_windows.py) by a rendered
build.ps1/build.cmd: both builds write the same record the same way (standard library only, Python 3.8+)."""

import hashlib
import json
import os
import shutil
import sys
import time

RECORD_SUFFIX = ".imagegen.json"  # beside the wheel: what built it (imagegen.wheelhouse.RECORD_SUFFIX)


def file_sha256(path):
    digest = hashlib.sha256()
    with open(path, "rb") as fh:
        for block in iter(lambda: fh.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def write_json_beside(path, doc, owner_folder):
    """``doc`` into ``path`` under a hidden name first, then renamed: never half a file."""
    tmp = os.path.join(os.path.dirname(path), ".%s.partial" % os.path.basename(path))
    with open(tmp, "w", encoding="utf-8") as fh:
        json.dump(doc, fh, indent=2, sort_keys=True)
        fh.write("\n")
    give_to_folder_owner(tmp, owner_folder)
    os.replace(tmp, path)


def copy_into_place(src, dest, owner_folder):
    """``src`` copied to ``dest`` under a hidden name beside it first, then renamed: no reader (collect,
    an index, the user) sees half a wheel, and none is left behind by a failed copy."""
    tmp = os.path.join(os.path.dirname(dest), ".%s.%d.partial" % (os.path.basename(dest), os.getpid()))
    try:
        shutil.copyfile(src, tmp)
        give_to_folder_owner(tmp, owner_folder)
        os.replace(tmp, dest)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def build_record(*, cell, recipe, distribution, version, source, patches, torch, cuda, python, flavor, base_image,
                 requested_archs, planned_archs, inputs, wheel, started):
    """The build record of ``wheel`` (the one schema `imagegen collect` reads, imagegen.finish.records):
    what the Linux build (write_build_record) and the Windows helper (imagegen_windows.py) fill in."""
    return {
        "schema": 1,
        "kind": "imagegen-build-record",
        "cell": cell,
        "recipe": recipe,
        "distribution": distribution,
        "version": version,
        "source": dict({k: source.get(k) for k in ("kind", "url", "ref", "commit")},
                       **({"sha256": source["sha256"]} if source.get("sha256") else {})),
        "patches": [p["name"] for p in patches],
        "torch": torch,
        "cuda": cuda,
        "python": python,
        "flavor": flavor,
        "base_image": base_image,
        "requested_archs": requested_archs,
        "planned_archs": planned_archs,
        "inputs": inputs,
        "wheel": os.path.basename(wheel),
        "sha256": file_sha256(wheel),
        "built_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "duration_s": round(time.time() - started, 1) if started is not None else None,
    }


def write_build_record(cell, env, wheel, started):
    """The build record beside ``wheel``: which cell, source, torch, CUDA and archs built it, and
    its sha256. A bake export or a `docker run -v OUT:/out` carries it with the wheel, so that
    `imagegen collect` can verify that wheel against what was asked and record it in the wheelhouse's
    manifest (index and publish take only recorded, verified wheels). `smoke` adds its result."""
    record = build_record(
        cell=cell.get("cell"), recipe=cell["recipe"], distribution=cell.get("distribution"), version=cell["version"],
        source=cell["source"], patches=cell.get("patches", []), torch=cell["torch"]["version"],
        cuda=cell["torch"]["cuda"], python=cell.get("python") or "%d.%d" % sys.version_info[:2],
        flavor=cell.get("flavor"), base_image=os.environ.get("IMAGEGEN_BASE_IMAGE") or None,
        # What this build was asked for (a bake --set or the GPUs `docker run --gpus all` shows may
        # differ from the plan); the plan's inputs hash holds only when it was the planned list.
        requested_archs=env.get("TORCH_CUDA_ARCH_LIST") or "",
        planned_archs=os.environ.get("IMAGEGEN_PLANNED_ARCHS") or None,
        inputs=(os.environ.get("IMAGEGEN_INPUTS") or None)
        if env.get("TORCH_CUDA_ARCH_LIST") == os.environ.get("IMAGEGEN_PLANNED_ARCHS") else None,
        wheel=wheel, started=started)
    write_json_beside(wheel + RECORD_SUFFIX, record, os.path.dirname(wheel))


def add_report_to_records(wheels, key, report):
    """A test's ``report`` under ``key`` ("smoke", "gpu_check") in each tested wheel's build record (a
    wheel without one, e.g. from an older builder, is left alone: `imagegen collect` then refuses it
    as untested)."""
    for wheel in wheels:
        path = wheel + RECORD_SUFFIX
        if not os.path.isfile(path) or os.path.islink(path):
            continue
        with open(path, encoding="utf-8") as fh:
            record = json.load(fh)
        record[key] = report
        write_json_beside(path, record, os.path.dirname(wheel))


def give_to_folder_owner(path, folder):
    """`docker run -v "$PWD/out:/out"` runs as root: hand the wheel to whoever owns the folder, so
    the user can move or delete it without sudo."""
    try:
        st = os.stat(folder)
        if os.geteuid() == 0 and (st.st_uid, st.st_gid) != (0, 0):
            os.chown(path, st.st_uid, st.st_gid)
    except (OSError, AttributeError):
        pass
