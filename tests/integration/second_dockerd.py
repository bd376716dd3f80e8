"""A second, real Docker engine next to the machine's own, for the multi-builder test (a helper, not a
test file).

`SecondDockerd` starts another dockerd (the binary scripts/install-engine.sh installs, in
/usr/local/sbin) with everything of its own:

- --data-root next to the first engine's (same filesystem, so overlay2 works there), --exec-root,
  --pidfile and its unix socket (-H unix:///run/imagegen-dockerd2/docker.sock) under /run, an empty
  --config-file, and its own managed containerd (namespace imagegen2);
- its own bridge br-imagegen2 (172.31.250.1/24, made here with `ip`) for the RUN steps of builds.
  It runs with --iptables=false --ip-masq=false, so it never touches the first engine's iptables
  chains; RUN steps reach PyPI through three rules of ours, inserted at start and deleted at stop:
  MASQUERADE for the subnet, and two FORWARD accepts (the first engine sets FORWARD's policy to DROP).

`stop()` undoes everything, whatever state `start()` reached: the docker context, dockerd (SIGTERM,
wait, SIGKILL) and its containerd, anything still mounted under its roots, its exec-root, the iptables
rules and the bridge, and its data-root unless it was asked to keep it (`keep_data=True`: the torch
layer makes it several GB, which the next run on this machine then finds in its build cache instead of
installing it from PyPI again; a data-root the engine cannot start on is removed and started afresh).
It raises DockerdError naming whatever it could not remove. dockerd gets SIGTERM when the process that started it dies
(PR_SET_PDEATHSIG), and `start()` first clears what a killed earlier run left behind.

    engine = SecondDockerd(log_dir)
    try:
        engine.start()                       # DockerdError with dockerd's log tail when it cannot
        engine.load_image("imagegen-test/python:3.11-bookworm")
        engine.create_context("imagegen-second")  # buildx lists it as a builder (docker driver)
        ...
    finally:
        engine.stop()

Needs root, dockerd, `ip` (iproute2) and `iptables`. One at a time per machine (fixed names).
"""

from __future__ import annotations

import contextlib
import ctypes
import http.client
import ipaddress
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

from registry import log_tail

BRIDGE = "br-imagegen2"
SUBNET = "172.31.250.0/24"
GATEWAY = "172.31.250.1/24"
CONTAINERD_NAMESPACE = "imagegen2"
EXEC_ROOT = Path("/run/imagegen-dockerd2")
OWNER_FILE = Path("/run/imagegen-dockerd2.owner")  # the pid of the process that started it
DATA_DIR_NAME = "imagegen-dockerd2"  # next to the first engine's data-root
START_TIMEOUT_S = 90.0
STOP_TIMEOUT_S = 60.0
DOCKERD_PATHS = ("/usr/local/sbin/dockerd", "/usr/local/bin/dockerd", "/usr/sbin/dockerd", "/usr/bin/dockerd")
INSTALL_HINT = ("run scripts/test.sh as root (scripts/install-engine.sh installs dockerd; iproute2 and iptables"
                " come from apt)")

# (table, chain, rule): inserted at the top of their chain by start(), deleted by stop().
RULES = (
    ("nat", "POSTROUTING", ["-s", SUBNET, "!", "-o", BRIDGE, "-j", "MASQUERADE"]),
    ("filter", "FORWARD", ["-i", BRIDGE, "!", "-o", BRIDGE, "-j", "ACCEPT"]),
    ("filter", "FORWARD", ["-o", BRIDGE, "-m", "conntrack", "--ctstate", "RELATED,ESTABLISHED", "-j", "ACCEPT"]),
)


class DockerdError(RuntimeError):
    """The second engine did not start, or could not be removed completely."""


def dockerd_binary() -> str | None:
    for path in DOCKERD_PATHS:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("dockerd")


def missing_tools() -> list[str]:
    """What a SecondDockerd needs and this machine lacks (empty when all is there)."""
    missing = []
    if os.geteuid() != 0:
        missing.append("root")
    if dockerd_binary() is None:
        missing.append(f"dockerd ({', '.join(DOCKERD_PATHS[:1])})")
    for tool, package in (("ip", "iproute2"), ("iptables", "iptables"), ("docker", "docker client")):
        if shutil.which(tool) is None:
            missing.append(f"{tool} ({package})")
    return missing


def _run(*cmd: str, timeout: float = 120, check: bool = False) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise DockerdError(f"`{' '.join(cmd)}` failed ({proc.returncode}): {(proc.stderr or proc.stdout).strip()}")
    return proc


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:  # a zombie is not alive
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().strip())
    except (OSError, ValueError):
        return None


