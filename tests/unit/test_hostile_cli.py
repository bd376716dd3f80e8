"""Hostile and broken input on the command line (issue 16): CLI values, output files, messages.

Each defect found gets its regression test here; the fuzz test at the end drives every subcommand
with generated hostile values and checks the contract: exit 0 or the documented code with exactly
one short ``imagegen: error:`` line, never an internal error, a traceback or a hang, nothing
written outside the output folder, and no extra instruction in anything rendered.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import http.server
import io
import json
import os
import shutil
import signal
import socket
import stat
import struct
import tempfile
import threading
import time
import tracemalloc
import zipfile
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from imagegen import cli, outputs
from imagegen.plan import registry
from imagegen.finish import fatbin
from imagegen.finish import verify
from imagegen.errors import ImagegenError, UsageError
from imagegen.executors import prebuilt
from imagegen.model.arch_parse import parse_arch_list
from imagegen.publish import push

ROOT = Path(__file__).resolve().parents[2]
CELL = ["--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0"]


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = cli.main(list(argv))
        except SystemExit as exc:  # argparse --help
            code = exc.code if isinstance(exc.code, int) else 0
    return code, out.getvalue(), err.getvalue()


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("imagegen: error:")]
    assert len(lines) == 1, err[-2000:]
    assert len(lines[0]) < 400 and "Traceback" not in err and "internal error" not in err, lines[0]
    return lines[0]


# ------------------------------------------------------------------- 1. injection through values


def test_bake_refuses_an_interpolation_as_a_path_and_writes_nothing(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for flag in ("--dockerfiles", "--out"):
        code, _, err = run("bake", "sage", *CELL, flag, "${IMAGEGEN_PIP_CERT}")
        assert code == 2 and "is not allowed" in one_error(err)
    assert list(tmp_path.iterdir()) == []


def test_bake_print_without_buildx_is_not_a_silent_success(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PATH", str(tmp_path / "nothing-here"))
    code, _, err = run("bake", "sage", *CELL, "--print")
    assert code == 4 and "not installed" in one_error(err)


def _ps_strings(line: str) -> list[str]:
    """PowerShell's reading of the single-quoted strings in ``line``: any of ' U+2018-U+201B opens and
    closes one, two in a row are one literal quote. Returns the strings; raises on an open string."""
    quotes = "'\u2018\u2019\u201a\u201b"
    out, i = [], 0
    while i < len(line):
        if line[i] in quotes:
            i += 1
            buf = ""
            while True:
                if i >= len(line):
                    raise AssertionError(f"unterminated string in {line!r}")
                if line[i] in quotes:
                    if i + 1 < len(line) and line[i + 1] in quotes:
                        buf += line[i + 1]
                        i += 2
                        continue
                    i += 1
                    break
                buf += line[i]
                i += 1
            out.append(buf)
        else:
            i += 1
    return out


@pytest.mark.parametrize("quote", ["'", "\u2018", "\u2019", "\u201a", "\u201b"])
def test_powershell_quotes_every_single_quote_character(quote):
    src = f"C:\\src{quote}; Start-Process calc; {quote}"
    python = f"C:\\py{quote}thon.exe"
    code, out, err = run("render", "sage", "--arch", "9.0", "--shell", "powershell", "--src-dir", src, "--python-exe", python,
                         "--torch", "2.8", "--cuda", "12.8", "--python", "3.12")  # nothing run here: named
    assert code == 0, err
    [src_line] = [line for line in out.splitlines() if line.startswith("$Src = ")]
    assert _ps_strings(src_line) == [src]
    assert src_line.endswith(quote * 2 + "')")  # the string ends with the doubled quote, then closes
    [exe_line] = [line for line in out.splitlines() if line.startswith("$PythonExe = '")]
    assert _ps_strings(exe_line) == [python]
    assert not any(line.lstrip().startswith("Start-Process") for line in out.splitlines())


@pytest.mark.parametrize("flag, value", [
    ("--vcvars", "C:\\vs\u201d; calc; \u201c"), ("--vcvars", 'C:\\vs"x'), ("--src-dir", "C:\\a\nStart-Process calc"),
    ("--python-exe", "py\u2028calc"), ("--src-dir", "C:\\a$(calc)"), ("--src-dir", "C:\\a`ncalc"),
])
def test_powershell_refuses_what_it_cannot_quote(flag, value):
    code, out, err = run("render", "sage", "--arch", "9.0", "--shell", "powershell", flag, value)
    assert code == 2 and out == "" and "cannot be" in one_error(err)


@pytest.mark.parametrize("value", ['C:\\a" & calc & "', "C:\\a%PATH%", "C:\\a\r\ncalc", "C:\\a\x85calc"])
def test_cmd_refuses_what_it_cannot_quote(value):
    code, out, err = run("render", "sage", "--arch", "9.0", "--shell", "cmd", "--src-dir", value)
    assert code == 2 and out == ""
    one_error(err)


def test_command_comment_stays_one_line(tmp_path):
    """The command line goes into a comment of every generated file: a newline in an argument must not end it."""
    d = tmp_path / "a\nRUN id"
    d.mkdir()
    code, out, err = run("render", "sage", "--arch", "9.0", "--recipe-dir", str(d))
    assert code == 0, err
    assert "\nRUN id" not in out and "$'" in out.splitlines()[1]


# ------------------------------------------------------------------------------ 2. clobbering


def test_outputs_refuse_devices_dirs_fifos_sockets(tmp_path):
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    sock = socket.socket(socket.AF_UNIX)
    sock.bind(str(tmp_path / "sock"))
    try:
        for path, kind in (("/dev/null", "character device"), (tmp_path, "directory"), (fifo, "FIFO"),
                           (tmp_path / "sock", "socket"), ("", "empty"), (f"{tmp_path}/x/", "directory")):
            with pytest.raises(UsageError, match=kind):
                outputs.write_text_atomic(path, "x")
    finally:
        sock.close()
    assert stat.S_ISCHR(os.stat("/dev/null").st_mode)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo", "sock"]


def test_outputs_write_through_symlinks_keep_modes_and_clean_up(tmp_path, monkeypatch):
    target = tmp_path / "real" / "Dockerfile"
    target.parent.mkdir()
    target.write_text("old")
    target.chmod(0o640)
    link = tmp_path / "link"
    link.symlink_to(target)
    outputs.write_text_atomic(link, "new")
    assert link.is_symlink() and target.read_text() == "new" and stat.S_IMODE(target.stat().st_mode) == 0o640
    old = os.umask(0o022)
    try:
        outputs.write_text_atomic(tmp_path / "fresh", "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "fresh").stat().st_mode) == 0o644
    dangling = tmp_path / "dangling"
    dangling.symlink_to(tmp_path / "made-by-write")
    outputs.write_text_atomic(dangling, "y")
    assert dangling.is_symlink() and (tmp_path / "made-by-write").read_text() == "y"
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    with pytest.raises(UsageError, match="symlink loop"):
        outputs.write_text_atomic(loop, "x")

    def fail(*a):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "replace", fail)
    with pytest.raises(UsageError, match="No space left"):
        outputs.write_text_atomic(target, "newer")
    assert target.read_text() == "new"
    assert not [p for p in tmp_path.rglob(".*") if p.name.endswith(".tmp")]


def test_every_user_named_output_goes_through_the_helper(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    for argv in (["render", "sage", "--arch", "9.0", "-o", str(fifo)], ["render", "sage", "--arch", "9.0", "-o", "/dev/null"],
                 ["bake", "sage", *CELL, "-f", ""], ["bake", "sage", *CELL, "-f", str(tmp_path)],
                 ["bake", "sage", *CELL, "-f", "/dev/null"], ["ci", "github", "-o", "/dev/null"],
                 ["render", "sage", "--arch", "9.0", "--shell", "cmd", "-o", str(tmp_path)]):
        code, _, err = run(*argv)
        assert code == 2, (argv, err)
        one_error(err)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["fifo"]  # no Dockerfile, no temp file
    link = tmp_path / "Dockerfile"
    link.symlink_to(tmp_path / "target.Dockerfile")
    assert run("render", "sage", "--arch", "9.0", "-o", str(link))[0] == 0
    assert link.is_symlink() and (tmp_path / "target.Dockerfile").read_text().startswith("# sageattention 2.2.0 for torch")
    assert stat.S_IMODE((tmp_path / "target.Dockerfile").stat().st_mode) == 0o666 & ~_umask()


def _umask() -> int:
    m = os.umask(0)
    os.umask(m)
    return m


def test_lock_file_written_through_its_symlink(tmp_path):
    real = tmp_path / "real.lock"
    link = tmp_path / "imagegen.lock"
    link.symlink_to(real)
    lock = registry.Lock(link, base_images={"a/b:1": "a/b:1@sha256:" + "0" * 64})
    lock.save()
    assert link.is_symlink() and registry.Lock.load(link).base_images == lock.base_images


# ---------------------------------------------------------------- 3. internal errors -> user errors


def test_binary_config_and_lock_are_one_line(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    blob = bytes(range(256)) * 8
    (tmp_path / "bin.toml").write_bytes(blob)
    (tmp_path / "bin.lock").write_bytes(blob)
    code, _, err = run("plan", "sage", "--config", "bin.toml")
    assert code == 2 and "not UTF-8" in one_error(err)
    code, _, err = run("recipes", "--lock", "bin.lock")  # was ignored: recipes takes --lock, so it reads it
    assert code == 7 and "not a lock file" in one_error(err)
    os.mkfifo(tmp_path / "fifo.lock")
    code, _, err = run("lock", "sage", *CELL, "--lock", "fifo.lock")  # no hang on a FIFO
    assert code == 7 and "not a regular file" in one_error(err)


def _elf(sections: dict[str, bytes], *, shoff_override: int | None = None, shnum_override: int | None = None) -> bytes:
    names = b"\0" + b"".join(n.encode() + b"\0" for n in [*sections, ".shstrtab"])
    body = b"".join(sections.values())
    data_off = 64
    shoff = data_off + len(body) + len(names)
    headers = [bytes(64)]
    pos, npos = data_off, 1
    for name, blob in sections.items():
        headers.append(struct.pack("<IIQQQQIIQQ", npos, 1, 0, 0, pos, len(blob), 0, 0, 1, 0))
        pos += len(blob)
        npos += len(name) + 1
    headers.append(struct.pack("<IIQQQQIIQQ", npos, 3, 0, 0, pos, len(names), 0, 0, 1, 0))
    head = bytearray(64)
    head[:6] = b"\x7fELF\x02\x01"
    struct.pack_into("<H", head, 0x12, 62)  # EM_X86_64, as the wheels' tag says
    struct.pack_into("<Q", head, 0x28, shoff if shoff_override is None else shoff_override)
    struct.pack_into("<HHH", head, 0x3A, 64, len(headers) if shnum_override is None else shnum_override, len(headers) - 1)
    return bytes(head) + body + names + b"".join(headers)


def _wheel(folder: Path, so: bytes | None = None, *, big: int = 0) -> Path:
    wheel = folder / "demo-1.0-cp312-cp312-linux_x86_64.whl"
    with zipfile.ZipFile(wheel, "w", zipfile.ZIP_DEFLATED) as zf:
        if big:
            # stored: a run of zeros deflated would be a zip bomb, which verify refuses unread (imagegen.untrusted)
            big_so = zipfile.ZipInfo("demo/_big.so")
            big_so.compress_type = zipfile.ZIP_STORED
            with zf.open(big_so, "w", force_zip64=True) as fh:
                fh.write(_elf({".text": b"\x90" * 16}))
                chunk = b"\0" * (1 << 20)
                for _ in range(big >> 20):
                    fh.write(chunk)
        else:
            zf.writestr("demo/_k.so", so)
        zf.writestr("demo-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\n")
    return wheel


@pytest.mark.parametrize("so", [
    b"\x7fELF\x02\x01" + b"\xff" * 58,  # section table at 2**64-1 (was OverflowError)
    _elf({".nv_fatbin": b"\0" * 64}, shoff_override=2**63),
    _elf({".nv_fatbin": b"\0" * 64}, shnum_override=0xFFFF),
    _elf({".nv_fatbin": struct.pack("<IHHQ", fatbin.FATBIN_MAGIC, 1, 16, 2**63) + b"\xff" * 200}),
    b"\x7fELF",
    b"",
])
def test_garbage_elf_is_a_problem_of_the_wheel_not_a_crash(tmp_path, so):
    code, out, err = run("verify", str(_wheel(tmp_path, so)), "--arch", "9.0")
    assert code == 6 and "Traceback" not in err
    one_error(err)


def test_a_large_extension_is_streamed_not_read_into_memory(tmp_path, monkeypatch):
    wheel = _wheel(tmp_path, big=200 << 20)
    tracemalloc.start()
    try:
        report = verify.verify_wheel(wheel, parse_arch_list("9.0"), cuobjdump=None)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert peak < 80 << 20, peak  # the member is 200 MiB; the spool holds at most SPOOL_BYTES
    assert report.problems == ["the wheel contains no CUDA extension (.so or .pyd with a fat binary section)"]
    monkeypatch.setattr(verify, "MAX_SO_BYTES", 50 << 20)
    report = verify.verify_wheel(wheel, parse_arch_list("9.0"), cuobjdump=None)
    assert any("larger than" in p for p in report.problems)


def test_python_exe_that_cannot_run_is_one_line(tmp_path):
    unreadable = tmp_path / "python"
    unreadable.write_text("#!/bin/sh\n")
    unreadable.chmod(0o600)
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    wheel = _wheel(tmp_path, _elf({".text": b"\x90"}))
    for exe in ("/nonexistent", str(unreadable), str(loop), "p" * 5000, str(tmp_path), "", "no-such-python-here"):
        for argv in (["verify", str(wheel), "--arch", "9.0", "--python-exe", exe], ["doctor", "--no-engine", "--python-exe", exe],
                     ["check", str(wheel), "--python", exe]):
            code, _, err = run(*argv)
            assert code == 2, (argv[0], exe[:40], err)
            one_error(err)


# --------------------------------------------------------------------- 4. silently accepted nonsense


@pytest.mark.parametrize("argv, needle", [
    (["--shell", "powershell", "--offline"], "does not apply to --shell"),
    (["--shell", "cmd", "--flavor", "pypi"], "does not apply to --shell"),
    (["--shell", "cmd", "--base-image", "ubuntu:24.04"], "does not apply to --shell"),
    (["--max-jobs", "4"], "goes with --shell"),
    (["--out", "wheelhouse"], "goes with --shell"),
    (["--audit"], "goes with --shell"),
    (["--vcvars", "C:\\vc.bat"], "goes with --shell"),
    (["--source", str(ROOT / "tests" / "fixtures" / "tiny_kernel")], "is the project tiny-kernel, not sageattention"),
    (["--shell", "powershell", "--gpu-check-device", "nvidia.com/gpu=all"], "does not apply to --shell"),
    (["--shell", "cmd", "--dockerfile-frontend", "docker/dockerfile:1.19-labs"], "does not apply to --shell"),
    (["--dockerfile-frontend", "docker/dockerfile:1.19-labs"], "goes with --gpu-check-device"),
])
def test_render_refuses_flags_it_would_ignore(argv, needle):
    code, out, err = run("render", "sage", "--arch", "9.0", *argv)
    assert code == 2 and out == "" and needle in one_error(err)


@pytest.mark.parametrize("flag", ["--gpu-check-device", "--dockerfile-frontend"])
def test_a_native_build_refuses_the_in_build_gpu_check(flag, tmp_path, monkeypatch):
    """A native build has no build step to give a device to: the flag was silently ignored."""
    monkeypatch.chdir(tmp_path)
    value = "nvidia.com/gpu=all" if flag == "--gpu-check-device" else "docker/dockerfile:1.19-labs"
    code, out, err = run("build", "sage", "--native", flag, value, "--out", "o", "--work", "w")
    assert code == 2 and out == "" and "--native" in one_error(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["render", "bake", "build"])
@pytest.mark.parametrize("flag, value", [
    ("--gpu-check-device", "nvidia.com/gpu=all\nRUN touch pwned"), ("--gpu-check-device", "nvidia.com/gpu=all --privileged"),
    ("--gpu-check-device", "nvidia.com/gpu=$(id)"), ("--gpu-check-device", "--security=insecure"),
    ("--dockerfile-frontend", "docker/dockerfile:1.19-labs\nRUN touch pwned"), ("--dockerfile-frontend", "x y"),
])
def test_the_in_build_gpu_check_refuses_an_injection(command, flag, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    gpu = [] if flag == "--gpu-check-device" else ["--gpu-check-device", "nvidia.com/gpu=all"]
    extra = {"render": [], "bake": ["-f", "b.hcl"], "build": ["--out", "o", "--work", "w"]}[command]
    code, out, err = run(command, "sage", *CELL, *gpu, f"{flag}={value}", *extra)
    assert code == 2 and out == "" and "is not allowed" in one_error(err) and flag in one_error(err)
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("command", ["render", "bake", "build", "plan"])
@pytest.mark.parametrize("value", ["linux/arm64\nRUN touch pwned", "linux/arm64 --privileged", "$(id)", "linux/arm64;x",
                                   "../../etc", "linux/" + "a" * 5000])
def test_a_hostile_platform_is_refused_in_one_line(command, value, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    extra = {"render": [], "plan": [], "bake": ["-f", "b.hcl"], "build": ["--out", "o", "--work", "w"]}[command]
    code, out, err = run(command, "sage", *CELL, f"--platform={value}", *extra)
    line = one_error(err)
    # render takes one platform: a value with a space in it is refused as a list before it is parsed
    assert code == 2 and out == "" and "--platform" in line and ("linux/amd64 and linux/arm64" in line or "one value" in line)
    assert list(tmp_path.iterdir()) == []


def test_render_no_such_recipe_with_source_is_refused():
    code, _, err = run("render", "no-such-recipe", "--source", str(ROOT / "tests" / "fixtures" / "tiny_kernel"))
    assert code == 2 and "unknown recipe 'no-such-recipe'" in one_error(err)


def test_duplicate_cells_are_one_target(tmp_path, monkeypatch):
    from imagegen.render import bakefiles
    from tests.unit import bake_print_stand_in

    monkeypatch.setattr(bakefiles, "print_bake", bake_print_stand_in.print_bake)
    monkeypatch.chdir(tmp_path)
    argv = ["bake", "sage", "SAGE", "sageattention", "--torch", "2.8", "--torch", "2.8.0", "--cuda", "12.8",
            "--cuda", "cu128", "--python", "3.12", "--python", "3.12", "--arch", "9.0", "--arch", "9.0", "-f", "b.json"]
    code, _, err = run(*argv)
    assert code == 0, err
    data = json.loads((tmp_path / "b.json").read_text())
    assert list(data["target"]) == ["sage-2_2_0-torch2_8-cu128-py312"]
    code, out, _ = run("plan", "sage", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "9.0", "--json")
    assert code == 0 and len(json.loads(out)["cells"]) == 1
    code, _, err = run("bake", "sage", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--arch", "8.0",
                       "--arch", "9.0")
    assert code == 2 and "two arch lists" in one_error(err)


# -------------------------------------------------------------------------------- 5. messages


def test_errors_are_bounded_and_terminal_safe():
    for value in ("A" * 100_000, "x\x1b[2J\x1b]0;owned\x07y", "evil\u202etxt.exe", "nul\x00byte", "bell\x07\r\noops"):
        code, out, err = run("render", value)
        line = one_error(err)
        assert code == 2 and err.count("\n") == 1
        assert not any(c in line for c in "\x1b\x00\x07\r\u202e"), ascii(line)
    assert cli.error_line("a\x1bb\u202ec") == "a\\x1bb\\u202ec"
    assert len(cli.error_line("x" * 10_000)) == cli.MAX_ERROR


def test_internal_errors_are_bounded_too(monkeypatch):
    def boom(args, argv):
        raise RuntimeError("\x1b[31m" + "y" * 50_000)

    monkeypatch.setitem(cli.COMMANDS, "recipes", boom)
    monkeypatch.delenv("IMAGEGEN_DEBUG", raising=False)
    code, _, err = run("recipes")
    assert code == 70 and err.count("\n") == 1 and len(err) < 400 and "\x1b" not in err


# ------------------------------------------------------------------------ 6. push fails fast


def _never_bake(*a, **k):
    raise AssertionError("push reached the bake of the builder images")


def test_push_to_an_unreachable_registry_fails_before_building(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(push, "bake_builders", _never_bake)
    monkeypatch.delenv("DOCKER_HOST", raising=False)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    start = time.monotonic()
    code, _, err = run("push", "sage", *CELL, "--registry", f"127.0.0.1:{port}/ml")
    assert code == 7 and "is not reachable" in one_error(err) and time.monotonic() - start < 20


class _Handler(http.server.BaseHTTPRequestHandler):
    mode = "404"

    def do_GET(self):  # noqa: N802
        if self.mode == "404":
            self.send_response(404)
        elif self.headers.get("Authorization") == "Basic " + base64.b64encode(b"u:right").decode():
            self.send_response(200)
        else:
            self.send_response(401)
            self.send_header("WWW-Authenticate", 'Basic realm="registry"')
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *a):
        pass


@pytest.mark.parametrize("mode, creds, needle", [
    ("404", None, "does not serve the registry API"),
    ("auth", None, "refused the credentials"),
    ("auth", "u:wrong", "refused the credentials"),
    ("auth", "u:right", None),
])
def test_push_wrong_registry_or_credentials_fail_before_building(tmp_path, monkeypatch, mode, creds, needle):
    handler = type("H", (_Handler,), {"mode": mode})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        (tmp_path / "docker").mkdir()
        auths = {f"127.0.0.1:{server.server_port}": {"auth": base64.b64encode(creds.encode()).decode()}} if creds else {}
        (tmp_path / "docker" / "config.json").write_text(json.dumps({"auths": auths}))
        monkeypatch.setenv("DOCKER_CONFIG", str(tmp_path / "docker"))
        monkeypatch.delenv("DOCKER_HOST", raising=False)
        reg = f"127.0.0.1:{server.server_port}/ml"
        if needle is None:
            assert registry.probe(reg).startswith("http://")
        else:
            with pytest.raises(registry.RegistryError, match=needle):
                registry.probe(reg)
    finally:
        server.shutdown()
        server.server_close()


# ---------------------------------------------------------------------------------- the fuzz test
#
# Every option (and positional) of every subcommand, found by walking imagegen's own argparse
# parser, gets hostile values: one pass over every option with a fixed nasty value and a nasty
# path, then hypothesis' mix. The engine, the network and native builds are stubbed where they
# would start (a stub that is reached counts as exit 0: the hostile value got through validation
# to a place that takes arbitrary values, like a work folder's name).

NASTY = "${IMAGEGEN_PIP_CERT}%{ if true }x%{ endif }$(touch pwned)`touch pwned`\nRUN touch pwned\r\n\x1b[2J\u202e\u2019\u201c'\"\\"
HOSTILE = [
    "${IMAGEGEN_PIP_CERT}", "%{ if true }x%{ endif }", "$(touch pwned)", "`touch pwned`", "a\nRUN touch pwned",
    "x\r\nFROM scratch AS pwned", "\x1b]0;owned\x07", "\u202etxt.exe", "x\x00y", "C:\\src\u2019; Start-Process calc; \u2019",
    "\u201cq\u201d; calc", "'", '"', "\\", "A" * 100_000, "\u00e9" * 3000, "", " ", "-", "--", "-o", "9.0;$(id)",
    "sage\nRUN id", "../../../../etc/passwd", "~root/.ssh/id_rsa", "%PATH%", "&calc", "|id", "0", "-1", "1e308", "nan",
]
PATHS = ["/dev/null", "/dev/zero", "FIFO", "LOOP", "DIR", "BINARY", "PASSWD_LINK", "P" * 5000, "DIR/", "/proc/self/mem"]


class Hang(BaseException):
    """Raised by the per-case alarm: a BaseException, so imagegen's own handler cannot swallow it."""


