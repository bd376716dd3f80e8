"""`imagegen setup engine|registry|qemu`: the shipped scripts (imagegen/resources/setup/) are what it runs and
what --print writes; as another user than root it runs nothing and says, in one line, how to re-run it with
sudo; a script that fails is exit 4 with its own lines above. A clone's scripts/install-*.sh run the same
files. The scripts themselves, run for real on a fresh Debian 12, are tests/integration/test_distribution.py's."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from imagegen import cli
from imagegen.commands import setup
from imagegen.errors import SetupError

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = ROOT / "imagegen" / "resources" / "setup"
IMAGEGEN = Path(sys.executable).parent / "imagegen"
PARTS = {"engine": "install-engine.sh", "registry": "install-registry.sh", "qemu": "install-qemu.sh"}
SOURCE_LINE = '. "$(dirname "$0")/lib/debian-mirror.sh"'


def run(argv: list[str], capfd) -> tuple[int, str, str]:
    code = cli.main(argv)
    out, err = capfd.readouterr()
    return code, out, err


def as_another_user(argv: list[str], **kwargs) -> subprocess.CompletedProcess:
    """``argv`` run by a user that is not root: nobody, where this test runs as root."""
    prefix = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"] if os.geteuid() == 0 else []
    return subprocess.run([*prefix, *argv], capture_output=True, text=True, timeout=60, **kwargs)


def test_the_package_ships_one_script_per_part_and_the_helper_they_source():
    assert setup.setup_dir() == SHIPPED
    assert {part: name for part, (name, _) in setup.PARTS.items()} == PARTS
    for name in [*PARTS.values(), "lib/debian-mirror.sh"]:
        proc = subprocess.run(["bash", "-n", str(SHIPPED / name)], capture_output=True, text=True)
        assert proc.returncode == 0, f"{name}: {proc.stderr}"
    sourcing = [n for n in PARTS.values() if SOURCE_LINE in (SHIPPED / n).read_text()]
    assert sourcing == ["install-engine.sh", "install-registry.sh"]


@pytest.mark.parametrize("part", list(PARTS))
def test_print_writes_the_shipped_script_with_its_helper_in_place(part, capfd):
    code, out, err = run(["setup", part, "--print"], capfd)
    assert code == 0 and err == ""
    shipped = (SHIPPED / PARTS[part]).read_text()
    assert out == setup.printed_script(part)
    if SOURCE_LINE not in shipped:
        assert out == shipped
        return
    helper = (SHIPPED / "lib" / "debian-mirror.sh").read_text().rstrip("\n")
    assert out == shipped.replace(SOURCE_LINE, "# --- lib/debian-mirror.sh, shipped beside this script ---\n"
                                  f"{helper}\n# --- end of lib/debian-mirror.sh ---")
    assert 'dirname "$0"' not in out  # nothing left that it reads beside itself
    proc = subprocess.run(["bash", "-n"], input=out, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr


def test_the_printed_helper_is_the_one_that_works(tmp_path, capfd):
    # The helper as --print writes it, run: it reads the mirror from the machine's sources as the sourced one does.
    _, out, _ = run(["setup", "engine", "--print"], capfd)
    helper = re.search(r"^# --- lib/debian-mirror.sh, shipped beside this script ---\n(.*?)^# --- end", out, re.S | re.M)
    sources = tmp_path / "debian.sources"
    sources.write_text("Types: deb\nURIs: http://mirror.example.invalid/debian\nSuites: bookworm bookworm-updates\n"
                       "Components: main\n\nTypes: deb\nURIs: http://security.example.invalid/debian-security\n"
                       "Suites: bookworm-security\nComponents: main\n")
    proc = subprocess.run(["bash", "-c", helper.group(1) + "\nmirror_uri bookworm && mirror_uri bookworm-security"],
                          env={**os.environ, "SOURCES": str(sources)}, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["http://mirror.example.invalid/debian", "http://security.example.invalid/debian-security"]


@pytest.mark.parametrize("part, why", [("engine", "starts dockerd"), ("registry", "installs packages"),
                                       ("qemu", "binfmt_misc")])
def test_another_user_than_root_is_told_to_use_sudo_and_nothing_runs(part, why):
    proc = as_another_user([str(IMAGEGEN), "setup", part], cwd="/")
    assert proc.returncode == 4 and proc.stdout == "", proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert proc.stderr.startswith(f"imagegen: error: imagegen setup {part} must run as root (")
    assert why in proc.stderr
    # the command root runs: this very imagegen by its path (sudo's PATH need not have it)
    assert f"re-run it with sudo: sudo {IMAGEGEN} setup {part} " in proc.stderr
    # --print needs no root
    printed = as_another_user([str(IMAGEGEN), "setup", part, "--print"], cwd="/")
    assert printed.returncode == 0 and printed.stdout == setup.printed_script(part), printed.stderr


def test_not_root_is_refused_before_any_script_runs(monkeypatch, capfd):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    code, out, err = run(["setup", "engine"], capfd)
    assert code == SetupError.exit_code == 4 and out == ""
    assert err.startswith("imagegen: error: imagegen setup engine must run as root") and err.count("\n") == 1
    assert "sudo" in err


def test_on_another_system_it_names_docker_desktop(monkeypatch, capfd):
    monkeypatch.setattr(sys, "platform", "darwin")
    monkeypatch.setattr(subprocess, "run", lambda *a, **k: pytest.fail(f"ran {a}"))
    code, _, err = run(["setup", "engine"], capfd)
    assert code == 4 and "Debian and Ubuntu" in err and "Docker Desktop" in err and err.count("\n") == 1


def test_without_apt_it_says_so(monkeypatch, capfd):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    real_which = setup.shutil.which
    monkeypatch.setattr(setup.shutil, "which", lambda name: None if name == "apt-get" else real_which(name))
    code, _, err = run(["setup", "qemu"], capfd)
    assert code == 4 and "no apt-get on PATH" in err and err.count("\n") == 1


def _fake_setup_dir(tmp_path: Path, monkeypatch, body: str) -> Path:
    """A setup folder whose install-engine.sh is ``body``, with the real helper beside it; root pretended."""
    folder = tmp_path / "setup"
    (folder / "lib").mkdir(parents=True)
    (folder / "lib" / "debian-mirror.sh").write_text((SHIPPED / "lib" / "debian-mirror.sh").read_text())
    (folder / "install-engine.sh").write_text(body)
    monkeypatch.setattr(setup, "setup_dir", lambda: folder)
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    return folder


def test_as_root_it_runs_the_script_with_bash_and_its_helper_beside_it(tmp_path, monkeypatch, capfd):
    marker = tmp_path / "ran"
    _fake_setup_dir(tmp_path, monkeypatch, "set -eu\n" + SOURCE_LINE + "\n"
                    f"type mirror_uri >/dev/null\nread -r line || echo \"no stdin\"\necho ran > {marker}\n"
                    "echo 'install-engine: ready'\n")
    code, out, err = run(["setup", "engine"], capfd)
    assert code == 0, err
    assert marker.read_text() == "ran\n"
    assert out == "no stdin\ninstall-engine: ready\n"  # its output as it is; nothing to read on stdin


def test_a_failing_script_is_exit_4_after_its_own_lines(tmp_path, monkeypatch, capfd):
    _fake_setup_dir(tmp_path, monkeypatch, "echo 'install-engine: FAILED: apt-get update failed' >&2\nexit 3\n")
    code, _, err = run(["setup", "engine"], capfd)
    assert code == 4
    assert err.splitlines() == ["install-engine: FAILED: apt-get update failed",
                                "imagegen: error: imagegen setup engine failed (install-engine.sh exited 3): the lines"
                                " above say why (imagegen setup engine --print shows the script)"]


def test_an_unknown_part_is_a_usage_error(capfd):
    code, _, err = run(["setup", "docker"], capfd)
    assert code == 2 and "invalid choice: 'docker'" in err and err.count("\n") == 1


@pytest.mark.parametrize("part", list(PARTS))
def test_the_clones_scripts_run_the_shipped_ones(part):
    # scripts/install-*.sh (scripts/test.sh runs them before any venv exists) run the shipped files: as another
    # user, the shipped script's own refusal (no docker on PATH: the engine is not taken as running). The
    # registry's script answers first when its tools are installed already, as on a machine the suite ran on.
    wrapper = ROOT / "scripts" / PARTS[part]
    assert f"imagegen/resources/setup/{PARTS[part]}" in wrapper.read_text()
    proc = as_another_user(["bash", str(wrapper)], cwd="/", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    refused = f"install-{part}: " + ("FAILED: " if part != "qemu" else "") + "must run as root"
    if part == "registry" and proc.returncode == 0:
        assert "\ninstall-registry: ready in " in proc.stdout, proc.stdout
    else:
        assert proc.returncode == 1 and proc.stderr.startswith(refused), proc.stdout + proc.stderr
