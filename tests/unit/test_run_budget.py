"""The suite's own budget report (tests/conftest.py, issue 31): per-test seconds summed over setup,
call and teardown, the ten slowest shown, and an engine leftover (a dangling image, a volume) failing
the run. The engine's answers are given here; the real engine is asked at the end of every run."""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from tests import conftest


class Reporter:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def section(self, title: str) -> None:
        self.lines.append(f"== {title}")

    def write_line(self, line: str, **markup) -> None:
        self.lines.append(line)


def report(nodeid: str, duration: float):
    return types.SimpleNamespace(nodeid=nodeid, duration=duration)


def test_the_slowest_tests_are_summed_over_their_phases_and_ten_are_shown(monkeypatch):
    monkeypatch.setattr(conftest, "engine_leftovers", lambda: None)
    budget = conftest.RunBudget()
    for n in range(12):
        budget.pytest_runtest_logreport(report(f"t{n}", n))
    budget.pytest_runtest_logreport(report("t0", 100.0))  # a module build in t0's setup
    tr = Reporter()
    budget.pytest_terminal_summary(tr, 0, None)
    assert tr.lines[0] == "== run budget" and tr.lines[1].endswith("s for 12 tests")
    assert tr.lines[2] == "test seconds: integration 0 s, the others 166 s"
    shown = [line.split()[-1] for line in tr.lines[3:]]
    assert shown == ["t0", "t11", "t10", "t9", "t8", "t7", "t6", "t5", "t4", "t3"]
    assert tr.lines[3] == "   100.0 s  t0"


@pytest.mark.parametrize("after, failed", [
    (({"sha256:old"}, {"vol-old"}), False),
    (({"sha256:old", "sha256:new"}, {"vol-old"}), True),
    (({"sha256:old"}, {"vol-old", "imagegen-test-ccache-1"}), True),
])
def test_an_image_or_volume_left_on_the_engine_fails_the_run(monkeypatch, after, failed):
    answers = iter([({"sha256:old"}, {"vol-old"}), after])
    monkeypatch.setattr(conftest, "engine_leftovers", lambda: next(answers))
    budget = conftest.RunBudget()
    budget.pytest_runtest_logreport(report("tests/integration/test_engine_build.py::t", 1.0))
    session = types.SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    budget.pytest_sessionfinish(session, 0)
    assert (session.exitstatus == pytest.ExitCode.TESTS_FAILED) == failed
    tr = Reporter()
    budget.pytest_terminal_summary(tr, 0, None)
    assert any(line.startswith("FAILED: the tests left behind") for line in tr.lines) == failed


def test_no_engine_is_no_leftover(monkeypatch):
    monkeypatch.setattr(conftest, "engine_leftovers", lambda: None)
    budget = conftest.RunBudget()
    session = types.SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    budget.pytest_sessionfinish(session, 0)
    assert session.exitstatus == pytest.ExitCode.OK


def test_integration_modules_go_to_a_worker_whole_and_the_shared_ones_together():
    assert conftest.group_of("tests/integration/test_prebuilt.py::test_push") == "test_prebuilt"
    assert conftest.group_of("tests/integration/test_native.py::test_x[a]") == "torch-venv"
    assert conftest.group_of("tests/integration/test_audit.py::test_y") == "torch-venv"
    assert conftest.group_of("tests/integration/test_engine_offline.py::t") == "torch-image"
    assert conftest.group_of("tests/integration/test_engine_bases.py::t") == "torch-image"
    assert conftest.group_of("tests/unit/test_native.py::test_x") is None  # a unit test goes on its own
    # every module named in the tables exists, so a renamed one cannot silently lose its group
    integration = {p.stem for p in (Path(conftest.__file__).parent / "integration").glob("test_*.py")}
    assert set(conftest.SHARED_GROUPS) <= integration
    assert {g for g in conftest.HEAVIEST_FIRST if g.startswith("test_")} <= integration


def test_a_run_without_engine_tests_never_asks_the_engine(monkeypatch):
    answers = iter([({"sha256:old"}, set()), ({"sha256:old", "sha256:someone-elses-build"}, set())])
    monkeypatch.setattr(conftest, "engine_leftovers", lambda: next(answers))
    budget = conftest.RunBudget()
    budget.pytest_runtest_logreport(report("tests/unit/test_plan.py::t", 1.0))
    session = types.SimpleNamespace(exitstatus=pytest.ExitCode.OK)
    budget.pytest_sessionfinish(session, 0)
    assert session.exitstatus == pytest.ExitCode.OK
