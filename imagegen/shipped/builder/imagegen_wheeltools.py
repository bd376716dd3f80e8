"""What every build path shares about sources and wheels: recipe patches, the local version label,
extension module names, and which cuobjdump reads the device code. Standard library only.

Shipped beside the in-build script (imagegen_build.py: in the image, and in a native build's work
folder), written beside the Windows helper by a rendered build.ps1/build.cmd (imagegen_windows.py),
and imported by imagegen itself (verify, fatbin): a Linux build, a Windows build and `imagegen
verify` patch, retag and find cuobjdump one way. Callers pass their own ``log`` and ``fail`` (which
must raise): the in-build script exits, the Windows helper raises its Failed.
"""

import base64
import csv
import glob
import hashlib
import io
import json
import os
import re
import shutil
import struct
import subprocess
import zipfile

# ------------------------------------------------------------------------------------------------
# recipe patches


# ------------------------------------------------------------------------------------------------
# git on a tree imagegen did not write (docs/security.md): the one place every git call of imagegen,
# its builder script and its Windows helper gets its flags. A tree's own .git/config (and what it
# includes), its hooks and its .gitattributes can name commands git runs: an fsmonitor, hooks, clean/
# smudge/process filters, textconv and external diff drivers, a pager, a lazy fetch of a partial
# clone. `-c` wins over every config file, so each of those is switched off on the command line.

GIT_NO_COMMANDS = ("core.fsmonitor=false", "core.hooksPath=" + os.devnull, "core.pager=cat", "core.askPass=",
                   "diff.external=", "core.untrackedCache=false", "gc.auto=0", "maintenance.auto=false")
# A call that only reads a tree reaches no network either (no lazy fetch, no proxy or ssh command).
GIT_READ_ONLY = ("protocol.allow=never",)
_DRIVER_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,99}")
_DRIVER_KEYS = re.compile(r"(?i)^(filter|diff|merge)\.(.+)\.(clean|smudge|process|required|textconv|command|driver)$")


class UnsafeTree(Exception):
    """A tree whose git config names a filter or diff driver no `-c` can switch off (a name with '=',
    spaces or newlines): git is not run on it."""


