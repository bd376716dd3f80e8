"""The catalogue's gencode-audit data (issue 15: every recipe x version audited over its claimed archs,
docs/records/audit-catalogue.md): patches, per-extension arch tables and the rules the sweep added agree with
each other and with what the audit judges."""

from __future__ import annotations

import re

import pytest
from packaging.version import Version

from imagegen.model.audit import judge

from imagegen.model.audit_report import AuditReport
from imagegen.model.arch_parse import parse_arch_list
from imagegen.model.catalogue import builtin_recipe_dir, load_catalogue
from imagegen.model.cell import BUILDABLE, REJECTED
from imagegen.plan.matrix import make_cell

CAT = load_catalogue()
RECIPES = [CAT.get(n) for n in CAT.names()]
VERSIONS = [(r, v) for r in RECIPES for v in r.versions.values()]


def _id(rv):
    r, v = rv
    return f"{r.name}-{v.version}"


def _all_patches(v):
    """A version's patches and those its by_torch entries add for some torch releases."""
    return [*v.patches, *(p for facts in v.by_torch for p in facts.patches)]


def test_every_shipped_patch_is_used_by_a_recipe():
    used = {p.name for _, v in VERSIONS for p in _all_patches(v)}
    shipped = {p.name for p in (builtin_recipe_dir() / "patches").glob("*.patch")}
    assert shipped - used == set(), "patch files no recipe version applies"
    assert used - shipped == set()


@pytest.mark.parametrize("rv", [rv for rv in VERSIONS if _all_patches(rv[1])], ids=_id)
def test_patches_are_git_diffs_with_a_reason(rv):
    _, v = rv
    for p in _all_patches(v):
        assert p.reason.strip(), f"{p.name}: say why the patch is needed"
        heads = re.findall(r"^diff --git a/(\S+) b/(\S+)$", p.text, re.M)
        assert heads and all(a == b for a, b in heads), p.name
        assert re.search(r"^@@ -\d+(,\d+)? \+\d+(,\d+)? @@", p.text, re.M), p.name


@pytest.mark.parametrize("rv", [rv for rv in VERSIONS if rv[1].extensions], ids=_id)
def test_extension_tables_name_archs_the_version_supports(rv):
    _, v = rv
    supported = {a.cc for a in v.archs}
    for module, archs in v.extensions.items():
        assert {a.cc for a in archs} <= supported, f"{module}: {archs} outside the version's archs {v.archs}"


def _report(*exts):
    return AuditReport.from_json({"ok": True, "exit": 0, "seconds": 1.0,
                                  "extensions": [{"module": m, "sass": s, "ptx": p} for m, s, p in exts]})


FULL = "7.5;8.0;8.6;8.7;8.9;9.0;10.0;10.3;11.0;12.0;12.1"
FULL_SASS = ["sm_75", "sm_80", "sm_86", "sm_87", "sm_89", "sm_90", "sm_100", "sm_103", "sm_110", "sm_120", "sm_121"]


@pytest.mark.parametrize("version", ["0.0.32", "0.0.33.post2"])
def test_xformers_bundled_fa3_gets_sm90a_and_its_table(version):
    v = CAT.get("xformers").version(version)
    assert [p.name for p in v.patches] == [f"xformers-{version}-fa3-sm90a.patch"]
    assert 'if num == 90:\n+            suffix = "a"' in v.patches[0].text
    table = v.extensions["xformers.flash_attn_3._C"]
    assert [(a.cc, a.variant) for a in table] == [("8.0", ""), ("9.0", "a")]
    # What the audit showed after the patch (docs/records/audit-catalogue.md), over the full claimed list:
    # no refusal, and no warning that FA3 lacks the archs xformers never gives it.
    after = _report(("xformers.flash_attn_3._C", ["sm_80", "sm_90a"], []), ("xformers._C", FULL_SASS, []))
    verdict = judge(after, recipe_name="xformers", version_label=version, requested=parse_arch_list(FULL),
                    nvcc=Version("13.0"), extension_archs=v.extensions)
    assert verdict.ok and not verdict.warnings, (verdict.refusals, verdict.warnings)
    # FA3 handed a Blackwell arch would be refused.
    wrong = _report(("xformers.flash_attn_3._C", ["sm_80", "sm_90a", "sm_100"], []), ("xformers._C", FULL_SASS, []))
    verdict = judge(wrong, recipe_name="xformers", version_label=version, requested=parse_arch_list(FULL),
                    nvcc=Version("13.0"), extension_archs=v.extensions)
    assert not verdict.ok and "xformers.flash_attn_3._C would be compiled for sm_100" in verdict.refusals[0]


def test_fa3_3_0_0b1_builds_only_with_cuda_12_8():
    r = CAT.get("flash-attn-3")
    v = r.version("3.0.0b1")
    c = make_cell(r, v, "2.11", "13.0", "3.11", parse_arch_list("8.0;9.0"), "runpod")
    assert c.status == REJECTED and any("needs CUDA == 12.8" in p for p in c.problems), c.problems
    c = make_cell(r, v, "2.8", "12.8", "3.12", parse_arch_list("8.0;9.0"), "runpod")
    assert c.status == BUILDABLE, c.problems
    # main's hopper/setup.py uses the system nvcc on CUDA 13: no such rule there.
    c = make_cell(r, r.version("3.0.0"), "2.11", "13.0", "3.11", parse_arch_list("8.0;9.0"), "runpod")
    assert c.status == BUILDABLE, c.problems
