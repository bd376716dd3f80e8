"""Tests for imagegen.executors.results: the results table (aligned columns, times, ccache hits, the
failure blocks with their log and tail) and the JSON form of built, up-to-date and failed cells."""

from __future__ import annotations

import json
from pathlib import Path

from imagegen.executors.results import results_json, summary
from imagegen.model.cell import CellResult
from tests.unit.executor_fixtures import tiny_cell


def _results(tmp_path: Path) -> list[CellResult]:
    built = CellResult(tiny_cell(python="3.11"), "built", wheel=tmp_path / "out" / "tiny-1.whl", seconds=83.4,
                       ccache={"hits": 3, "misses": 1, "hit_rate": 0.75})
    cached = CellResult(tiny_cell(python="3.12"), "up-to-date", wheel=tmp_path / "out" / "tiny-2.whl")
    failed = CellResult(tiny_cell(python="3.13"), "failed", log=tmp_path / "logs" / "c.log", seconds=4.0,
                        error="csrc/add_one.cu(7): error: x is undefined (the build failed)",
                        log_tail=["#5 1.0 error: x is undefined", "#5 ERROR: exit code: 1"])
    return [built, cached, failed]


def test_summary_is_a_table_with_one_row_per_cell_in_aligned_columns(tmp_path):
    built, cached, failed = _results(tmp_path)
    lines = summary([built, cached, failed]).splitlines()
    header, rows = lines[0], lines[1:4]
    assert header.split() == ["CELL", "STATUS", "TIME", "WHEEL", "/", "ERROR"]
    # Every row's status and time columns start where the header's do.
    for column in ("STATUS", "TIME", "WHEEL / ERROR"):
        at = header.index(column)
        assert all(row[at - 2:at] == "  " and row[at] != " " for row in rows), (column, rows)
    assert rows[0].split()[:3] == [built.cell.name, "built", "83s"]
    assert rows[1].split()[:3] == [cached.cell.name, "up-to-date", "-"]  # no time: nothing was built
    assert rows[2].split()[:3] == [failed.cell.name, "failed", "4s"]


def test_summary_shows_the_wheel_of_a_built_cell_with_its_ccache_hits(tmp_path):
    built, cached, _ = _results(tmp_path)
    text = summary([built, cached])
    assert f"{built.wheel}  (ccache 3/4 hits)" in text
    assert text.splitlines()[2].endswith(str(cached.wheel))  # no ccache report: nothing appended


def test_summary_leaves_out_a_ccache_report_without_a_hit_rate(tmp_path):
    built, _, _ = _results(tmp_path)
    built.ccache = {"hits": 0, "misses": 0, "hit_rate": None}  # ccache had nothing to say
    assert "ccache" not in summary([built])


def test_summary_ends_with_each_failures_error_log_and_tail(tmp_path):
    built, _, failed = _results(tmp_path)
    text = summary([failed, built])
    block = text.split("\n\n", 1)[1].splitlines()
    assert block == [f"{failed.cell.name} failed: {failed.error}", f"  full log: {failed.log}",
                     "  | #5 1.0 error: x is undefined", "  | #5 ERROR: exit code: 1"]
    assert text.count(" failed: ") == 1  # a built cell gets no block


def test_summary_of_a_failure_without_a_log_names_no_log(tmp_path):
    refused = CellResult(tiny_cell(), "failed", error="a wheel of other archs would be replaced")
    text = summary([refused])
    assert text.endswith(f"\n\n{refused.cell.name} failed: a wheel of other archs would be replaced")
    assert "full log" not in text and "|" not in text.split("\n\n", 1)[1]


def test_summary_of_no_results_is_the_header_alone():
    assert summary([]) == "CELL  STATUS  TIME  WHEEL / ERROR"


def test_results_json_is_every_cells_record_in_order(tmp_path):
    results = _results(tmp_path)
    data = json.loads(results_json(results))
    assert [d["cell"] for d in data] == [r.cell.name for r in results]
    assert [d["status"] for d in data] == ["built", "up-to-date", "failed"]
    assert data[0]["wheel"] == str(results[0].wheel) and data[0]["seconds"] == 83.4
    assert data[0]["ccache"] == {"hits": 3, "misses": 1, "hit_rate": 0.75}
    assert data[2]["wheel"] is None and data[2]["log"] == str(results[2].log)
    assert data[2]["error"].endswith("(the build failed)")
    assert set(data[1]) == {"cell", "status", "wheel", "log", "seconds", "error", "verify", "smoke", "ccache", "audit"}


def test_results_json_of_no_results_is_an_empty_list():
    assert json.loads(results_json([])) == []