def git_env(dest, base=None):
    """The environment for git inside ``dest``. Inside another repository's work tree (a source tree
    vendored in the user's project, or a --src-dir without .git) `git apply` takes the patch's paths
    from that repository's root and silently skips them all, exit 0: stop git's search for a
    repository at dest (dest's own .git still counts, a parent's does not). No system-wide config or
    attributes, no pager, no prompt, no lazy fetch, no external diff from the environment. ``base``:
    the environment to start from (default: this process's)."""
    env = dict(os.environ if base is None else base, GIT_CEILING_DIRECTORIES=os.path.dirname(os.path.abspath(dest)), GIT_CONFIG_NOSYSTEM="1",
               GIT_ATTR_NOSYSTEM="1", GIT_NO_LAZY_FETCH="1", GIT_PAGER="cat", GIT_TERMINAL_PROMPT="0",
               GIT_OPTIONAL_LOCKS="0")
    for var in ("GIT_DIR", "GIT_WORK_TREE", "GIT_EXTERNAL_DIFF", "GIT_INDEX_FILE", "GIT_OBJECT_DIRECTORY",
                "GIT_ALTERNATE_OBJECT_DIRECTORIES", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_PROXY_COMMAND"):
        env.pop(var, None)
    return env


def git_cmd(dest, args, env=None, reading=True, git="git"):
    """``git -C dest <no-commands flags> args``: git run on ``dest`` with no command of the tree's own
    running (GIT_NO_COMMANDS; ``reading``: no network either). The filter, textconv, external diff
    and merge drivers the tree's config defines are switched off by name, read first with `git config`
    (which runs nothing). Raises UnsafeTree for a driver whose name cannot be switched off."""
    base = [git, "-C", dest]
    for item in GIT_NO_COMMANDS + (GIT_READ_ONLY if reading else ()):
        base += ["-c", item]
    env = git_env(dest) if env is None else env
    try:
        proc = subprocess.run(base + ["config", "-z", "--get-regexp", r"^(filter|diff|merge)\."], env=env,
                              stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, timeout=60)
        listed = proc.stdout.decode("utf-8", "replace")
    except (OSError, subprocess.SubprocessError):
        listed = ""
    off = []
    for item in listed.split("\0"):
        m = _DRIVER_KEYS.match(item.split("\n", 1)[0])
        if not m:
            continue
        kind, name = m.group(1).lower(), m.group(2)
        if not _DRIVER_NAME.fullmatch(name):
            raise UnsafeTree("its git config names the %s driver %r, which imagegen cannot switch off" % (kind, name[:60]))
        keys = {"filter": ("clean=cat", "smudge=cat", "process=", "required=false"), "diff": ("textconv=", "command="),
                "merge": ("driver=",)}[kind]
        for key in keys:
            item = "%s.%s.%s" % (kind, name, key)
            if item not in off:
                off.append(item)
    for item in off:
        base += ["-c", item]
    return base + list(args)


def patches_left_to_the_copy(patches, src):
    """What a fetch step says when it leaves the recipe's patches to each build's copy (the Linux build's
    copy_source, the Windows script's --copy) instead of writing them into the folder it fetched."""
    return "the recipe's patches go on the build's copy, not on %s: %s" % (src, ", ".join(p["name"] for p in patches))


def apply_patch(patch, dest, log, fail, broken_hint):
    """Apply a recipe patch once: applied when `git apply --check` passes (and must then reverse
    cleanly: a no-op "success" is an error), skipped with a log line when the tree already carries it
    (`git apply --reverse --check`: upstream took the fix, or an earlier build applied it), refused
    otherwise, saying ``broken_hint`` (what the caller knows of why)."""
    text = patch["text"].encode("utf-8")
    dest = os.path.abspath(dest)
    env = git_env(dest)

    def git_apply(*flags):
        try:
            cmd = git_cmd(dest, ["apply"] + list(flags) + ["-"], env=env)
            return subprocess.run(cmd, input=text, cwd=dest, env=env,
                                  stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0
        except UnsafeTree as exc:
            fail("cannot patch %s: %s" % (dest, exc))
        except OSError as exc:
            fail("cannot run git: %s" % exc)

    if git_apply("--check"):
        log("applying patch %s: %s" % (patch["name"], patch.get("reason", "")))
        if not git_apply() or not git_apply("--reverse", "--check"):
            fail("patch %s failed to apply in %s" % (patch["name"], dest))
    elif git_apply("--reverse", "--check"):
        log("patch %s is already in the source at %s (upstream has it, or an earlier build applied it):"
            " not applied again" % (patch["name"], dest))
    else:
        fail("patch %s neither applies to the source in %s nor is already in it: %s" % (patch["name"], dest, broken_hint))


# ------------------------------------------------------------------------------------------------
# why a fetch failed: the network, or credentials. A host that cannot be resolved or connected to is
# no credential problem (a Colab runtime offline, a proxy not set): naming --netrc there sends the
# user after the wrong fix. The words are git's (curl's) and Python's (urllib, socket) in the C locale.

_UNREACHABLE_WORDS = (
    ("DNS", ("could not resolve host", "couldn't resolve host", "could not resolve proxy", "name or service not known",
             "temporary failure in name resolution", "nodename nor servname", "no address associated",
             "name resolution", "getaddrinfo failed", "unknown host", "errno -2", "errno -3", "errno -5")),
    ("connection", ("connection refused", "failed to connect", "couldn't connect", "could not connect",
                    "connection timed out", "timed out", "network is unreachable", "no route to host",
                    "connection reset", "errno 111", "errno 101", "errno 113")),
)
_AUTH_WORDS = ("authentication failed", "could not read username", "could not read password",
               "terminal prompts disabled", "returned error: 401", "returned error: 403", "http error 401",
               "http error 403", "unauthorized", "forbidden", "invalid username or password")


def unreachable(said):
    """'DNS' or 'connection' when ``said`` (what git or Python said of a failed fetch) says the host
    could not be reached at all; None otherwise (it answered: a refusal, a missing repository...)."""
    low = (said or "").lower()
    for kind, words in _UNREACHABLE_WORDS:
        if any(w in low for w in words):
            return kind
    return None


def auth_refused(said):
    """Whether ``said`` says the host answered and wants (other) credentials: HTTP 401/403, git's
    "Authentication failed" or "could not read Username" (it would have prompted)."""
    low = (said or "").lower()
    return any(w in low for w in _AUTH_WORDS)


def cannot_reach(host, said):
    """The one-line reason for a host that cannot be reached, with what to check."""
    kind = unreachable(said) or "connection"
    return "cannot reach %s (%s: %s): check the network or a proxy (HTTPS_PROXY)" % (
        host, "DNS" if kind == "DNS" else "connection", _said_line(said))


def _said_line(said):
    """The line of ``said`` that names the failure, at most 200 characters."""
    lines = [l.strip() for l in (said or "").splitlines() if l.strip()]
    picked = next((l for l in lines if unreachable(l)), lines[-1] if lines else "no answer")
    for prefix in ("fatal: ", "error: "):
        if picked.lower().startswith(prefix):
            picked = picked[len(prefix):]
    return picked[:200]


def fetch_git(src, dest, git, run, head, fail, log, fetch_failed=None, keep_lf=False, elsewhere="", fetch=None):
    """The recipe's pinned git source in ``dest``, for both build paths (the Linux builder's fetch step,
    the Windows helper's). A checkout already there must be at the pinned commit; a tree without .git is
    taken as given (the log says its pin cannot be checked); anything else is fetched: the pinned ref,
    shallow, checked against the pinned commit, with its submodules when the recipe asks.

    ``git(args, reading=True)``: the command line of git on ``dest`` (git_cmd, with the caller's
    environment); ``run(cmd, check=True)``: runs it (with check, a failure stops the step; without, it
    returns the exit status); ``head()``: HEAD's commit, or None when git cannot read it; ``fail(msg,
    code=1)`` stops the step; ``fetch_failed(rc)``: the one line for a failed fetch; ``keep_lf``: the
    tree keeps LF line ends (Windows: the recipe's patches are LF, and `git apply` refuses a CRLF tree);
    ``elsewhere``: what else the user can do about a checkout at another commit; ``fetch(cmd)``: runs
    the fetch itself and returns (exit status, what git said on stderr), and then ``fetch_failed(rc,
    said)`` gets git's words too (a host not reached is told apart from a refused credential)."""
    pinned = src.get("commit")
    if os.path.isdir(os.path.join(dest, ".git")):
        at = head()
        if at is None:
            fail("%s has a .git folder git cannot read" % dest)
        if pinned and not at.startswith(pinned):
            fail("the checkout at %s is at %s, not the pinned %s: check out the pinned commit%s"
                 % (dest, at[:12], pinned[:12], elsewhere))
        log("source already present at %s (%s)" % (dest, at[:12]))
        return
    if os.path.isdir(dest) and os.listdir(dest):
        log("using the source tree at %s as given (no .git, so the pinned %s cannot be checked)"
            % (dest, pinned or src["ref"]))
        return
    os.makedirs(dest, exist_ok=True)
    run(["git", "init", "-q", dest])
    if keep_lf:
        run(git(["config", "core.autocrlf", "false"]))
    run(git(["remote", "add", "origin", src["url"]]))
    cmd = git(["fetch", "--depth", "1", "origin", src["ref"]], reading=False)
    if fetch is not None:
        rc, said = fetch(cmd)
        if rc != 0:
            fail(fetch_failed(rc, said) if fetch_failed else "cannot fetch %s from %s (git exit %d)"
                 % (src["ref"], src["url"], rc), rc or 1)
    else:
        rc = run(cmd, check=False)
        if rc != 0:
            fail(fetch_failed(rc) if fetch_failed else "cannot fetch %s from %s (git exit %d)"
                 % (src["ref"], src["url"], rc), rc or 1)
    run(git(["checkout", "-q", "FETCH_HEAD"]))
    at = head() or "?"
    if pinned and not at.startswith(pinned):
        fail("%s at %s is %s, not the pinned %s" % (src["url"], src["ref"], at, pinned))
    if src.get("submodules"):
        run(git((["-c", "core.autocrlf=false"] if keep_lf else []) + ["submodule", "update", "--init", "--recursive",
                                                                       "--depth", "1"], reading=False))


# ------------------------------------------------------------------------------------------------
# the local version label


def project_name(name):
    """A distribution or import name as PEP 503 compares them (einops, Foo_Bar -> foo-bar)."""
    return re.sub(r"[-_.]+", "-", name).lower()


def wheel_name_parts(name):
    """(distribution, version, the tags with any build tag) of a wheel file name; ValueError for
    another name."""
    parts = name[:-4].split("-") if name.endswith(".whl") else []
    if len(parts) not in (5, 6):
        raise ValueError("%s is not a wheel file name" % name)
    return parts[0], parts[1], "-".join(parts[2:])


def _copy_compressed(raw_in, info, zout, name):
    """Append the entry ``info`` to ``zout`` as ``name`` with its compressed bytes as they are.

    A CUDA wheel is mostly .so files; deflating them again took seconds on every build (a 22 MB
    SageAttention wheel: ~1 s), all of it imagegen overhead over a plain `pip wheel`. zipfile has no
    public raw copy, so this writes the local header itself and registers the entry the way
    ZipFile.open(mode="w") does; on a zipfile without those internals it returns False and the
    caller recompresses."""
    if not all(hasattr(zout, a) for a in ("fp", "filelist", "NameToInfo", "start_dir", "_didModify")) \
            or info.flag_bits & 0x1:  # encrypted: never in a wheel, but not ours to copy
        return False
    raw_in.seek(info.header_offset)
    header = raw_in.read(30)
    if header[:4] != b"PK\x03\x04":
        return False
    name_len, extra_len = struct.unpack("<HH", header[26:30])
    raw_in.seek(info.header_offset + 30 + name_len + extra_len)
    payload = raw_in.read(info.compress_size)
    zi = zipfile.ZipInfo(name, date_time=info.date_time)
    zi.external_attr = info.external_attr
    zi.compress_type = info.compress_type
    zi.CRC, zi.compress_size, zi.file_size = info.CRC, info.compress_size, info.file_size
    zi.header_offset = zout.fp.tell()
    zout.fp.write(zi.FileHeader(zi.file_size > zipfile.ZIP64_LIMIT or zi.compress_size > zipfile.ZIP64_LIMIT))
    zout.fp.write(payload)
    zout.filelist.append(zi)
    zout.NameToInfo[zi.filename] = zi
    zout.start_dir = zout.fp.tell()
    zout._didModify = True
    return True


def retag(path, label, out_dir, log):
    """The wheel at ``path`` with the PEP 440 local version ``label`` (2.2.0 -> 2.2.0+cu128torch2.8),
    written into ``out_dir``; the path of the new wheel. The version lives in the file name, the
    .dist-info folder's name, METADATA and RECORD: all four must agree or pip refuses the wheel. A
    wheel whose build already set a local version (through the package's own knob) is returned as it
    is."""
    name = os.path.basename(path)
    dist, version, tags = wheel_name_parts(name)
    if "+" in version:
        return path
    new_version = version + "+" + label
    old_info, new_info = "%s-%s.dist-info" % (dist, version), "%s-%s.dist-info" % (dist, new_version)
    new_path = os.path.join(out_dir, "%s-%s-%s.whl" % (dist, new_version, tags))
    records = []
    with zipfile.ZipFile(path) as zin, open(path, "rb") as raw_in, \
            zipfile.ZipFile(new_path, "w", zipfile.ZIP_DEFLATED) as zout:
        for info in zin.infolist():
            data = zin.read(info.filename)  # checks the CRC; RECORD needs the sha256 of the content
            fname = info.filename
            if fname.startswith(old_info + "/"):
                fname = new_info + fname[len(old_info):]
            if fname == new_info + "/RECORD":
                continue
            if fname == new_info + "/METADATA":
                data = re.sub(rb"(?m)^Version: .*$", b"Version: " + new_version.encode(), data, count=1)
            digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
            if fname.startswith(new_info + "/") or not _copy_compressed(raw_in, info, zout, fname):
                zi = zipfile.ZipInfo(fname, date_time=info.date_time)
                zi.external_attr = info.external_attr
                zi.compress_type = zipfile.ZIP_DEFLATED
                zout.writestr(zi, data)
            records.append((fname, "sha256=" + digest, str(len(data))))
        buf = io.StringIO()
        writer = csv.writer(buf, lineterminator="\n")
        writer.writerows(records)
        writer.writerow((new_info + "/RECORD", "", ""))
        zout.writestr(new_info + "/RECORD", buf.getvalue())
    log("retagged %s -> %s" % (name, os.path.basename(new_path)))
    return new_path


# ------------------------------------------------------------------------------------------------
# extensions and their device code


def so_module(name):
    """The module an extension file in a wheel is: ``sageattention/_qattn_sm90.cpython-312-x86_64-linux-gnu.so``
    (or ``...cp312-win_amd64.pyd``) -> ``sageattention._qattn_sm90``."""
    parts = name.replace("\\", "/").split("/")
    parts[-1] = parts[-1].split(".", 1)[0]
    return ".".join(p for p in parts if p)


def find_cuobjdump():
    """cuobjdump to list device code with: IMAGEGEN_CUOBJDUMP (a path, or `none`: none at all), else the
    one on PATH, else the toolkit's (CUDA_PATH, as NVIDIA's Windows installer sets it, or CUDA_HOME),
    else PyPI's nvidia-cuda-cuobjdump beside this Python; None if there is none."""
    chosen = os.environ.get("IMAGEGEN_CUOBJDUMP", "").strip()
    if chosen:
        return None if chosen.lower() == "none" else chosen
    found = shutil.which("cuobjdump")
    if found:
        return found
    for var in ("CUDA_PATH", "CUDA_HOME"):
        root = os.environ.get(var)
        for exe in ("cuobjdump.exe", "cuobjdump"):
            if root and os.path.isfile(os.path.join(root, "bin", exe)):
                return os.path.join(root, "bin", exe)
    try:
        import nvidia  # the namespace package of NVIDIA's PyPI wheels
    except ImportError:
        return None
    for root in getattr(nvidia, "__path__", []):
        for cand in sorted(glob.glob(os.path.join(root, "*", "bin", "cuobjdump"))):
            return cand
    return None


# One entry of `cuobjdump --list-elf --list-ptx`: "ELF file    1: x.sm_90a.cubin", "PTX file    2: x.sm_120.ptx".
_LISTED = re.compile(r"(ELF|PTX) file\s+\d+:\s+\S+?\.sm_(\d+)([af]?)\.(?:cubin|ptx)")


def cuobjdump_listing(text):
    """The device code `cuobjdump --list-elf --list-ptx` lists, in its order, read one way for `imagegen verify`
    (fatbin.cuobjdump_entries) and the Windows helper: ("sass" or "ptx", cc as a number (90), variant ("", "a", "f"))."""
    return [("sass" if m.group(1) == "ELF" else "ptx", int(m.group(2)), m.group(3)) for m in _LISTED.finditer(text)]


# ------------------------------------------------------------------------------------------------
# the import test every build path runs on a wheel it made (the Linux build's smoke step, the Windows
# helper's): one program, one judgement

# Run by the Python the wheel was installed into: argv OUT DISTRIBUTION MODULE...; writes each import's
# result, the top-level module a failed import lacked, and the wheel's own runtime requirements (not an
# extra's) by name.
SMOKE_PROGRAM = """
import importlib, importlib.metadata, json, re, sys
results, missing = {}, {}
for name in sys.argv[3:]:
    try:
        importlib.import_module(name)
        results[name] = "ok"
    except Exception as exc:
        results[name] = "error: %s: %s" % (type(exc).__name__, exc)
        if isinstance(exc, ModuleNotFoundError) and exc.name:
            missing[name] = exc.name.split(".")[0]
try:
    requires = importlib.metadata.requires(sys.argv[2]) or []
except Exception:
    requires = []
needs = [m.group(0) for r in requires if "extra ==" not in r.replace("extra==", "extra ==")
         for m in [re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", r)] if m]
with open(sys.argv[1], "w") as fh:
    json.dump({"results": results, "missing": missing, "requires": needs}, fh)
"""

# What an import error looks like when the only thing missing is the GPU driver (libcuda, nvcuda.dll).
_NEEDS_DRIVER = re.compile(r"nvcuda\.dll|libcuda\.so|CUDA driver|no CUDA-capable device|NVIDIA driver")


def judge_imports(found, modules, has_driver=True):
    """(report, failed) of SMOKE_PROGRAM's output ``found`` for ``modules``: an import that failed only for
    want of a GPU driver is skipped (on a machine without one, a DLL that does not load too), and so is one
    that failed only for a module the wheel itself declares as a runtime requirement (the wheel is installed
    alone, --no-deps: mamba-ssm needs einops); any other failure fails."""
    results, missing = found.get("results") or {}, found.get("missing") or {}
    requirements = set(project_name(r) for r in found.get("requires") or [])
    report, failed = {}, []
    for name in modules:
        got = results.get(name, "error: not run")
        lacking = missing.get(name)
        if got != "ok" and (_NEEDS_DRIVER.search(got) or (not has_driver and "DLL load failed" in got)):
            got = "skipped: needs a GPU driver (%s)" % got.split(": ", 1)[-1][:200]
        elif got != "ok" and lacking and project_name(lacking) in requirements:
            got = ("skipped: needs %s, a runtime requirement of the wheel (the smoke test installs the wheel alone)"
                   % lacking)
        elif got != "ok":
            failed.append(name)
        report[name] = got
    return report, failed


# ------------------------------------------------------------------------------------------------
# the GPU probe before a numerical check (the build's gpu-check step, `imagegen check`): does this
# Python import torch, and does torch see a CUDA GPU? One marked JSON line, read by gpu_probe_answer.

GPU_PROBE_MARK = "IMAGEGEN-GPU-PROBE "
GPU_PROBE = r"""
import json
out = {}
try:
    import torch
except BaseException as exc:
    out["error"] = "%s: %s" % (type(exc).__name__, exc)
else:
    out["torch"] = str(getattr(torch, "__version__", "unknown"))
    try:
        if torch.cuda.is_available():
            cc = torch.cuda.get_device_capability(0)
            out["device"] = "%s (%d.%d)" % (torch.cuda.get_device_name(0), cc[0], cc[1])
        else:
            out["error"] = "torch.cuda.is_available() is False"
    except BaseException as exc:
        out["error"] = "%s: %s" % (type(exc).__name__, exc)
print("IMAGEGEN-GPU-PROBE " + json.dumps(out))
"""


def gpu_probe_answer(stdout):
    """The probe's answer in ``stdout`` (torch, device or error), or None when it printed none (the
    interpreter did not run it)."""
    line = next((ln for ln in reversed((stdout or "").splitlines()) if ln.startswith(GPU_PROBE_MARK)), None)
    if line is None:
        return None
    try:
        answer = json.loads(line[len(GPU_PROBE_MARK):])
    except ValueError:
        return None
    return answer if isinstance(answer, dict) else None
