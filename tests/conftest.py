"""Shared by every test: imagegen reads no compatibility overlay of the machine it runs on (a user's
`imagegen refresh` in ~/.config must not change what the tests see); tests that need one set
IMAGEGEN_COMPAT_DIR themselves.

And the run's own budget (issue 31: CI has 90 minutes, a contributor less patience): at its end the
suite prints its wall time and its ten slowest tests (setup, call and teardown together, which is
what a module-scoped build costs), and fails when the engine tests left a dangling image or a volume
behind. Both run in the process that reports (the xdist controller when the suite runs on several
workers), so two workers sharing one engine never see each other's work in progress as a leftover."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections import defaultdict

import pytest

SLOWEST_SHOWN = 10


@pytest.fixture(scope="session", autouse=True)
def no_host_compat_overlay():
    saved = os.environ.get("IMAGEGEN_COMPAT_DIR")
    with tempfile.TemporaryDirectory(prefix="imagegen-no-overlay-") as empty:
        os.environ["IMAGEGEN_COMPAT_DIR"] = empty
        from imagegen.model import compat

        compat.reload()
        yield
    if saved is None:
        os.environ.pop("IMAGEGEN_COMPAT_DIR", None)
    else:
        os.environ["IMAGEGEN_COMPAT_DIR"] = saved


def _reporting(config: pytest.Config) -> bool:
    """True in the process that prints the summary (not in an xdist worker)."""
    return not hasattr(config, "workerinput")


def engine_leftovers() -> tuple[set[str], set[str]] | None:
    """Dangling images and volumes on the engine; None without a usable engine."""
    try:
        images = subprocess.run(["docker", "images", "-q", "--no-trunc", "-f", "dangling=true"], capture_output=True,
                                text=True, timeout=60)
        volumes = subprocess.run(["docker", "volume", "ls", "-q"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if images.returncode or volumes.returncode:
        return None
    return set(images.stdout.split()), set(volumes.stdout.split())


class RunBudget:
    """Per-test seconds (all phases), the run's wall time, and the engine's leftovers before and after."""

    def __init__(self) -> None:
        self.started = time.monotonic()
        self.seconds: dict[str, float] = defaultdict(float)
        self.engine_before = engine_leftovers()
        self.left_behind = ""

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    @pytest.hookimpl(trylast=True)
    def pytest_sessionfinish(self, session: pytest.Session, exitstatus: int) -> None:
        # The suite leaves no dangling image and no volume behind on the engine (a pull by digest once
        # left a 9 GB untagged image and the ccache volume after every run).
        after = engine_leftovers()
        if self.engine_before is None or after is None:
            return
        new_images, new_volumes = after[0] - self.engine_before[0], after[1] - self.engine_before[1]
        if new_images or new_volumes:
            self.left_behind = (f"the tests left behind dangling images {sorted(new_images)} and volumes"
                                f" {sorted(new_volumes)}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        tr = terminalreporter
        tr.section("run budget")
        tr.write_line(f"pytest wall time: {time.monotonic() - self.started:.0f} s for {len(self.seconds)} tests")
        for nodeid, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1])[:SLOWEST_SHOWN]:
            tr.write_line(f"{seconds:8.1f} s  {nodeid}")
        if self.left_behind:
            tr.write_line(f"FAILED: {self.left_behind}", red=True)


def pytest_configure(config: pytest.Config) -> None:
    if _reporting(config):
        config.pluginmanager.register(RunBudget(), "imagegen-run-budget")
