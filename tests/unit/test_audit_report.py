"""Tests for imagegen.model.audit_report: the audit report a stranger's build wrote, read bounded, and the
verdict as the plan, the manifest and `plan --audit --json` show it."""

from __future__ import annotations

import json

import pytest

from imagegen.errors import BuildError
from imagegen.model.arch import CudaArch
from imagegen.model.audit_report import AuditReport, ExtensionAudit, Verdict, parse_target


@pytest.mark.parametrize("text, want", [
    ("sm_90a", CudaArch(9, 0, "a")), ("compute_120", CudaArch(12, 0, sass=False, ptx=True)),
    ("sm_100f", CudaArch(10, 0, "f")), ("sm_86", CudaArch(8, 6)),
    ("native", None), ("sm_9", None), ("compute_90a,code", None),
])
def test_parse_target_reads_sass_and_ptx_names_and_nothing_else(text, want):
    assert parse_target(text) == want


def _report(**ext) -> AuditReport:
    base = {"module": "pkg._C", "sass": ["sm_80", "sm_90a"], "ptx": ["compute_90"], "sources": 3, "cuda_sources": 2,
            "nvcc_flags": ["-O3"], "std_args": [{"tool": "nvcc", "args": ["-std=c++17"]}, {"tool": "cxx", "args": ["-std=c++20"]}],
            "probe": [{"compiler": "nvcc", "tool": "nvcc", "what": "parse", "ok": False, "error": "#error C++20", "seconds": 1.5}]}
    return AuditReport.from_json({"ok": True, "exit": 0, "seconds": 4.0, "extensions": [{**base, **ext}]})


def test_an_extension_reads_its_targets_its_lowest_standard_and_its_probe():
    [e] = _report().extensions
    assert isinstance(e, ExtensionAudit) and e.compiles_cuda
    assert e.targets == [CudaArch(8, 0), CudaArch(9, 0, "a"), CudaArch(9, 0, sass=False, ptx=True)]
    assert e.lowest_std is not None and e.lowest_std.year == 2017  # the oldest of its compiles
    assert (e.probe[0].compiler, e.probe[0].ok, e.probe[0].error) == ("nvcc", False, "#error C++20")
    cpu = _report(sass=[], ptx=[]).extensions[0]
    assert not cpu.compiles_cuda and cpu.targets == []


def test_a_verdict_is_ok_without_refusals_and_says_its_findings_in_order():
    r = _report()
    assert Verdict(report=r).ok and not Verdict(report=r, refusals=("x",)).ok
    v = Verdict(report=r, refusals=("no sm_120",), warnings=("extra sm_80",), notes=("probe agrees",))
    assert v.findings() == ["refused: no sm_120", "warning: extra sm_80", "note: probe agrees"]
    assert v.findings(refusals=False) == ["warning: extra sm_80", "note: probe agrees"]
    assert v.rows() == [("pkg._C", "sm_80 sm_90a", "compute_90", "-O3")]
    assert v.table().splitlines()[0].split() == ["extension", "SASS", "PTX", "nvcc", "flags"]


def test_a_verdicts_record_is_json_with_the_extensions_standard_and_probe():
    record = Verdict(report=_report(), refusals=("no sm_120",)).as_dict()
    assert json.loads(json.dumps(record)) == record
    assert (record["verdict"], record["refusals"], record["build_exit"]) == ("refused", ["no sm_120"], 0)
    [ext] = record["extensions"]
    assert ext["cxx_std"] == "-std=c++17" and ext["probe"][0]["error"] == "#error C++20"
    assert "link_missing" not in ext


def test_a_report_that_cannot_be_read_is_a_build_error(tmp_path):
    (tmp_path / "audit.json").write_text("{not json")
    with pytest.raises(BuildError, match="cannot read the audit report"):
        AuditReport.load(tmp_path / "audit.json")


def test_a_hostile_report_is_bounded():
    data = {"ok": True, "exit": 0, "extensions": [{"module": "x" * 10_000, "sass": ["sm_80"] * 100_000, "ptx": "nope"}] * 1000}
    r = AuditReport.from_json(data)
    assert len(r.extensions) <= 500 and len(r.extensions[0].module) <= 300 and len(r.extensions[0].sass) <= 200
    assert r.extensions[0].ptx == ()


def test_the_build_phases_travel_from_the_report_to_the_plans_record_and_are_bounded():
    data = {"ok": True, "exit": 0, "build": {"before": 3.5, "compiles": 9.25, "after": 1.0, "records": 160,
                                            "hostile": "x" * 100, "extra": True}}
    r = AuditReport.from_json(data)
    assert r.build_phases == {"before": 3.5, "compiles": 9.25, "after": 1.0, "records": 160.0}
    assert AuditReport.from_json({"ok": True, "exit": 0, "build": "nope"}).build_phases == {}
    assert Verdict(report=r).as_dict()["build"] == {"before": 3.5, "compiles": 9.25, "after": 1.0, "records": 160.0}
    assert "build" not in Verdict(report=AuditReport.from_json({"ok": True, "exit": 0})).as_dict()
