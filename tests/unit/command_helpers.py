"""Shared by the tests of imagegen.commands.*: the argparse Namespace a command gets (from imagegen.cli's
own parser), a stand-in host Python for the native paths, and guards that fail a test which reaches
the engine (docker, buildx, a registry) instead of stopping before it."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import pytest

from imagegen import cli
from imagegen.commands import common
from imagegen.model.catalogue import Catalogue
from imagegen.plan.config import Config

ROOT = Path(__file__).resolve().parents[2]
FIXTURES = ROOT / "tests" / "fixtures"
TINY = FIXTURES / "tiny_kernel"
WHEEL = next((FIXTURES / "wheels").glob("tiny_kernel-*.whl"))  # sm_80, sm_90 and compute_90
# One buildable cell of the catalogue's SageAttention, pinned on every axis.
CELL = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]


def parse(*argv: str) -> argparse.Namespace:
    """The Namespace imagegen's parser makes of ``argv`` (what imagegen.cli hands to a command)."""
    return cli.parse([str(a) for a in argv])


def call(command, *argv: str) -> int:
    """Run ``command`` (a cmd_* function) the way imagegen.cli.main does, without its error handling."""
    return command(parse(*argv))


def native_cell(args: argparse.Namespace, cat: Catalogue):
    """The native cell a command makes of ``args`` (no config file): its options resolved once, as the command does."""
    return common.native_cell(args, cat, common.resolved(args, Config()))


def fake_host(tmp_path: Path, *, python: str = "3.12", torch: str | None = "2.8.0", torch_cuda: str | None = "12.8",
              nvcc: str | None = "12.8") -> str:
    """A stand-in host interpreter for the native paths: answers imagegen's probe (``python -c ...``)
    with these facts and a CUDA_HOME whose nvcc reports ``nvcc``; runs anything else (the in-build
    script) with this Python. Returns its path."""
    home = tmp_path / "host-cuda"
    (home / "bin").mkdir(parents=True, exist_ok=True)
    (home / "include").mkdir(exist_ok=True)
    (home / "include" / "cuda_runtime.h").write_text("")
    nvcc_exe = home / "bin" / "nvcc"
    nvcc_exe.write_text(f"#!/bin/sh\necho 'Cuda compilation tools, release {nvcc}, V{nvcc}.0'\n" if nvcc else
                        "#!/bin/sh\nexit 1\n")
    nvcc_exe.chmod(0o755)
    facts = {"python": python, "torch": torch, "torch_cuda": torch_cuda, "cuda_home": str(home)}
    exe = tmp_path / "host-bin" / "python"
    exe.parent.mkdir(exist_ok=True)
    exe.write_text("#!/bin/sh\n"
                   f"if [ \"$1\" = \"-c\" ]; then echo '{json.dumps(facts)}'; exit 0; fi\n"
                   f"exec '{sys.executable}' \"$@\"\n")
    exe.chmod(0o755)
    return str(exe)


def never(what: str):
    """A stand-in for a step that talks to the engine or a registry: the test failed to stop before it."""
    def refuse(*args, **kwargs):
        pytest.fail(f"reached {what}: the command did not stop before the engine")
    return refuse
