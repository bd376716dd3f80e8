"""Issue 32: a private git repository and the one credential a container build has (`--netrc FILE`).

A container build's fetch step reaches an http(s) git host with the netrc file `--netrc` hands it, and
nothing else of this machine's (no ~/.netrc, no credential helper). So `build`, `push` and `pull` resolve
a ref with exactly that, and a repository the build could not fetch is one line, exit 2, before anything
is built: whether git on this machine has a credential of its own (a ~/.netrc, a helper) or none; a full
commit is not resolved, but the build's access is asked all the same. When the fetch step itself fails
(the host could not be asked beforehand), its one line says the same, and is the cell's error in the table. Against a real private host: `git http-backend` on 127.0.0.1 that
answers 401 without the planted token (tests/git_server.py). The on-engine half (the build, the image
layers and history) is tests/integration/test_engine_build.py's."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from imagegen import cli, engine
from imagegen.plan import refs
from imagegen.errors import UsageError
from imagegen.executors.bake_log import TargetLogs
from tests.git_server import GitServer, git, tiny_kernel_repo

LOGIN = "x-access-token"
TOKEN = "ghp_PrivateHostTokenNeverShown0123456789"
FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
BUILDER = Path(refs.__file__).parents[1] / "shipped" / "builder"
CELL = ["--torch", "2.11", "--cuda", "13.0", "--python", "3.11", "--arch", "8.0", "--flavor", "pypi"]


@pytest.fixture(scope="module")
def private(tmp_path_factory):
    """(server, the v0.1.0 tag's commit): the tiny kernel's repository on a host that wants the token."""
    root = tmp_path_factory.mktemp("private-host")
    repo, commit = tiny_kernel_repo(root)
    (root / "srv").mkdir()
    git(root / "srv", "clone", "-q", "--bare", str(repo), "tiny.git")
    with GitServer(root / "srv", auth=(LOGIN, TOKEN)) as srv:
        yield srv, commit


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A HOME of the test's own (no ~/.netrc, no git config of the machine's); ``netrc(path, token)``
    writes a netrc file there or elsewhere."""
    folder = tmp_path / "home"
    folder.mkdir()
    monkeypatch.setenv("HOME", str(folder))
    monkeypatch.delenv("XDG_CONFIG_HOME", raising=False)
    monkeypatch.delenv("GIT_CONFIG_GLOBAL", raising=False)
    return folder


def _netrc(path: Path, token: str = TOKEN, host: str = "127.0.0.1") -> Path:
    path.write_text(f"machine {host} login {LOGIN} password {token}\n")
    return path


def _one_line(err: str) -> str:
    assert err.count("\n") == 1 and err.startswith("imagegen: error: "), err
    assert TOKEN not in err
    return err


def test_the_machines_own_git_resolves_with_its_netrc_as_before(private, home):
    srv, commit = private
    with pytest.raises(UsageError, match="git ls-remote failed: .*it needs git credentials"):
        refs.resolve_commit(srv.url("tiny.git"), "v0.1.0")
    _netrc(home / ".netrc")
    assert refs.resolve_commit(srv.url("tiny.git"), "v0.1.0") == commit  # plan, render: the user's git


def test_a_build_resolves_with_the_netrc_it_is_handed_and_nothing_else(private, home, tmp_path):
    srv, commit = private
    url = srv.url("tiny.git")
    handed = refs.BuildCredentials(str(_netrc(tmp_path / "netrc")))
    assert refs.resolve_commit(url, "v0.1.0", handed) == commit  # no ~/.netrc at all: --netrc's file alone
    # Nothing: said with what to give.
    with pytest.raises(UsageError) as err:
        refs.resolve_commit(url, "v0.1.0", refs.BuildCredentials(None))
    assert "give --netrc FILE with its credential" in str(err.value) and TOKEN not in str(err.value)
    # A --netrc file whose entry the host refuses.
    wrong = refs.BuildCredentials(str(_netrc(tmp_path / "wrong", token="not-the-token")))
    with pytest.raises(UsageError, match="the --netrc file has no working entry for 127.0.0.1"):
        refs.resolve_commit(url, "v0.1.0", wrong)
    # The machine's ~/.netrc works, the build would not have it: said, never used in the build's stead.
    _netrc(home / ".netrc")
    with pytest.raises(UsageError) as err:
        refs.resolve_commit(url, "v0.1.0", refs.BuildCredentials(None))
    assert "needs credentials, which git on this machine has" in str(err.value)
    assert "give --netrc ~/.netrc" in str(err.value) and TOKEN not in str(err.value)
    with pytest.raises(UsageError, match="the --netrc file's credentials are refused there"):
        refs.resolve_commit(url, "v0.1.0", wrong)


def test_a_full_commit_is_not_resolved_but_the_builds_access_is_still_asked(private, home, tmp_path):
    # `--git URL@<40 hex>` needs no ls-remote (the offline route), but the build's fetch step still needs
    # access: asked with the build's credentials alone, as for a tag.
    srv, commit = private
    url = srv.url("tiny.git")
    handed = refs.BuildCredentials(str(_netrc(tmp_path / "netrc")))
    assert refs.resolve_commit(url, commit, handed) == commit
    assert refs.resolve_commit(url, commit) == commit  # plan, render: nothing asked, nothing needed
    # Neither this machine nor the build has a credential: not refused here (the fetch step says it).
    assert refs.resolve_commit(url, commit, refs.BuildCredentials(None)) == commit
    _netrc(home / ".netrc")  # this machine's git can, the build could not
    with pytest.raises(UsageError) as err:
        refs.resolve_commit(url, commit, refs.BuildCredentials(None))
    assert "needs credentials, which git on this machine has" in str(err.value) and TOKEN not in str(err.value)
    wrong = refs.BuildCredentials(str(_netrc(tmp_path / "wrong", token="not-the-token")))
    with pytest.raises(UsageError, match="the --netrc file's credentials are refused there"):
        refs.resolve_commit(url, commit, wrong)


def test_a_full_commit_on_a_host_that_cannot_be_reached_is_left_to_the_fetch_step(home, tmp_path):
    # Offline (nothing listens on the port): the full commit is the way to build, not a refusal.
    import socket
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    commit = "0123456789abcdef0123456789abcdef01234567"
    url = f"http://127.0.0.1:{port}/tiny.git"
    assert refs.resolve_commit(url, commit, refs.BuildCredentials(str(_netrc(tmp_path / "netrc")))) == commit
    assert refs.resolve_commit(url, commit, refs.BuildCredentials(None)) == commit


@pytest.mark.parametrize("url", ["ssh://git@127.0.0.1:9/org/tiny.git", "git@127.0.0.1:org/tiny.git"])
def test_an_ssh_source_of_a_container_build_is_refused_with_what_to_give(url, home):
    # No SSH key or agent ever reaches a build step: said before anything runs (no ls-remote either)
    for ref in ("v0.1.0", "0123456789abcdef0123456789abcdef01234567"):
        with pytest.raises(UsageError, match="has no SSH key or agent; give the repository's https:// URL with --netrc"):
            refs.resolve_commit(url, ref, refs.BuildCredentials(None))
    # plan and render ask with this machine's own git (a full commit needs nothing)
    assert refs.resolve_commit(url, "0123456789abcdef0123456789abcdef01234567") == "0123456789abcdef0123456789abcdef01234567"


def test_a_credential_helper_of_this_machine_is_not_the_builds(private, home, tmp_path):
    srv, commit = private
    store = tmp_path / "credentials"
    store.write_text(f"http://{LOGIN}:{TOKEN}@127.0.0.1:{srv.port}\n")
    (home / ".gitconfig").write_text(f"[credential]\n\thelper = store --file={store}\n")
    assert refs.resolve_commit(srv.url("tiny.git"), "v0.1.0") == commit  # the user's git uses its helper
    with pytest.raises(UsageError, match="needs credentials, which git on this machine has"):
        refs.resolve_commit(srv.url("tiny.git"), "v0.1.0", refs.BuildCredentials(None))


def test_the_users_global_git_config_still_applies_to_a_builds_resolve(private, home, tmp_path):
    # A proxy, a CA or a url.insteadOf of ~/.gitconfig (or ~/.config/git/config) is the network's, not a
    # credential: the build's resolve keeps it (here an insteadOf naming the real host).
    srv, commit = private
    (home / ".config" / "git").mkdir(parents=True)
    (home / ".config" / "git" / "config").write_text(
        f'[url "http://127.0.0.1:{srv.port}/"]\n\tinsteadOf = http://private.invalid/\n')
    handed = refs.BuildCredentials(str(_netrc(tmp_path / "netrc")))
    assert refs.resolve_commit("http://private.invalid/tiny.git", "v0.1.0", handed) == commit


@pytest.mark.parametrize("at", ["tag", "commit"])
@pytest.mark.parametrize("command", ["build", "push", "pull"])
def test_a_private_git_source_without_netrc_is_one_line_before_anything_runs(private, home, tmp_path, monkeypatch,
                                                                             capsys, command, at):
    srv, commit = private
    monkeypatch.chdir(tmp_path)
    for step in ("bake", "docker"):
        monkeypatch.setattr(engine, step, lambda *a, **k: pytest.fail("nothing runs before the source is checked"))
    ref = "v0.1.0" if at == "tag" else commit  # a full commit is not resolved, but its access is asked
    argv = [command, "tiny", "--git", srv.url("tiny.git") + "@" + ref, "--recipe-dir", str(FIXTURES / "tiny_git_recipe"),
            *CELL, *(["--registry", "registry.example:5000/ns"] if command != "build" else []),
            "--work", str(tmp_path / "work")]
    _netrc(home / ".netrc")  # git on this machine can, the build could not
    assert cli.main(argv) == 2
    assert "give --netrc ~/.netrc" in _one_line(capsys.readouterr().err)
    assert cli.main([*argv, "--netrc", str(_netrc(tmp_path / "wrong", token="nope"))]) == 2
    assert "the --netrc file's credentials are refused there" in _one_line(capsys.readouterr().err)
    assert not (tmp_path / "work").exists()
    # plan is not a build: the user's own git resolves it, as before
    assert cli.main(["plan", "tiny", "--git", srv.url("tiny.git") + "@v0.1.0", "--recipe-dir",
                     str(FIXTURES / "tiny_git_recipe"), *CELL]) == 0
    assert TOKEN not in "".join(capsys.readouterr())


def _fetch_step(tmp_path: Path, url: str, commit: str, netrc: Path | None) -> subprocess.CompletedProcess:
    """The builder script's fetch step (imagegen_build.cmd_fetch) as the build runs it, in a process of its
    own: NETRC is what secret_env sets when the netrc secret is mounted."""
    cell = {"source": {"kind": "git", "url": url, "ref": commit, "commit": commit}, "src_dir": str(tmp_path / "src"),
            "patches": []}
    code = f"import sys; sys.path.insert(0, {str(BUILDER)!r}); import imagegen_build as b; b.cmd_fetch({cell!r}, None)"
    tmp_path.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "NETRC"}
    env.update(HOME=str(tmp_path), **({"NETRC": str(netrc)} if netrc else {}))
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, env=env)