class Reached(ImagegenError):
    """A stubbed engine/network/native entry point was reached (with everything before it accepted)."""

    exit_code = 0


def _subcommands(parser: argparse.ArgumentParser, prefix: tuple[str, ...] = ()) -> dict[tuple[str, ...], argparse.ArgumentParser]:
    out = {}
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                out.update(_subcommands(sub, prefix + (name,)) or {prefix + (name,): sub})
    return out


PARSERS = _subcommands(cli.build_parser())


def _base(command: tuple[str, ...], wheel: str) -> list[str]:
    """Arguments that make each command succeed, or stop at a stub, without the hostile option."""
    cell = ["sage", *CELL]
    return {
        ("render",): ["render", "sage", "--arch", "9.0"],
        ("plan",): ["plan", *cell],
        ("bake",): ["bake", *cell, "-f", "out/b.hcl"],
        ("build",): ["build", *cell, "--out", "o", "--work", "w"],
        ("verify",): ["verify", wheel, "--arch", "9.0"],
        ("check",): ["check", wheel],
        ("doctor",): ["doctor", "--no-engine"],
        ("recipes",): ["recipes"],
        ("refresh",): ["refresh", "--dry-run"],
        ("archs",): ["archs", "9.0"],
        ("push",): ["push", *cell, "--registry", "127.0.0.1:1/ml", "--work", "w"],
        ("pull",): ["pull", *cell, "--registry", "127.0.0.1:1/ml", "--out", "o", "--work", "w"],
        ("lock",): ["lock", *cell],
        ("ci", "github"): ["ci", "github"],
        ("collect",): ["collect", "o"],
        ("index",): ["index", "o"],
        ("repair",): ["repair", wheel],
        ("publish",): ["publish", "o", "--to", "pypi:http://127.0.0.1:1/"],
        ("cdi-spec",): ["cdi-spec"],
        ("setup",): ["setup", "engine", "--print"],  # prints, runs nothing (and running is stubbed)
        ("reuse",): ["reuse", wheel, "--torch", "2.11.0", "--no-gpu-check"],
    }[command]


