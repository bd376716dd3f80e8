"""A cell smoke-imports only the extensions its arch list builds.

An RTX 5090 user's `imagegen build sage --arch 12.0+PTX` compiled for 15 minutes on the engine and then
failed its smoke step on `import sageattention._qattn_sm90`: the recipe routes that extension to sm_90a
only, so a list without 9.0 never builds it. Every earlier test list had 9.0 in it. Here every catalogue
recipe's default version and every version that routes an extension is planned for each arch it claims
alone (and with +PTX where the package honours PTX), and the modules the builder's document hands the
smoke step are checked against what the routing (the gencode audit's model) says the list builds."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from imagegen.model.arch import ArchList
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.audit import judge
from imagegen.model.audit_report import AuditReport
from imagegen.model.catalogue import load_catalogue
from imagegen.plan.matrix import choose_cell
from imagegen.render.dockerfile import cell_document
from imagegen.render.windows import build_document
from tests.unit.builder_script import CHECK, builder_module
from tests.unit.test_windows import windows_cell

CAT = load_catalogue()
B = builder_module("imagegen_check_smoke_archs", CHECK)


def _requests() -> list[tuple[str, str, str]]:
    """(recipe, version, arch list): each claimed arch of the default version and of every routed
    version, alone and, where the package honours PTX, with +PTX."""
    out = []
    for name in CAT.names():
        recipe = CAT.get(name)
        for label, version in recipe.versions.items():
            if label != recipe.default_version and not version.extensions:
                continue
            for arch in version.archs:
                plain = f"{arch.major}.{arch.minor}"  # the user's form: emits makes 9.0 the 9.0a the recipe claims
                out.append((name, label, plain))
                if version.arch.ptx == "honoured":
                    out.append((name, label, plain + "+PTX"))
    return out


REQUESTS = _requests()


def _built_by_routing(version, expected: ArchList, nvcc) -> set[str]:
    """The routed extensions the gencode audit counts as built for ``expected``, asked of the audit
    itself: each routed extension is made to carry only targets its kernels take that were not asked
    for, beside one extension that carries the whole request. Where the audit then says the routed one
    "would not carry" a requested arch, it counts it as built for that list; where it says nothing, the
    list does not build it (its kernels target none of the archs asked for)."""
    built = set()
    ccs = {a.cc for a in expected}
    full = {"module": "probe._all", "sass": [a.sm for a in expected if a.sass],
            "ptx": [a.compute for a in expected if a.ptx]}
    for module, allowed in version.extensions.items():
        others = [a for a in allowed if a.cc not in ccs]
        if len(others) == len(allowed):  # none asked for: the audit must not expect it to carry anything
            pass
        elif not others:  # all of its archs asked for: carried whatever it compiles
            built.add(module)
            continue
        report = AuditReport.from_json({"ok": True, "exit": 0, "extensions": [
            full, {"module": module, "sass": [a.sm for a in others], "ptx": []}]})
        verdict = judge(report, recipe_name="r", version_label="v", requested=expected, nvcc=nvcc,
                        extension_archs={module: allowed})
        assert not [r for r in verdict.refusals if module in r], verdict.refusals  # (nvcc's own limits aside)
        if any(w.startswith(f"{module} would not carry") for w in verdict.warnings):
            built.add(module)
    return built


def test_the_requests_cover_every_recipe_and_a_list_without_9_0():
    assert {name for name, _, _ in REQUESTS} == set(CAT.names())
    assert ("sageattention", "2.2.0", "12.0+PTX") in REQUESTS and ("sageattention", "main", "12.1") in REQUESTS
    assert len({(n, v) for n, v, _ in REQUESTS if CAT.get(n).version(v).extensions}) >= 3  # 2.2.0, 2.1.1, main


@pytest.mark.parametrize("name,label,archs", REQUESTS, ids=["-".join(r) for r in REQUESTS])
def test_the_smoke_list_is_what_the_arch_list_builds(name, label, archs):
    recipe = CAT.get(name)
    version = recipe.version(label)
    cell = choose_cell(recipe, version, parse_arch_list(archs), torch=None, cuda=None, python=None, flavor="pypi",
                       strict=False)
    doc = cell_document(cell)
    smoke = [*doc["smoke_imports"], *doc["smoke_driver_imports"]]
    routed = set(version.extensions)
    built = _built_by_routing(version, cell.expected_archs, cell.nvcc)
    # Every module the builder imports is one the list builds: unrouted, or routed and built.
    assert {m for m in smoke if m in routed} <= built, (archs, smoke, built)
    # And nothing the list builds is left out of the test: the recipe's lists, less what it does not build.
    want = [m for m in recipe.smoke.imports if m not in routed or m in built]
    want_driver = [m for m in recipe.smoke.driver_imports if m not in routed or m in built]
    assert (doc["smoke_imports"], doc["smoke_driver_imports"]) == (want, want_driver)
    # The native path and the Windows script take the same resolution (Cell.smoke).
    assert (list(cell.smoke.imports), list(cell.smoke.driver_imports)) == (want, want_driver)


def test_sage_12_0_ptx_at_the_default_cell_does_not_import_the_hopper_extension():
    sage = CAT.get("sage")
    cell = choose_cell(sage, sage.version(None), parse_arch_list("12.0+PTX"), torch=None, cuda=None, python=None,
                       flavor="pypi")
    assert (cell.torch_version, cell.cuda.name, cell.python) == ("2.15.0", "cu132", "3.12")
    doc = cell_document(cell)
    assert doc["smoke_imports"] == ["sageattention", "sageattention._qattn_sm80", "sageattention._fused"]
    assert doc["smoke_driver_imports"] == []
    # The recipe's routed smoke module, for a build of another list than the planned one.
    assert doc["smoke_routed"] == [{"module": "sageattention._qattn_sm90", "driver": True, "ccs": ["9.0"]}]
    # The 9.0 list still imports it.
    hopper = choose_cell(sage, sage.version(None), parse_arch_list("9.0"), torch=None, cuda=None, python=None,
                         flavor="pypi")
    assert cell_document(hopper)["smoke_driver_imports"] == ["sageattention._qattn_sm90"]


def test_a_recipe_without_routing_keeps_its_documents_smoke_keys():
    fa = CAT.get("flash-attn")
    cell = choose_cell(fa, fa.version(None), parse_arch_list("9.0"), torch=None, cuda=None, python=None, flavor="pypi")
    doc = cell_document(cell)
    assert doc["smoke_imports"] == list(fa.smoke.imports) and "smoke_routed" not in doc


def test_the_windows_document_gives_each_cell_its_own_list():
    sage = CAT.get("sage")
    version = sage.version("2.2.0")
    from imagegen.model.compat import cuda_variant
    cells = [windows_cell(sage, version, parse_arch_list(a), "2.8", cuda_variant("12.8"), "3.12")
             for a in ("12.0+PTX", "8.0;9.0")]
    doc = build_document(sage, version, cells)
    assert "smoke_imports" not in doc
    assert [c["smoke_driver_imports"] for c in doc["cells"]] == [[], ["sageattention._qattn_sm90"]]


# ---------------------------------------------------------------------------------- the builder's step


def _doc_and_wheel(tmp_path: Path, planned: str, requested: str | None) -> tuple[dict, list[str]]:
    sage = CAT.get("sage")
    cell = choose_cell(sage, sage.version(None), parse_arch_list(planned), torch=None, cuda=None, python=None,
                       flavor="pypi")
    doc = cell_document(cell)
    wheel = tmp_path / "sageattention-2.2.0-cp312-cp312-linux_x86_64.whl"
    wheel.write_bytes(b"")
    if requested is not None:
        (tmp_path / (wheel.name + ".imagegen.json")).write_text(json.dumps(
            {"requested_archs": requested, "planned_archs": planned}))
    return doc, [str(wheel)]


def test_the_builder_imports_the_planned_list_for_the_planned_build(tmp_path):
    doc, wheels = _doc_and_wheel(tmp_path, "12.0+PTX", "12.0+PTX")
    assert B.smoke_lists(doc, wheels) == (doc["smoke_imports"], [])
    doc, wheels = _doc_and_wheel(tmp_path, "12.0+PTX", None)  # no build record: the plan's lists
    assert B.smoke_lists(doc, wheels) == (doc["smoke_imports"], [])


def test_the_builder_resolves_the_routed_modules_again_for_another_list(tmp_path):
    # `docker run --gpus all` on an H100 of a builder planned for 12.0+PTX (or a bake --set): 9.0a built.
    doc, wheels = _doc_and_wheel(tmp_path, "12.0+PTX", "9.0a")
    assert B.smoke_lists(doc, wheels) == (doc["smoke_imports"], ["sageattention._qattn_sm90"])
    # A builder planned for 9.0 that builds 12.0 only leaves it out.
    (tmp_path / "x").mkdir()
    doc, wheels = _doc_and_wheel(tmp_path / "x", "9.0", "12.0")
    assert doc["smoke_driver_imports"] == ["sageattention._qattn_sm90"]
    assert B.smoke_lists(doc, wheels) == (doc["smoke_imports"], [])
