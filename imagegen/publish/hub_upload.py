"""A Hugging Face Hub model repository as a publish destination (``hf:OWNER/REPO[@REVISION][:PATH]``),
through huggingface_hub.HfApi: an RTX 5090 user's SageAttention builder uploads its wheel there, and pip installs it from
``https://huggingface.co/OWNER/REPO/resolve/REVISION/PATH/<wheel>``.

- What is there: ``get_paths_info`` on the file's path. A wheel is stored with LFS (the Hub keeps
  binary files out of git), whose pointer records the file's sha256; a file kept in git is compared by
  its git blob sha1 instead.
- Upload: one commit per wheel (``create_commit``), made on the branch's head as it was read
  (``parent_commit``) after checking that the path is still free at that head: a commit that landed
  between the two makes the Hub refuse ours (HTTP 409/412), and the check runs again at the new head,
  so a file of that name is never overwritten. The wheel is handed over as an open file, which
  huggingface_hub uploads through the Hub's LFS batch API over HTTP (preupload, LFS batch, PUT, commit)
  even when hf_xet is installed: one upload path, the one the tests replay request by request and the
  one huggingface_hub itself takes without hf_xet (the Hub documents Xet-backed repositories as still
  taking LFS uploads; not tried here); Xet's chunk deduplication saves little on a compressed wheel.
- The repository must exist (``hf repo create OWNER/REPO``), unless ``--create`` asks for it: then
  ``create_repo(exist_ok=True)`` makes it (a model repository, public as the Hub makes one by default)
  before anything is read, and one that exists already is used as it is. Without the flag nothing is
  created, since creating one chooses its visibility for the user. A dry run creates nothing.
- Credentials: HF_TOKEN, else the token file ``huggingface-cli login`` / ``hf auth login`` stored
  (``HF_TOKEN_PATH``, else ``$HF_HOME/token``, else ``$XDG_CACHE_HOME/huggingface/token`` or
  ~/.cache/huggingface/token, as huggingface_hub finds it): a regular file of at most 4 KiB holding one
  token, read by imagegen itself (hub_token), never shown; the endpoint is HF_ENDPOINT
  (default https://huggingface.co), which also lets the tests point HfApi at their own server.
  huggingface_hub itself also fetches, without the token, a list for its user agent
  (``/api/agent-harnesses``) unless HF_HUB_DISABLE_TELEMETRY=1.

Tried: against a local HTTP server that answers the Hub API calls this path makes and records them
(tests/unit/test_hub_upload.py, tests/integration/test_publish.py): repository, revision, path in the
repository, the LFS object's sha256 and bytes, the parent commit, the Authorization header carrying
HF_TOKEN, and that the token is in no output. Not tried against huggingface.co itself (no account or
network here): the answers the server gives are modelled on huggingface_hub's own client code.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path
from typing import Mapping

from imagegen import safety
from imagegen.errors import PublishError
from imagegen.outputs import shown
from imagegen.publish.upload import Destination, Found, HubDest, found_sha256, missing_library
from imagegen.wheelhouse.manifest import VerifiedWheel

DEFAULT_ENDPOINT = "https://huggingface.co"
COMMIT_TRIES = 3  # the branch moved under us this many times in a row: give up on this wheel


MAX_TOKEN_FILE = 4096
# What a Hub token looks like (hf_ plus letters and digits; older ones are other printable ASCII): no
# whitespace or control character, so a file holding anything else is not taken for one.
_TOKEN = re.compile(r"[\x21-\x7e]{8,512}")


def token_file(env: Mapping[str, str]) -> Path:
    """Where ``huggingface-cli login`` (``hf auth login``) stores the token, as huggingface_hub's
    constants find it: HF_TOKEN_PATH, else $HF_HOME/token, else $XDG_CACHE_HOME/huggingface/token, else
    ~/.cache/huggingface/token."""
    if env.get("HF_TOKEN_PATH"):
        return Path(env["HF_TOKEN_PATH"]).expanduser()
    home = env.get("HF_HOME") or Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser() / "huggingface"
    return Path(home).expanduser() / "token"


def hub_token(env: Mapping[str, str]) -> tuple[str | None, str]:
    """The token to write with and what to call it in messages: HF_TOKEN, else the login's token file
    (token_file). A file that is there but is not a regular file of at most MAX_TOKEN_FILE bytes holding
    one token is a PublishError naming the file, never its content; no file: (None, "")."""
    if env.get("HF_TOKEN"):
        return env["HF_TOKEN"], "HF_TOKEN"
    path = token_file(env)
    where = f"the token in {shown(path)}"
    if not os.path.lexists(path):
        return None, ""
    try:
        data = safety.read_regular_file(path, limit=MAX_TOKEN_FILE)
    except safety.Unreadable as exc:
        raise PublishError(f"{shown(path)} (huggingface-cli login's token file): cannot read it: {exc}") from None
    token = data.decode("ascii", "replace").strip()
    if not _TOKEN.fullmatch(token):
        raise PublishError(f"{shown(path)} (huggingface-cli login's token file) holds no token (one line of"
                           " printable ASCII): log in again, or set HF_TOKEN")
    return token, where


def connect(dest: HubDest, env: Mapping[str, str], *, write: bool, create: bool = False) -> HubRepo:
    try:
        from huggingface_hub import HfApi
    except ImportError:
        raise missing_library("huggingface_hub") from None
    try:
        token, where = hub_token(env)
    except PublishError:
        if write:
            raise
        token, where = None, ""  # a dry run reads anonymously
    if write and not token:
        raise PublishError(f"no Hugging Face token: set HF_TOKEN, or run `huggingface-cli login` (it stores one in"
                           f" {shown(token_file(env))}); one with write access to {dest.repo_id}")
    _quiet_xet_notice()
    # token=False: huggingface_hub looks for no token of its own (hub_token found the one to use, or none).
    api = HfApi(endpoint=(env.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/"), token=token or False,
                library_name="imagegen")
    repo = HubRepo(dest, api, token_name=where or "HF_TOKEN",
                   secrets=(token,) if token and where != "HF_TOKEN" else ())
    if create and write:
        repo.create()
    return repo


class HubRepo(Destination):
    def __init__(self, dest: HubDest, api, *, token_name: str = "HF_TOKEN", secrets: tuple[str, ...] = ()) -> None:
        self.dest = dest
        self.api = api
        self.token_name = token_name  # HF_TOKEN, or "the token in ~/.cache/huggingface/token"
        self.secrets = secrets  # a token read from the login's file: redacted like HF_TOKEN's value

    def create(self) -> None:
        """--create: the model repository made if it is not there (create_repo with exist_ok: one that
        exists is left as it is). Refused creation (no write access to the owner) ends the destination."""
        self._call(self.api.create_repo, self.dest.repo_id, repo_type="model", exist_ok=True)

    def find(self, wheel: VerifiedWheel, revision: str | None = None) -> Found | None:
        from huggingface_hub.hf_api import RepoFile
        from huggingface_hub.utils.sha import git_hash

        path = self.dest.path_in_repo(wheel.path.name)
        infos = self._call(self.api.get_paths_info, self.dest.repo_id, [path], revision=revision or self.dest.revision)
        entry = next((i for i in infos if i.path == path), None)
        if entry is None:
            return None
        if not isinstance(entry, RepoFile):
            return Found("a folder", False)
        if entry.lfs is not None:
            return found_sha256(entry.lfs.sha256, wheel)
        # A small file kept in git: its blob id is the git sha1 of its bytes (hashed only when the sizes agree).
        same = entry.size == wheel.path.stat().st_size and entry.blob_id == git_hash(wheel.path.read_bytes())
        return Found(f"git-sha1:{entry.blob_id}", same)

    def upload(self, wheel: VerifiedWheel) -> str | None:
        from huggingface_hub import CommitOperationAdd
        from huggingface_hub.errors import HfHubHTTPError

        path = self.dest.path_in_repo(wheel.path.name)
        entry = wheel.entry
        description = (f"sha256 {wheel.sha256}; built by imagegen: {entry.get('recipe')} {entry.get('version')},"
                       f" torch {entry.get('torch')}, {entry.get('cuda')}, Python {entry.get('python')},"
                       f" archs {entry.get('archs')}")
        if entry.get("external") is True:
            description = (f"sha256 {wheel.sha256}; built outside imagegen (external): {entry.get('recipe')}"
                           f" {entry.get('version')}, SASS/PTX verified by imagegen for archs {entry.get('archs')}")
        for _ in range(COMMIT_TRIES):
            head = self._call(self.api.repo_info, self.dest.repo_id, revision=self.dest.revision).sha
            if self.find(wheel, revision=head) is not None:
                return None  # a file of that name is there now
            try:
                with wheel.path.open("rb") as fh:
                    addition = CommitOperationAdd(path_in_repo=path, path_or_fileobj=fh)
                    self.api.create_commit(self.dest.repo_id, [addition], commit_message=f"Upload {wheel.path.name}",
                                           commit_description=description, revision=self.dest.revision,
                                           parent_commit=head)
            except HfHubHTTPError as exc:
                if _status(exc) in (409, 412):
                    continue  # the branch moved since its head was read: check again at the new head
                raise self._error(exc) from None
            return f"{self.api.endpoint}/{self.dest.repo_id}/blob/{self.dest.revision}/{path}"
        raise PublishError(f"{self.dest.repo_id}@{self.dest.revision} kept moving during {COMMIT_TRIES} tries to commit"
                           " the wheel: publish again")

    def _call(self, method, *args, **kwargs):
        from huggingface_hub.errors import HfHubHTTPError

        try:
            return method(*args, **kwargs)
        except HfHubHTTPError as exc:
            raise self._error(exc) from None

    def _error(self, exc) -> PublishError:
        from huggingface_hub.errors import RepositoryNotFoundError, RevisionNotFoundError

        if isinstance(exc, RepositoryNotFoundError):
            return self.give_up(f"no model repository {self.dest.repo_id}, or {self.token_name} may not read it (create it"
                                f" with `hf repo create {self.dest.repo_id}`, or publish --create)")
        if isinstance(exc, RevisionNotFoundError):
            return self.give_up(f"{self.dest.repo_id} has no branch {self.dest.revision} (create it, or name"
                                " another after @)")
        status = _status(exc)
        if status in (401, 403):
            return self.give_up(f"the Hub refused {self.token_name} (HTTP {status}): it needs write access to"
                                f" {self.dest.repo_id}")
        return PublishError(f"the Hub answered: {exc.server_message or exc}")


def _status(exc) -> int | None:
    response = getattr(exc, "response", None)
    return getattr(response, "status_code", None)


class _XetNoticeFilter(logging.Filter):
    """huggingface_hub warns, for every upload of an open file, that Xet storage takes no file objects:
    this module hands it one on purpose (see the docstring), so the warning tells the user nothing."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "not supported by Xet Storage" not in record.getMessage()


def _quiet_xet_notice() -> None:
    logger = logging.getLogger("huggingface_hub._commit_api")
    if not any(isinstance(f, _XetNoticeFilter) for f in logger.filters):
        logger.addFilter(_XetNoticeFilter())