# `ci github`'s --windows-* options are driven with the Windows jobs asked for (their values are read then).
WINDOWS_JOBS = ["--windows", "sage", "--windows-torch", "2.8", "--windows-cuda", "12.8", "--windows-arch", "9.0",
                "--imagegen-from", "./tools/imagegen"]


def _cases() -> list[tuple[tuple[str, ...], str, str]]:
    """(command, option or positional dest, how to give it) for every option of every subcommand."""
    cases = []
    for command, parser in PARSERS.items():
        for action in parser._actions:
            if isinstance(action, (argparse._HelpAction, argparse._VersionAction)):
                continue
            if action.option_strings:
                flag = max(action.option_strings, key=len)
                cases.append((command, flag, "flag" if action.nargs == 0 else "value"))
            elif not isinstance(action, argparse._SubParsersAction):
                cases.append((command, action.dest, "positional"))
    # The Windows scripts take their own values: the same options again with --shell.
    for shell in ("powershell", "cmd"):
        for flag in ("--src-dir", "--python-exe", "--vcvars", "--output", "--torch", "--max-jobs"):
            cases.append((("render", shell), flag, "value"))
    return cases


CASES = _cases()


def test_the_fuzz_covers_every_subcommand_and_option():
    assert set(PARSERS) >= {("render",), ("plan",), ("bake",), ("build",), ("verify",), ("check",), ("doctor",),
                            ("recipes",), ("archs",), ("push",), ("pull",), ("lock",), ("ci", "github"), ("cdi-spec",)}
    assert len(CASES) > 100
    assert (("render",), "--output", "value") in CASES and (("bake",), "--file", "value") in CASES
    for command in (("render",), ("bake",), ("build",)):
        assert (command, "--gpu-check-device", "value") in CASES and (command, "--dockerfile-frontend", "value") in CASES
    assert (("cdi-spec",), "--output", "value") in CASES


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """Paths the hostile values point at, and what clean runs produce (to compare instruction counts)."""
    root = tmp_path_factory.mktemp("hostile")
    os.mkfifo(root / "fifo")
    (root / "loop").symlink_to(root / "loop")
    (root / "dir").mkdir()
    (root / "binary").write_bytes(bytes(range(256)) * 64)
    # A stand-in for /etc/passwd: output flags write through symlinks (as users expect), so a link to
    # the real file would let a fuzz case running as root overwrite it.
    (root / "decoy").mkdir()
    (root / "decoy" / "passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    (root / "passwd-link").symlink_to(root / "decoy" / "passwd")
    # Cases run in a folder this deep, so that "../../../../etc/passwd" stays inside the world too.
    (root / "deep" / "a" / "b" / "c" / "d").mkdir(parents=True)
    wheel = _wheel(root / "dir", _elf({".text": b"\x90"}))
    bake_file = root / "docker-bake.hcl"
    shutil.copy(ROOT / "docker-bake.hcl", bake_file)
    paths = {"FIFO": root / "fifo", "LOOP": root / "loop", "DIR": root / "dir", "BINARY": root / "binary",
             "PASSWD_LINK": root / "passwd-link", "DEEP": root / "deep" / "a" / "b" / "c" / "d"}
    base = {}
    with tempfile.TemporaryDirectory() as sandbox, _stubs(), _cwd(Path(sandbox)):
        base["dockerfile"] = _instructions(run("render", "sage", "--arch", "9.0")[1])
        for shell in ("powershell", "cmd"):
            base[shell] = len(run("render", "sage", "--arch", "9.0", "--shell", shell)[1].splitlines())
            # a --src-dir is the user's folder: the cells build a copy of it (two lines more)
            base[shell, "--src-dir"] = len(run("render", "sage", "--arch", "9.0", "--shell", shell, "--src-dir", "s")[1]
                                           .splitlines())
        shutil.copy(bake_file, sandbox)
        code, _, err = run("ci", "github")
        assert code == 0, err
        base["workflow"] = _workflow_lines((Path(sandbox) / ".github/workflows/imagegen.yml").read_text())
        code, _, err = run("ci", "github", *WINDOWS_JOBS, "-o", "windows.yml")
        assert code == 0, err
        base["workflow_windows"] = _workflow_lines((Path(sandbox) / "windows.yml").read_text())
    return {"root": root, "wheel": str(wheel), "paths": paths, "base": base, "bake_file": bake_file}


def _instructions(text: str) -> int:
    """How many instructions, less the RUN that applies a recipe's patches by file name (some recipes have
    patches, some none: bake --repo writes every recipe's Dockerfile)."""
    import dockerfile

    return sum(1 for c in dockerfile.parse_string(text)
               if not (c.cmd.upper() == "RUN" and "/imagegen/imagegen_build.py patch " in c.value[0]))


@contextlib.contextmanager
def _cwd(path: Path):
    old = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(old)


@contextlib.contextmanager
def _stubs():
    from imagegen.commands import doctor
    from imagegen.plan import refresh, refs
    from imagegen.finish import check
    from imagegen.commands import repairing
    from imagegen.executors import buildx as execute
    from imagegen.executors import buildx_audit, native
    from imagegen.publish import upload
    from imagegen.commands import setup
    from imagegen.render import bakefiles
    from tests.unit import bake_print_stand_in

    def reached(*a, **k):
        raise Reached("stub reached")

    saved = []
    for owner, name in ((execute, "build"), (buildx_audit, "audit"), (push, "push"), (prebuilt, "pull"),
                        (registry, "lock_bases"), (registry, "probe"), (native, "build_native"),
                        (native, "audit_native"), (doctor, "diagnose_engine"), (check, "probe_gpu"),
                        (refs, "resolve_commit"), (refresh, "refresh"), (repairing, "repair_wheel"),
                        (repairing, "repair_in_wheelhouse"), (upload, "connect"), (setup, "run_script")):
        saved.append((owner, name, getattr(owner, name)))
        setattr(owner, name, reached)
    # `ci github` reads the bake file through the pure stand-in for `docker buildx bake --print`
    # (tests/integration/test_ci_workflow.py runs hostile input through the real buildx).
    for owner in (bakefiles,):
        saved.append((owner, "print_bake", owner.print_bake))
        owner.print_bake = bake_print_stand_in.print_bake
    try:
        yield
    finally:
        for owner, name, fn in saved:
            setattr(owner, name, fn)


def _alarm(signum, frame):
    raise Hang()


def _value(world: dict, raw: str) -> str:
    for key, path in world["paths"].items():
        if raw == key or raw == key + "/":
            return str(path) + raw[len(key):]
    return raw


def _host_files() -> dict[str, bytes]:
    """The host files a careless case could reach as root: none may change."""
    import hashlib

    return {f: hashlib.sha256(Path(f).read_bytes()).digest() for f in ("/etc/passwd", "/etc/group", "/etc/hosts")
            if os.path.isfile(f)}


def _drive(world: dict, command: tuple[str, ...], option: str, how: str, value: str) -> None:
    """Run one hostile case and check the contract."""
    shell = command[1] if command[0] == "render" and len(command) == 2 else None
    base = (["render", "sage", "--arch", "9.0", "--shell", shell] if shell else _base(command, world["wheel"]))
    if command == ("ci", "github") and option.startswith("--windows"):
        base = base + WINDOWS_JOBS
    if how == "flag":
        argv = base + [option]
    elif how == "positional":
        argv = list(base)
        index = {("verify",): 1, ("check",): 1, ("archs",): 1}.get(command, len(command))
        if command in (("doctor",), ("recipes",), ("refresh",), ("ci", "github")) or index >= len(argv):
            argv.append(value)
        else:
            argv[index] = value
    else:
        argv = base + [f"{option}={value}"]
    before = {p.name for p in ROOT.iterdir()} | {f"tests/{p.name}" for p in (ROOT / "tests").iterdir()}
    outside = sorted(p.name for p in world["root"].iterdir())
    host_files = _host_files()
    with tempfile.TemporaryDirectory(prefix="imagegen-fuzz-", dir=world["paths"]["DEEP"]) as sandbox:
        if command == ("ci", "github"):
            shutil.copy(world["bake_file"], sandbox)
        old = signal.signal(signal.SIGALRM, _alarm)
        signal.setitimer(signal.ITIMER_REAL, 30)
        try:
            with _cwd(Path(sandbox)):
                code, out, err = run(*argv)
        except Hang:
            raise AssertionError(f"hang: {ascii(argv)[:300]}") from None
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, old)
        what = f"{ascii(argv)[:300]} -> {code}: {ascii(err[-600:])}"
        assert "Traceback (most recent call last)" not in err and "internal error" not in err, what
        assert code in (0, 2, 3, 4, 6, 7, 8, 9), what  # the documented codes (5: a build ran: stubbed)
        if code != 0:
            lines = [line for line in err.splitlines() if line.startswith("imagegen: error:")]
            assert len(lines) == 1 and len(lines[0]) < 400, what
            assert not any(c in lines[0] for c in "\x1b\x00\x07\r\u202e"), what
        else:
            _check_rendered(world, command, shell, argv, out, Path(sandbox))
        assert {p.name for p in ROOT.iterdir()} | {f"tests/{p.name}" for p in (ROOT / "tests").iterdir()} <= before, what
        assert _host_files() == host_files, f"a host file changed: {what}"
        made = sorted(set(p.name for p in world["root"].iterdir()) - set(outside))
        if command[0] == "render" and code == 0 and made == ["imagegen-scripts"]:
            shutil.rmtree(world["root"] / "imagegen-scripts")  # render -o writes the scripts beside the file
            made = []
        assert not made and sorted(p.name for p in world["root"].iterdir()) == outside, what
        assert stat.S_ISFIFO(os.lstat(world["paths"]["FIFO"]).st_mode) and world["paths"]["LOOP"].is_symlink()
        assert stat.S_ISCHR(os.stat("/dev/null").st_mode), what
        assert not list(Path(sandbox).rglob("pwned*")), what