def _cmdline(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""


def _die_with_parent() -> None:  # runs in the child before exec
    with contextlib.suppress(Exception):  # best effort
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG


class _UnixHTTPConnection(http.client.HTTPConnection):
    def __init__(self, path: str, timeout: float = 120) -> None:
        super().__init__("localhost", timeout=timeout)
        self.unix_path = path

    def connect(self) -> None:
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.settimeout(self.timeout)
        sock.connect(self.unix_path)
        self.sock = sock


class SecondDockerd:
    """A second dockerd with its own roots, socket, containerd and bridge (see the module docstring)."""

    def __init__(self, log_dir: str | os.PathLike, keep_data: bool = False) -> None:
        self.log_dir = Path(log_dir)
        self.keep_data = keep_data
        self.log_path = self.log_dir / "dockerd.log"
        self.config_path = self.log_dir / "daemon.json"
        self.exec_root = EXEC_ROOT
        self.socket = self.exec_root / "docker.sock"
        self.host = f"unix://{self.socket}"
        self.pidfile = self.exec_root / "docker.pid"
        self.data_root = self._data_root()
        self.proc: subprocess.Popen | None = None
        self.context: str | None = None
        self.owned = False  # set once start() has cleared the way: from then on stop() undoes it all

    @staticmethod
    def _data_root() -> Path:
        """Next to the first engine's data-root (overlay2 needs a real filesystem, not tmpfs)."""
        first = _run("docker", "info", "--format", "{{.DockerRootDir}}", timeout=60).stdout.strip()
        return Path(first or "/var/lib/docker").parent / DATA_DIR_NAME

    # -- docker against this engine ----------------------------------------------------------------
    def docker(self, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
        """`docker -H unix://.../docker.sock ARGS`."""
        return _run("docker", "-H", self.host, *args, timeout=timeout)

    def api(self, path: str) -> object:
        """GET ``path`` of the engine API on this engine's socket; the parsed JSON."""
        conn = _UnixHTTPConnection(str(self.socket))
        try:
            conn.request("GET", path)
            resp = conn.getresponse()
            body = resp.read()
        finally:
            conn.close()
        if resp.status != 200:
            raise DockerdError(f"GET {path}: HTTP {resp.status}: {body[:300]!r}")
        return json.loads(body)

    def build_cache(self) -> list[dict]:
        """This engine's build cache records (BuildKit's, as `docker system df` counts them)."""
        return list(self.api("/system/df?type=build-cache").get("BuildCache") or [])

    def engine_id(self) -> str:
        return self.docker("info", "--format", "{{.ID}}", timeout=60).stdout.strip()

    # -- life cycle ------------------------------------------------------------------------------
    def start(self) -> SecondDockerd:
        missing = missing_tools()
        if missing:
            raise DockerdError(f"a second dockerd needs {', '.join(missing)}: {INSTALL_HINT}")
        self._clear_leftovers()
        self.owned = True
        self._check_subnet_free()
        self.log_dir.mkdir(parents=True, exist_ok=True)
        self.config_path.write_text("{}\n")  # not /etc/docker/daemon.json: nothing of the first engine's
        self._make_roots()
        _run("ip", "link", "add", BRIDGE, "type", "bridge", check=True)
        _run("ip", "addr", "add", GATEWAY, "dev", BRIDGE, check=True)
        _run("ip", "link", "set", BRIDGE, "up", check=True)
        for table, chain, rule in RULES:
            _run("iptables", "-t", table, "-I", chain, *rule, check=True)
        cmd = [dockerd_binary(), "--data-root", str(self.data_root), "--exec-root", str(self.exec_root),
               "--pidfile", str(self.pidfile), "-H", self.host, "--config-file", str(self.config_path),
               "--bridge", BRIDGE, "--iptables=false", "--ip-masq=false",
               "--containerd-namespace", CONTAINERD_NAMESPACE,
               "--containerd-plugins-namespace", CONTAINERD_NAMESPACE + "-plugins"]
        mtu = self._uplink_mtu()
        if mtu:
            cmd += ["--mtu", str(mtu)]
        kept = self.keep_data and any(self.data_root.iterdir())
        try:
            self._launch(cmd)
        except DockerdError:
            if not kept:
                raise
            # A data-root an interrupted run broke: started afresh, as a first run would.
            problems: list[str] = []
            self._stop_dockerd(problems)
            self._remove_files(problems, data=True)
            if problems:
                raise DockerdError("a kept data-root the second dockerd could not start on was not removed:\n  "
                                   + "\n  ".join(problems)) from None
            self._make_roots()
            self._launch(cmd)
        return self

    def _make_roots(self) -> None:
        """The exec- and data-root folders, and the owner file that marks them this process's."""
        self.exec_root.mkdir(parents=True, exist_ok=True)
        self.data_root.mkdir(parents=True, exist_ok=True)
        OWNER_FILE.write_text(f"{os.getpid()}\n")

    def _launch(self, cmd: list[str]) -> None:
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                         start_new_session=True, preexec_fn=_die_with_parent)
        self._wait_ready()

    def load_image(self, image: str) -> None:
        """`docker save IMAGE` from the first engine into this one (nothing to do when a kept data-root
        holds that very image already)."""
        want = _run("docker", "image", "inspect", "--format", "{{.Id}}", image, timeout=60).stdout.strip()
        have = self.docker("image", "inspect", "--format", "{{.Id}}", image, timeout=60)
        if want and have.returncode == 0 and have.stdout.strip() == want:
            return
        save = subprocess.Popen(["docker", "save", image], stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        try:
            load = subprocess.run(["docker", "-H", self.host, "load"], stdin=save.stdout, capture_output=True,
                                  text=True, timeout=1800)
        finally:
            save.stdout.close()
            save_err = save.stderr.read().decode(errors="replace")
            save.wait(timeout=600)
        if save.returncode != 0 or load.returncode != 0:
            raise DockerdError(f"copying {image} into the second engine failed: docker save: {save_err.strip()};"
                               f" docker load: {(load.stderr or load.stdout).strip()}")

    def create_context(self, name: str) -> None:
        """A docker context for this engine (buildx lists it as a builder with the docker driver)."""
        _run("docker", "context", "rm", "-f", name)
        self.context = name
        _run("docker", "context", "create", name, "--docker", f"host={self.host}", check=True)

    def stop(self) -> None:
        """Undo all of start(); DockerdError names what could not be removed. Nothing when start()
        did not get as far as owning the names (another run holds them)."""
        if not self.owned:
            return
        self.owned = False
        problems: list[str] = []
        if self.context:
            proc = _run("docker", "context", "rm", "-f", self.context)
            if proc.returncode != 0:
                problems.append(f"docker context rm {self.context}: {proc.stderr.strip()}")
            self.context = None
        self._stop_dockerd(problems)
        self._remove_files(problems, data=not self.keep_data)
        self._remove_network(problems)
        if problems:
            raise DockerdError("the second engine was not removed completely:\n  " + "\n  ".join(problems))

    def __enter__(self) -> SecondDockerd:
        try:
            return self.start()
        except BaseException:
            self.stop()
            raise

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- internals -------------------------------------------------------------------------------
    @staticmethod
    def _uplink_mtu() -> int | None:
        """The MTU of the default route's interface (builds' veths should not be larger)."""
        out = _run("ip", "-o", "route", "show", "default").stdout.split()
        if "dev" not in out:
            return None
        try:
            return int(Path(f"/sys/class/net/{out[out.index('dev') + 1]}/mtu").read_text())
        except (OSError, ValueError, IndexError):
            return None

    @staticmethod
    def _check_subnet_free() -> None:
        ours = ipaddress.ip_network(SUBNET)
        for line in _run("ip", "-o", "-4", "route", "show").stdout.splitlines():
            dst = line.split()[0] if line.split() else "default"
            try:
                taken = dst != "default" and ipaddress.ip_network(dst, strict=False).overlaps(ours)
            except ValueError:
                continue
            if taken:
                raise DockerdError(f"{SUBNET} (the second engine's bridge) overlaps a route of this machine: {line}")

    def _wait_ready(self) -> None:
        deadline = time.monotonic() + START_TIMEOUT_S
        last = ""
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise DockerdError(f"the second dockerd exited with {self.proc.returncode} during start-up; "
                                   f"log {self.log_path}:\n{log_tail(self.log_path)}")
            proc = self.docker("version", "--format", "{{.Server.Version}}", timeout=30)
            if proc.returncode == 0:
                return
            last = (proc.stderr or proc.stdout).strip()
            time.sleep(0.5)
        raise DockerdError(f"the second dockerd did not answer on {self.host} within {START_TIMEOUT_S:.0f}s "
                           f"(last: {last}); log {self.log_path}:\n{log_tail(self.log_path)}")

    def _clear_leftovers(self) -> None:
        """Remove what an earlier run that was killed left behind; refuse while another run owns it."""
        owner = _read_pid(OWNER_FILE)
        if owner is not None and owner != os.getpid() and _alive(owner):
            raise DockerdError(f"another process (pid {owner}, {_cmdline(owner)[:200]}) runs the second dockerd"
                               f" ({OWNER_FILE}); wait for it")
        problems: list[str] = []
        self._stop_dockerd(problems)
        self._remove_files(problems, data=not self.keep_data)
        self._remove_network(problems)
        if problems:
            raise DockerdError("leftovers of an earlier second dockerd could not be removed:\n  "
                               + "\n  ".join(problems))

    def _ours(self) -> list[int]:
        """Processes whose command line names our roots (containerd, shims, runc), dockerd first."""
        roots = (str(self.exec_root) + "/", str(self.data_root) + "/", f"={self.exec_root}", f"={self.data_root}",
                 f" {self.exec_root} ", f" {self.data_root} ")
        pids = []
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit() and int(entry.name) != os.getpid():
                line = _cmdline(int(entry.name)) + " "
                if any(root in line for root in roots):
                    pids.append(int(entry.name))
        return sorted(pids, key=lambda pid: "dockerd" not in _cmdline(pid).split(" ", 1)[0])

    @staticmethod
    def _end(pid: int, timeout: float) -> bool:
        """SIGTERM ``pid``, wait up to ``timeout``, then SIGKILL; True when it is gone."""
        for sig, wait in ((signal.SIGTERM, timeout), (signal.SIGKILL, 10.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return True
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                if not _alive(pid):
                    return True
                time.sleep(0.2)
        return not _alive(pid)

    def _stop_dockerd(self, problems: list[str]) -> None:
        proc, self.proc = self.proc, None
        if proc is not None and proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                proc.kill()
                try:
                    proc.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    problems.append(f"dockerd (pid {proc.pid}) survived SIGKILL")
        # dockerd of an earlier run (by its pidfile), then its containerd and shims if they outlived it
        pid = _read_pid(self.pidfile)
        if pid is not None and _alive(pid) and str(self.exec_root) in _cmdline(pid) \
                and not self._end(pid, STOP_TIMEOUT_S):
            problems.append(f"dockerd (pid {pid}) survived SIGKILL")
        for pid in self._ours():
            if not self._end(pid, 15.0):
                problems.append(f"pid {pid} ({_cmdline(pid)[:120]}) survived SIGKILL")

    def _mounts(self) -> list[str]:
        points = []
        for line in Path("/proc/self/mountinfo").read_text().splitlines():
            point = line.split()[4].replace("\\040", " ")
            if any(point == str(root) or point.startswith(str(root) + "/")
                   for root in (self.exec_root, self.data_root)):
                points.append(point)
        return sorted(points, key=len, reverse=True)

    def _remove_files(self, problems: list[str], data: bool = True) -> None:
        """Unmount everything under the roots; delete the exec-root, and the data-root when ``data``."""
        for point in self._mounts():
            proc = _run("umount", "-l", point)
            if proc.returncode != 0:
                problems.append(f"umount {point}: {proc.stderr.strip()}")
        still = self._mounts()
        for path in ((self.data_root, self.exec_root) if data else (self.exec_root,)):
            if any(point == str(path) or point.startswith(str(path) + "/") for point in still):
                problems.append(f"{path} still has mounts ({', '.join(still[:5])}): not deleted")
                continue
            if path.exists():
                shutil.rmtree(path, ignore_errors=True)
            if path.exists():
                problems.append(f"{path} could not be deleted")
        OWNER_FILE.unlink(missing_ok=True)  # ours, or its owner is gone (_clear_leftovers checked)

    def _remove_network(self, problems: list[str]) -> None:
        for table, chain, rule in RULES:
            for _ in range(10):  # a rule inserted twice (a crashed start) goes twice
                if _run("iptables", "-t", table, "-C", chain, *rule).returncode != 0:
                    break
                proc = _run("iptables", "-t", table, "-D", chain, *rule)
                if proc.returncode != 0:
                    problems.append(f"iptables -t {table} -D {chain} {' '.join(rule)}: {proc.stderr.strip()}")
                    break
        if Path(f"/sys/class/net/{BRIDGE}").exists():
            proc = _run("ip", "link", "del", BRIDGE)
            if proc.returncode != 0:
                problems.append(f"ip link del {BRIDGE}: {proc.stderr.strip()}")