def test_the_fetch_step_fetches_with_the_netrc_secret_and_says_what_it_lacks_without(private, tmp_path):
    srv, commit = private
    proc = _fetch_step(tmp_path / "with", srv.url("tiny.git"), commit, _netrc(tmp_path / "netrc"))
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "with" / "src" / "README.md").read_text() == "tiny kernel: taken upstream at v0.1.0\n"
    proc = _fetch_step(tmp_path / "without", srv.url("tiny.git"), commit, None)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith(f"[imagegen] error: cannot fetch {commit} from {srv.url('tiny.git')}")
    assert "the build has no credential for it: give imagegen build --netrc FILE (machine 127.0.0.1" in last
    assert "127.0.0.1 wants credentials" in last and "cannot reach" not in last  # the host's 401, said as one
    proc = _fetch_step(tmp_path / "wrong", srv.url("tiny.git"), commit, _netrc(tmp_path / "wrong-netrc", token="nope"))
    assert proc.returncode != 0 and proc.stderr.strip().splitlines()[-1].endswith(
        "the netrc secret has no working entry for 127.0.0.1")
    assert TOKEN not in proc.stdout + proc.stderr


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("url, says", [
    ("http://nonexistent.invalid/tiny.git", "cannot reach nonexistent.invalid (DNS: "),
    ("http://127.0.0.1:{port}/tiny.git", "cannot reach 127.0.0.1 (connection: "),
])
def test_a_git_host_the_fetch_step_cannot_reach_is_the_networks_failure_not_a_credentials(tmp_path, url, says):
    url = url.format(port=_closed_port())
    proc = _fetch_step(tmp_path / "step", url, "0" * 40, None)
    last = proc.stderr.strip().splitlines()[-1]
    assert proc.returncode != 0 and last.startswith(f"[imagegen] error: cannot fetch {'0' * 40} from {url}")
    assert says in last and "check the network or a proxy" in last and "netrc" not in last