# Only a GitHub-hosted runner gets the step that frees disk space (a --runs-on self-hosted or
# custom label does not): the one block whose presence depends on a value.
_FREE_DISK = ("# The CUDA builder images need more disk", "- name: Free disk space", "run: sudo rm -rf /usr/share/dotnet")


def _workflow_lines(text: str) -> int:
    return sum(1 for line in text.splitlines() if not line.strip().startswith(_FREE_DISK))


def _check_rendered(world, command, shell, argv, out, sandbox: Path) -> None:
    """No extra instruction in anything rendered: counts as in a clean render."""
    base = world["base"]
    texts = [p.read_text() for p in sandbox.rglob("*") if p.is_file() and not p.is_symlink()] if sandbox.exists() else []
    if command == ("render",):
        for text in [out] + texts:
            if "\n# Made by imagegen " in text[:2000] and "\nFROM " in text:  # a rendered Dockerfile
                assert _instructions(text) == base["dockerfile"], ascii(argv)[:300]
    elif shell:
        for text in [out] + texts:
            if text.startswith(("# Generated", "@echo off")):
                src_dir = any(a == "--src-dir" or a.startswith("--src-dir=") for a in argv)
                assert len(text.splitlines()) == base[(shell, "--src-dir") if src_dir else shell], ascii(argv)[:300]
                if shell == "powershell":
                    here = False  # inside a single-quoted here-string (@'...'@): verbatim data, no strings
                    for line in text.splitlines():
                        if here:
                            assert not line.startswith("'@") or line in ("'@)",), ascii(line)[:200]
                            here = not line.startswith("'@")
                        elif not line.lstrip().startswith("#"):
                            here = line.endswith("@'")
                            _ps_strings(line[:-2] if here else line)  # every string closes on its own line
    elif command == ("bake",):
        for p in sandbox.rglob("*.Dockerfile"):
            assert _instructions(p.read_text()) == base["dockerfile"], ascii(argv)[:300]
    elif command == ("ci", "github"):
        for p in sandbox.rglob("*.yml"):
            import yaml

            text = p.read_text()
            yaml.safe_load(text)
            want = base.get("workflow_windows" if "--windows" in argv else "workflow", _workflow_lines(text))
            assert _workflow_lines(text) == want, ascii(argv)[:300]


