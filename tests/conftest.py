"""Shared by every test: imagegen reads no compatibility overlay of the machine it runs on (a user's
`imagegen refresh` in ~/.config must not change what the tests see); tests that need one set
IMAGEGEN_COMPAT_DIR themselves.

And the run's own budget (issue 31: CI has 90 minutes, a contributor less patience): at its end the
suite prints its wall time, its ten slowest tests (setup, call and teardown together, which is
what a module-scoped build costs) and each integration module's seconds, and fails when the engine
tests left a dangling image or a volume behind. Both run in the process that reports (the xdist
controller when the suite runs on several workers), so two workers sharing one engine never see each
other's work in progress as a leftover."""

from __future__ import annotations

import os
import subprocess
import tempfile
import time
from collections import defaultdict
from pathlib import PurePosixPath

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
    """Dangling images, images named for a test registry on loopback (the registries' ports are the run's
    own, so any such name is a test's leftover) and volumes on the engine; None without a usable engine."""
    try:
        images = subprocess.run(["docker", "images", "-q", "--no-trunc", "-f", "dangling=true"], capture_output=True,
                                text=True, timeout=60)
        named = subprocess.run(["docker", "images", "--format", "{{.Repository}}:{{.Tag}}"], capture_output=True,
                               text=True, timeout=60)
        volumes = subprocess.run(["docker", "volume", "ls", "-q"], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    if images.returncode or named.returncode or volumes.returncode:
        return None
    loopback = {n for n in named.stdout.split() if n.startswith(("127.0.0.1:", "localhost:"))}
    return set(images.stdout.split()) | loopback, set(volumes.stdout.split())


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
        # The engine tests leave no dangling image and no volume behind (a pull by digest once left a
        # 9 GB untagged image and the ccache volume after every run). Judged only where they ran: a
        # unit run beside someone's build must not be charged with that build's images.
        if not any(n.startswith("tests/integration/") for n in self.seconds):
            return
        after = engine_leftovers()
        if self.engine_before is None or after is None:
            return
        new_images, new_volumes = after[0] - self.engine_before[0], after[1] - self.engine_before[1]
        if new_images or new_volumes:
            self.left_behind = (f"the tests left behind dangling or test-registry images {sorted(new_images)} and volumes"
                                f" {sorted(new_volumes)}")
            session.exitstatus = pytest.ExitCode.TESTS_FAILED

    def pytest_terminal_summary(self, terminalreporter, exitstatus: int, config: pytest.Config) -> None:
        tr = terminalreporter
        tr.section("run budget")
        tr.write_line(f"pytest wall time: {time.monotonic() - self.started:.0f} s for {len(self.seconds)} tests")
        # Where the workers' time went (their sum, so more than the wall time when they overlap)
        integration = sum(s for n, s in self.seconds.items() if n.startswith("tests/integration/"))
        tr.write_line(f"test seconds: integration {integration:.0f} s, the others"
                      f" {sum(self.seconds.values()) - integration:.0f} s")
        for nodeid, seconds in sorted(self.seconds.items(), key=lambda kv: -kv[1])[:SLOWEST_SHOWN]:
            tr.write_line(f"{seconds:8.1f} s  {nodeid}")
        # Every integration module's sum: where a fresh run's minutes go, module by module
        by_module: dict[str, float] = defaultdict(float)
        for nodeid, seconds in self.seconds.items():
            module = integration_module(nodeid)
            if module is not None:
                by_module[module] += seconds
        if by_module:
            tr.write_line("integration modules: " + ", ".join(
                f"{name} {seconds:.0f}" for name, seconds in sorted(by_module.items(), key=lambda kv: -kv[1])))
        if self.left_behind:
            tr.write_line(f"FAILED: {self.left_behind}", red=True)


def pytest_configure(config: pytest.Config) -> None:
    if _reporting(config):
        config.pluginmanager.register(RunBudget(), "imagegen-run-budget")


# ------------------------------------------------------------------ xdist: whole modules, heaviest first
# scripts/test.sh runs the suite on two xdist workers (--dist loadgroup --no-loadscope-reorder). Each
# integration module goes to one worker whole (its module-scoped build runs once); the modules that
# share the session's torch venv, or its torch image, go together (each is made once). The heaviest go
# first, so that the long push and pull of test_prebuilt (network and gzip: one core) overlap the
# compiles of the others, and the unit tests, one by one, fill in at the end. The grouping is this
# scheduler's own (xdist's loadgroup renames node ids, which pytest 9.2 no longer lets it do).
SHARED_GROUPS = {"test_audit": "torch-venv", "test_failfast": "torch-venv", "test_native": "torch-venv",
                 "test_repair": "torch-venv", "test_reuse_torch": "torch-venv",
                 "test_engine_bases": "torch-image", "test_engine_offline": "torch-image"}
# Measured on a fresh machine (benchmarks/RESULTS.md): test_prebuilt ~11 min (its 8.8 GB push and pull),
# test_engine_catalogue ~9 (a real package's cold compile: last, it was the run's tail), the torch image
# group ~6, torch-venv ~4.5, test_builders ~4, test_engine_build ~3.
HEAVIEST_FIRST = ["test_prebuilt", "test_engine_catalogue", "torch-image", "torch-venv", "test_builders",
                  "test_engine_build", "test_engine_signals", "test_engine_audit", "test_prebuilt_arm64",
                  "test_gpu_access_engine"]


def integration_module(nodeid: str) -> str | None:
    """The module name of an integration test (test_prebuilt); None for the others."""
    path = PurePosixPath(nodeid.split("::", 1)[0])
    return path.stem if path.parent.as_posix() == "tests/integration" else None


def group_of(nodeid: str) -> str | None:
    """The worker group of an integration test (None for the others, which go one by one)."""
    module = integration_module(nodeid)
    return None if module is None else SHARED_GROUPS.get(module, module)


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # stable: within a group and among the unit tests, collection order is kept
    rank = {name: n for n, name in enumerate(HEAVIEST_FIRST)}

    def key(item: pytest.Item) -> tuple[int, int]:
        group = group_of(item.nodeid)
        return (0, rank.get(group, len(rank))) if group is not None else (1, 0)
    items.sort(key=key)


def pytest_xdist_make_scheduler(config: pytest.Config, log):
    if config.getvalue("dist") != "loadgroup":
        return None
    from xdist.scheduler import LoadScopeScheduling

    class ModuleGroups(LoadScopeScheduling):
        def _split_scope(self, nodeid: str) -> str:
            return group_of(nodeid) or nodeid

    return ModuleGroups(config, log)