def test_a_ref_on_a_host_that_cannot_be_reached_says_so_not_credentials(home):
    with pytest.raises(UsageError) as info:
        refs.resolve_commit("http://nonexistent.invalid/tiny.git", "v0.1.0")
    assert "cannot reach nonexistent.invalid (DNS: " in str(info.value) and "credentials" not in str(info.value)


def test_a_failed_steps_own_error_is_the_cells_error(tmp_path):
    # Not only the compile step's: the fetch step's one line names what is missing in the table's row.
    logs = TargetLogs(tmp_path, ["a-1"])
    logs.feed("#7 [a-1 fetch 3/3] RUN python3.11 /imagegen/imagegen_build.py fetch")
    logs.feed("#7 0.9 fatal: could not read Username for 'http://h': terminal prompts disabled")
    logs.feed("#7 1.0 [imagegen] error: cannot fetch v1 from http://h/x.git (git exit 128): give --netrc")
    logs.feed("#7 1.1 [imagegen] error: a later line is not the reason")
    logs.feed('#7 ERROR: process "/bin/bash -o pipefail -c python3.11 /imagegen/imagegen_build.py fetch" did not complete')
    assert logs.errors == {"a-1": "cannot fetch v1 from http://h/x.git (git exit 128): give --netrc"}
    assert logs.failed == {"a-1"}
    logs.close()