def test_fuzz_every_option_with_a_nasty_value_and_path(world):
    """Deterministic sweep: each option of each subcommand gets NASTY and a FIFO (or its flag form)."""
    with _stubs():
        for command, option, how in CASES:
            for raw in ((None,) if how == "flag" else (NASTY, "FIFO")):
                _drive(world, command, option, how, "" if raw is None else _value(world, raw))


hostile_values = st.one_of(
    st.sampled_from(HOSTILE + PATHS),
    st.builds(lambda a, b, c: a + b + c, st.text(max_size=12), st.sampled_from(HOSTILE), st.text(max_size=12)),
)


@settings(max_examples=1000, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(case=st.sampled_from([c for c in CASES if c[2] != "flag"]), raw=hostile_values)
def test_fuzz_hostile_values(world, case, raw):
    command, option, how = case
    with _stubs():
        _drive(world, command, option, how, _value(world, raw))


def test_native_probe_turns_every_failure_to_run_python_into_an_engine_error(tmp_path):
    # The CLI checks --python-exe first; the library call is guarded as well (doctor, build --native).
    from imagegen.errors import EngineError
    from imagegen.executors import host as host_toolchain
    not_python = tmp_path / "not-python"
    not_python.write_text("#!/bin/sh\necho 'no json here' >&2\n")
    not_python.chmod(0o755)
    wrong_json = tmp_path / "wrong-json"
    wrong_json.write_text("#!/bin/sh\necho '[1, 2]'\n")
    wrong_json.chmod(0o755)
    for exe in (str(tmp_path), str(not_python), str(wrong_json), "p" * 5000, "/nonexistent/python"):
        with pytest.raises(EngineError) as info:
            host_toolchain.probe(exe)
        assert "\n" not in str(info.value) and len(str(info.value)) < 400


def test_config_files_are_read_as_bounded_regular_files(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    os.mkfifo(tmp_path / "fifo.toml")
    code, _, err = run("plan", "sage", "--config", "fifo.toml")  # no hang on a FIFO
    assert code == 2 and "not a regular file" in one_error(err)
    (tmp_path / "big.toml").write_text("# x\n" * (300 << 10))
    code, _, err = run("plan", "sage", "--config", "big.toml")
    assert code == 2 and "at most" in one_error(err)


def test_a_source_trees_pyproject_is_read_only_inside_the_tree(tmp_path):
    from imagegen.model.source_tree import recipe_from_source_tree
    secret = tmp_path / "elsewhere.toml"
    secret.write_text('[project]\nname = "stolen-name"\nversion = "6.6.6"\n')
    tree = tmp_path / "proj"
    tree.mkdir()
    (tree / "setup.py").write_text("from setuptools import setup\nsetup()\n")
    (tree / "pyproject.toml").symlink_to(secret)
    recipe = recipe_from_source_tree(tree)
    assert "stolen" not in recipe.name and recipe.default_version != "6.6.6"
    (tree / "pyproject.toml").unlink()
    (tree / "pyproject.toml").write_text("project = 5\n")  # not PEP 621 metadata: ignored, no crash
    assert recipe_from_source_tree(tree).name == "proj"
