"""The hostile campaign's own judgement (benchmarks/hostile_campaign.py, issue 32): how it classifies an
invocation, what it counts as a leak or an unsafe message, and that it still covers the 16 classes with
a campaign of the original's size. The campaign itself is a benchmark, not part of the suite (it takes
~25 minutes); docs/security.md has its figures."""

from __future__ import annotations

import base64
import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "hostile_campaign.py"


@pytest.fixture(scope="module")
def campaign():
    spec = importlib.util.spec_from_file_location("hostile_campaign", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    sys.modules["hostile_campaign"] = module  # its dataclasses look their module up there
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        sys.modules.pop("hostile_campaign", None)


@pytest.mark.parametrize("rc, out, err, timed_out, kind", [
    (None, "", "", True, "hang"),
    (0, "", "", True, "hang"),  # killed at its time limit, whatever it would have said
    (-9, "", "", False, "crash"),  # the address-space or file-size limit, or a signal
    (-25, "", "", False, "crash"),
    (1, "", "Traceback (most recent call last):\n  File ...\nValueError: x\n", False, "traceback"),
    (0, "Traceback (most recent call last):\n", "", False, "traceback"),
    (70, "", "imagegen: internal error: OSError: x (re-run with IMAGEGEN_DEBUG=1 ...)\n", False, "exit70"),
    (0, "wrote x\n", "imagegen: warning: y\n", False, "ok"),
    (2, "", "imagegen: error: --torch: give a value\n", False, "refused"),
    (9, "table\n", "imagegen: warning: a manifest not read\nimagegen: error: 1 refused\n", False, "refused"),
    (2, "", "imagegen: error: one\nimagegen: error: two\n", False, "messy"),
    (5, "", "imagegen: error: the reason\nmore words after it\n", False, "messy"),
    (1, "", "usage: imagegen ...\n", False, "messy"),
    (4, "", "", False, "messy"),
])
def test_classify(campaign, rc, out, err, timed_out, kind):
    assert campaign.classify(rc, out, err, timed_out) == kind


@pytest.mark.parametrize("text, unsafe", [
    ("imagegen: error: plain words, café, 日本語\n", False),
    ("imagegen: error: tab\tis fine\n", False),
    ("imagegen: error: \x1b[31mred\n", True),
    ("imagegen: error: a\rb\n", True),
    ("imagegen: error: \u202eevil\n", True),
    ("imagegen: error: line\u2028two\n", True),
    ("imagegen: error: \x9bcsi\n", True),
    ("imagegen: error: \\x1b[31m escaped is fine\n", False),
])
def test_unsafe_text(campaign, text, unsafe):
    assert campaign.unsafe_text(text) is unsafe


def test_a_leak_is_the_token_or_a_basic_auth_header_carrying_it(campaign):
    token = campaign.TOKEN
    assert campaign.leaks(f"error at https://u:{token}@h/".encode())
    assert campaign.leaks(b"Authorization: Basic " + base64.b64encode(f"{campaign.LOGIN}:{token}".encode()))
    assert campaign.leaks(base64.b64encode(f"__token__:{token}".encode()))
    assert not campaign.leaks(b"https://***@h/ and Basic ***")
    assert not campaign.leaks(token[:-1].encode())  # half a token is the redactor's business (test_hostile_round2)


def test_placeholders_are_replaced_where_braces_stay(campaign):
    assert campaign.sub("@C@/cwd/{package}/@F@", {"C": "/c", "F": "/f"}) == "/c/cwd/{package}//f"


def test_the_campaign_covers_the_16_classes_at_the_originals_size():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--list"], capture_output=True, text=True, timeout=300,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    rows = {line.split()[0]: int(line.split()[1]) for line in proc.stdout.splitlines()}
    assert len([k for k in rows if k != "total"]) == 16 and all(n >= 10 for n in rows.values()), rows
    invocations = int(proc.stdout.splitlines()[-1].split(" cases, ")[1].split()[0])
    assert 1400 <= invocations <= 1700, proc.stdout  # the 2026-11-24 campaign made 1420


def test_plain_git_runs_each_planted_command_so_none_running_under_imagegen_means_something(campaign, tmp_path):
    ran = campaign.plant_controls(tmp_path)
    assert set(ran) <= set(campaign.PLANT_KINDS) and len(ran) >= 15
    assert all(ran.values()), [kind for kind, yes in ran.items() if not yes]
