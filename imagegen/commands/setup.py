"""``imagegen setup engine|registry|qemu``: set up what builds in containers need on a Debian or Ubuntu
machine, with the shell scripts shipped in the package (imagegen/resources/setup/; a clone's
scripts/install-*.sh run the same files):

- ``engine``: a Docker engine and the buildx plugin, dockerd started (install-engine.sh);
- ``registry``: Debian's docker-registry and htpasswd, a container registry of this machine's own, its
  packaged service left stopped (install-registry.sh);
- ``qemu``: qemu-user-static registered with binfmt_misc, so that linux/arm64 build steps run on an x86_64
  machine (install-qemu.sh).

Each script is idempotent and needs root: run as another user, the command says how to re-run it with sudo
and runs nothing. ``--print`` writes the script to stdout instead, its sourced helper written into it, so
that what would run as root can be read first (or saved and run with bash)."""

from __future__ import annotations

import argparse
import os
import re
import shlex
import shutil
import subprocess
import sys
from importlib import resources
from pathlib import Path

from imagegen.errors import SetupError

# What each part sets up: the shipped script, and why it needs root (said when it is not).
PARTS = {
    "engine": ("install-engine.sh", "it installs packages and starts dockerd"),
    "registry": ("install-registry.sh", "it installs packages"),
    "qemu": ("install-qemu.sh", "it installs packages and registers QEMU with the kernel's binfmt_misc"),
}

# A script's line that sources a helper beside it (lib/debian-mirror.sh): --print writes the helper there.
_SOURCED = re.compile(r'^\. "\$\(dirname "\$0"\)/(lib/[a-z0-9-]+\.sh)"$', re.M)


def setup_dir() -> Path:
    """The folder of the shipped scripts (a real folder: a script sources its helper beside it)."""
    return Path(str(resources.files("imagegen") / "resources" / "setup"))


def script_path(part: str) -> Path:
    return setup_dir() / PARTS[part][0]


def printed_script(part: str) -> str:
    """The script of ``part`` as --print writes it: the shipped file, each helper it sources written in its
    place (between marker comments), so that it runs as it is, from anywhere."""
    folder = setup_dir()

    def inline(m: re.Match[str]) -> str:
        helper = (folder / m.group(1)).read_text(encoding="utf-8").rstrip("\n")
        return f"# --- {m.group(1)}, shipped beside this script ---\n{helper}\n# --- end of {m.group(1)} ---"

    return _SOURCED.sub(inline, script_path(part).read_text(encoding="utf-8"))


def _this_imagegen() -> str:
    """How root runs this same imagegen: sudo's PATH need not have it (pipx's ~/.local/bin, a venv)."""
    argv0 = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if argv0 is not None and argv0.name == "imagegen" and argv0.is_file():
        return shlex.quote(str(argv0.absolute()))
    return f"{shlex.quote(sys.executable)} -m imagegen"


def cmd_setup(args: argparse.Namespace) -> int:
    part = args.part
    if args.print:
        sys.stdout.write(printed_script(part))
        return 0
    name, why = PARTS[part]
    if not sys.platform.startswith("linux"):
        raise SetupError(f"imagegen setup {part} sets up Debian and Ubuntu machines (apt); on {sys.platform} install"
                         " Docker Desktop, which has buildx and QEMU, and check it with imagegen doctor")
    if os.geteuid() != 0:
        raise SetupError(f"imagegen setup {part} must run as root ({why}): re-run it with sudo: sudo"
                         f" {_this_imagegen()} setup {part} (`imagegen setup {part} --print` shows the script it runs)")
    missing = [tool for tool in ("bash", "apt-get") if shutil.which(tool) is None]
    if missing:
        raise SetupError(f"imagegen setup {part} needs a Debian or Ubuntu machine: no {' or '.join(missing)} on PATH"
                         " (elsewhere install Docker with buildx from your distribution, then run imagegen doctor)")
    code = run_script(script_path(part))
    if code != 0:
        raise SetupError(f"imagegen setup {part} failed ({name} exited {code}): the lines above say why"
                         f" (imagegen setup {part} --print shows the script)")
    return 0


def run_script(path: Path) -> int:
    """Run a shipped script with bash, its output on this terminal and nothing on its stdin; its exit code."""
    return subprocess.run(["bash", str(path)], stdin=subprocess.DEVNULL).returncode
