"""What a value may look like before it reaches a Dockerfile or a shell.

imagegen never builds a shell command by pasting text: recipe values travel to the builder script
as JSON, and the Dockerfile only carries values that match one of these patterns (versions, image
references, URLs, names). A value with a newline, a quote, ``$`` or a backtick cannot match any of
them, so it can never become an extra Dockerfile instruction or shell command.
"""

from __future__ import annotations

import math
import os
import re
import stat
import sys
from pathlib import Path
from typing import Any, Iterable

from imagegen.errors import ConfigError, Unreadable, UnsafeValueError, printable
from imagegen.shipped.builder import imagegen_rules as rules

# Names and identifiers
RECIPE_NAME = re.compile(r"[a-z0-9][a-z0-9-]{0,63}")
DIST_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")
MODULE_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*")
ENV_NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]{0,127}")
# Environment values: printable ASCII without quotes, $, `, backslash or newline.
ENV_VALUE = re.compile(r"[A-Za-z0-9 _.,;:=+/@%^~{}()\[\]<>*!?#&|-]{0,512}")
VERSION_LABEL = re.compile(r"[A-Za-z0-9][A-Za-z0-9._+-]{0,63}")
PIP_REQUIREMENT = rules.PIP_REQUIREMENT  # the build reads them again with the same pattern
SYSTEM_PACKAGE = re.compile(r"[a-z0-9][a-z0-9.+-]{0,99}")

# Sources
GIT_URL = re.compile(r"(https?://|ssh://|git@)[A-Za-z0-9._~:/@%+-]+?(\.git)?")
GIT_REF = re.compile(r"[A-Za-z0-9][A-Za-z0-9._/-]{0,199}")
GIT_SHA = re.compile(r"[0-9a-f]{7,40}")
SHA256_HEX = re.compile(r"[0-9a-f]{64}")
# An sdist over HTTPS whose last path segment is the archive's file name.
SDIST_URL = re.compile(r"https://[A-Za-z0-9._~:/@%+-]+/[A-Za-z0-9][A-Za-z0-9._+-]{0,199}\.(tar\.gz|zip)")
RELATIVE_PATH = re.compile(r"(?!/)(?!.*\.\.)[A-Za-z0-9._/-]{1,200}")
RELATIVE_PATH_OR_EMPTY = re.compile(r"|(?!/)(?!.*\.\.)[A-Za-z0-9._/-]{1,200}")
LOCAL_PATH = re.compile(r"[A-Za-z0-9._/~-]{1,400}")
URL = re.compile(r"https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]+")
COMPILE_CACHE_URL = rules.COMPILE_CACHE_URL  # ccache's remote storage; the build reads it again
URL_OR_EMPTY = re.compile(r"|https?://[A-Za-z0-9._~:/?#\[\]@!&()*+,;=%-]+")

# Images: [registry[:port]/]path[:tag][@sha256:digest]
IMAGE_REF = re.compile(
    r"(?:[a-z0-9.-]+(?::[0-9]{1,5})?/)?[a-z0-9]+(?:[._-][a-z0-9]+)*(?:/[a-z0-9]+(?:[._-][a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@sha256:[0-9a-f]{64})?"
)
# A CDI device, as `RUN --device=` and `docker run --device` take it: vendor/class=name
# (the CDI spec's "kind" and a device name of it), e.g. nvidia.com/gpu=all or nvidia.com/gpu=0.
CDI_DEVICE = re.compile(r"[a-z0-9]+(?:[.-][a-z0-9]+)*/[A-Za-z0-9][A-Za-z0-9_.-]{0,62}=[A-Za-z0-9][A-Za-z0-9_.:-]{0,62}")
# Dockerfile paths inside the image
IMAGE_PATH = re.compile(r"/[A-Za-z0-9._/-]{1,200}|python3(\.[0-9]{1,2})?|python")


HINTS = {
    IMAGE_REF.pattern: "an image reference like registry:5000/name:tag or name@sha256:<digest>",
    URL.pattern: "an http(s) URL without quotes, spaces or $",
    IMAGE_PATH.pattern: "an absolute path of letters, digits, '.', '_', '-' and '/'",
    CDI_DEVICE.pattern: "a CDI device name like nvidia.com/gpu=all or nvidia.com/gpu=0",
}


def describe(value: Any, limit: int = 60) -> str:
    """A value as a message may show it: at most about ``limit`` characters, control characters
    escaped, never built by walking the value (a list or mapping is named, not printed, so an alias
    tree from a hostile YAML file costs nothing here)."""
    if isinstance(value, str):
        value = redact(value)
        cut = value[:limit]
        return printable(repr(cut)) + ("..." if len(value) > limit else "")
    if isinstance(value, bool) or value is None:
        return repr(value)
    if isinstance(value, int):
        if value.bit_length() > 64:
            return f"a {value.bit_length()}-bit integer"
        return repr(value)
    if isinstance(value, float):
        if math.isnan(value):
            return ".nan"
        if math.isinf(value):
            return ".inf" if value > 0 else "-.inf"
        return repr(value)
    if isinstance(value, (list, tuple)):
        return f"a list of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, dict):
        return f"a mapping of {len(value)} key{'s' if len(value) != 1 else ''}"
    if isinstance(value, (set, frozenset)):
        return f"a set of {len(value)} item{'s' if len(value) != 1 else ''}"
    if isinstance(value, (bytes, bytearray)):
        return f"{len(value)} bytes of binary data"
    return f"a {type(value).__name__}"


def validate(value: str, pattern: re.Pattern[str], what: str) -> str:
    """Return ``value`` if it fully matches ``pattern``; otherwise raise a one-line error."""
    if not isinstance(value, str) or not pattern.fullmatch(value):
        hint = HINTS.get(pattern.pattern, f"a value matching {pattern.pattern}")
        raise UnsafeValueError(f"{what} {describe(value, 77)} is not allowed: use {hint}")
    return value


def heredoc_delimiter(body: str, stem: str = "IMAGEGEN_EOF") -> str:
    """A heredoc terminator that no line of ``body`` equals, so the body cannot end it early."""
    lines = set(body.splitlines())
    delimiter, n = stem, 0
    while delimiter in lines:
        n += 1
        delimiter = f"{stem}_{n}"
    return delimiter


MAX_TOML_BYTES = 1 << 20  # a config file or pyproject.toml is a few KB; a larger one is a mistake


def read_toml(path: Path, *, inside: Path | None = None) -> dict[str, Any]:
    """A TOML file (imagegen's config, a source tree's pyproject.toml): a regular file of at most
    MAX_TOML_BYTES (a FIFO or device is refused without blocking), and with ``inside`` (a source tree
    from someone else) one that lies in that tree."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
    try:
        data = read_regular_file(path, limit=MAX_TOML_BYTES, inside=inside)
    except Unreadable as exc:
        raise ConfigError(f"{path}: cannot read: {exc}") from None
    try:
        return tomllib.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise ConfigError(f"{path}: not UTF-8 text (a binary file?): not a TOML config file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ConfigError(f"{path}: not valid TOML (nested too deeply)") from None


def read_regular_file(path: Path, *, limit: int, inside: Path | None = None) -> bytes:
    """The bytes of ``path``, a regular file of at most ``limit`` bytes, and (with ``inside``) one
    whose real location, symlinks resolved, lies in that directory.

    A FIFO, socket, device or directory is refused without blocking on it (checked before it is
    opened, opened with O_NONBLOCK and checked again), so a hostile ``patches/x.patch`` FIFO cannot
    hang a command and a symlink to /etc/passwd cannot be read through a recipe.
    """
    try:
        real = Path(os.path.realpath(path, strict=True))
    except FileNotFoundError:
        raise Unreadable("no such file (or a symlink to nothing)") from None
    except (OSError, ValueError, RuntimeError) as exc:
        raise Unreadable(os_reason(exc)) from None
    if inside is not None:
        try:
            root = Path(os.path.realpath(inside, strict=True))
        except (OSError, ValueError, RuntimeError) as exc:
            raise Unreadable(f"its directory cannot be read ({os_reason(exc)})") from None
        if not real.is_relative_to(root):
            raise Unreadable("it leads outside its directory (a symlink or path to elsewhere)")
    try:
        if not stat.S_ISREG(os.stat(real).st_mode):
            raise Unreadable("not a regular file (a directory, FIFO, socket or device)")
        flags = os.O_RDONLY
        for name in ("O_NONBLOCK", "O_NOCTTY", "O_CLOEXEC", "O_NOFOLLOW", "O_BINARY"):
            flags |= getattr(os, name, 0)
        fd = os.open(real, flags)
        try:
            st = os.fstat(fd)
            if not stat.S_ISREG(st.st_mode):
                raise Unreadable("not a regular file (a directory, FIFO, socket or device)")
            if st.st_size > limit:
                raise Unreadable(f"{st.st_size} bytes; at most {limit} are read")
            chunks, size = [], 0
            while size <= limit:
                chunk = os.read(fd, min(1 << 20, limit + 1 - size))
                if not chunk:
                    break
                chunks.append(chunk)
                size += len(chunk)
        finally:
            os.close(fd)
    except OSError as exc:
        raise Unreadable(os_reason(exc)) from None
    if size > limit:
        raise Unreadable(f"more than {limit} bytes")
    return b"".join(chunks)


def is_file(path: Path) -> bool:
    """Whether ``path`` is a file (or a link to one); False, not an error, for a name the system refuses
    (too long, a NUL byte)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return False


def os_reason(exc: BaseException) -> str:
    """An OSError as a few words (its strerror), without the path it repeats."""
    if isinstance(exc, OSError) and exc.strerror:
        return exc.strerror[0].lower() + exc.strerror[1:]
    return exc.__class__.__name__


# ------------------------------------------------------------------------------------------------
# Credentials in URLs. A credential stays where the user put it (~/.netrc, the environment, a CI
# secret, a BuildKit secret): every message imagegen prints goes through ``redact`` (ImagegenError
# does it for every error), and every URL that would be written somewhere (a Dockerfile, the cell
# document inside an image, a manifest, a workflow, an index page) is refused by ``no_credentials``
# when it carries one. docs/security.md says what is promised and how it is tested.

# scheme://USERINFO@ (userinfo holds no '/', '?', '#' or '@'; git@host:path has no scheme and
# names a user, not a secret, so it is not matched); also scheme:/USERINFO@, what a URL becomes as a
# path (str(Path("https://u:TOKEN@h/x")) is "https:/u:TOKEN@h/x"). Not file:///PATH: its authority is
# empty, so `file:///srv@v2.2.0` is the repository /srv at v2.2.0, not a user "srv".
_USERINFO = re.compile(r"(?i)\b(?!file:///)([a-z][a-z0-9+.-]{0,30}:/{1,3})([^/?#@\s'\"<>]+)@")
# Query parameters that carry a secret (?access_token=..., &X-Amz-Signature=..., ?sig=...).
_SECRET_PARAM = re.compile(
    r"(?i)([?&;](?:access_token|private_token|token|auth|password|passwd|pwd|secret|client_secret|api_key|apikey"
    r"|key|sig|signature|x-amz-signature|x-amz-credential|x-amz-security-token|x-goog-signature|x-goog-credential)=)"
    r"[^&#\s'\"<>]+")
# user:password@host without a scheme: a registry reference (user:TOKEN@registry/ns/img), a cache spec's
# ref=...; the password is a secret. Not name:tag@sha256:... (an image pinned by digest), not git@host:path
# (a user name alone).
_BARE_USERINFO = re.compile(r"(?<![\w.+%/:@-])([\w.+%-]+:[^\s/@'\"<>,=;]+)@(?!sha\d{3}:)(?=[A-Za-z0-9\[])")
# An HTTP credential a server echoed back (a reflected request's headers): Authorization: Basic/Bearer ...
_AUTH_HEADER = re.compile(r"(?i)\b(basic|bearer)(\s+)(?=[A-Za-z0-9+/._~-]*[0-9])([A-Za-z0-9+/._~-]{12,}=*)")
REDACTED = "***"


def redact(text: str, secrets: Iterable[str] = ()) -> str:
    """``text`` with the userinfo of every URL in it (``https://user:TOKEN@host`` -> ``https://***@host``),
    every secret-carrying query value (``?token=...``), the password of a ``user:password@host`` without
    a scheme (a registry reference), the value of an HTTP credential a server echoed back (``Basic ...``,
    ``Bearer ...``) and every value of ``secrets`` (a password imagegen read from a netrc, an upload
    token: longest first, one may contain another) replaced by ``***``. The one place imagegen hides credentials; used on every error and on every message that
    quotes a URL or a server's answer."""
    if not isinstance(text, str):
        return text
    for secret in sorted({s for s in secrets if s}, key=len, reverse=True):
        text = text.replace(secret, REDACTED)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + m.group(2) + REDACTED, text)
    if "@" not in text and "=" not in text:
        return text
    text = _USERINFO.sub(_redacted_userinfo, text)
    text = _BARE_USERINFO.sub(REDACTED + "@", text)
    return _SECRET_PARAM.sub(lambda m: m.group(1) + REDACTED, text)


def _redacted_userinfo(m: re.Match[str]) -> str:
    # ssh://git@host/...: a user name, which ssh authenticates with a key, is no secret; a password is.
    if "ssh" in m.group(1).lower() and ":" not in m.group(2):
        return m.group(0)
    return m.group(1) + REDACTED + "@"


def has_credentials(url: str) -> bool:
    """Whether ``url`` carries a credential: userinfo (``user:password@``, or a token as the user
    name; ``user:password@host`` without a scheme too) or a secret query parameter."""
    return isinstance(url, str) and redact(url) != url


def no_credentials(url: str, what: str, instead: str) -> str:
    """``url`` if it carries no credential; else a one-line UnsafeValueError (exit 2) that shows the
    URL redacted and says where the credential belongs (``instead``), since ``what`` would be written
    where anyone who gets the file, page or image can read it."""
    if has_credentials(url):
        raise UnsafeValueError(f"{what} {describe(redact(url), 77)} carries a credential (user:password@ or a token),"
                               f" which would be written where others read it: give the URL without it and {instead}")
    return url


def served_folder_url(url: str, what: str, instead: str) -> str:
    """``url``, the http(s) address a folder is served at (a wheelhouse, an index), checked: URL characters
    only, no credential (``instead``: where it belongs), no query or fragment; without a trailing '/'."""
    validate(url, URL, what)
    no_credentials(url, what, instead)
    if "?" in url or "#" in url:
        raise UnsafeValueError(f"{what} {describe(url, 77)} carries a query or fragment: give the URL of the folder"
                               " the wheelhouse is served from")
    return url.rstrip("/")


# A build variable (``--env``, a recipe's ``env``) is written into the Dockerfile (ENV), the bake file and the
# image's history: one named like a credential, or whose value is one, is refused.
_SECRET_NAME = re.compile(r"(?i)(TOKEN|SECRET|PASSW(OR)?D|PASSPHRASE|CREDENTIAL|API_?KEY|ACCESS_?KEY|PRIVATE_?KEY"
                          r"|COOKIE)")
# Tokens of the services a build might reach: GitHub, GitLab, Hugging Face, PyPI, npm, Slack, AWS, OpenAI-like.
_TOKEN_VALUE = re.compile(r"(ghp_|gho_|ghu_|ghs_|ghr_|github_pat_|glpat-|hf_[A-Za-z0-9]{20}|pypi-AgE|npm_[A-Za-z0-9]{20}"
                          r"|xox[abposr]-|AKIA[0-9A-Z]{16}|ASIA[0-9A-Z]{16}|sk-[A-Za-z0-9_-]{20})")


def env_secret(name: str, value: str) -> str | None:
    """Why the build variable ``name=value`` must not be written into a Dockerfile (it is or carries a
    credential), or None."""
    if _SECRET_NAME.search(name):
        return f"{name} is named like a credential"
    if has_credentials(value):
        return "its value carries a credential (user:password@ or a token in a URL)"
    if _TOKEN_VALUE.search(value):
        return "its value looks like an access token"
    return None


ENV_SECRET_INSTEAD = ("a build variable is written into the Dockerfile, the bake file and the image's history:"
                      " a credential the build needs goes in the netrc file imagegen build --netrc hands it as a"
                      " BuildKit secret")


# Where each kind of credential belongs instead of a URL (the second half of no_credentials' message).
NETRC_INSTEAD = ("put the credential in ~/.netrc (machine HOST login USER password TOKEN): git and pip read it, and"
                 " imagegen build/push/pull --netrc ~/.netrc hands it to the builds as the netrc BuildKit secret")
CI_SECRET_INSTEAD = "keep the credential in the repository's secrets (the workflow reads them from there)"


# ------------------------------------------------------------------------------------------------
# Folders a command writes into. A wheelhouse is a folder of its own: every command that writes one
# (build, pull, collect, index) refuses the filesystem root, the home folder and the system's folders
# (collect writes a manifest.json into every folder below the one it is given).
SYSTEM_FOLDERS = frozenset(("/bin", "/boot", "/dev", "/etc", "/home", "/lib", "/lib32", "/lib64", "/libx32", "/media",
                            "/mnt", "/opt", "/proc", "/root", "/run", "/sbin", "/srv", "/sys", "/tmp", "/usr",
                            "/usr/bin", "/usr/lib", "/usr/local", "/usr/share", "/var", "/var/lib", "/var/tmp"))
# Below these nothing is a wheelhouse.
SYSTEM_TREES = ("/boot", "/dev", "/etc", "/proc", "/sys", "/usr/bin", "/usr/lib", "/usr/sbin", "/bin", "/sbin")


def wheelhouse_folder(out: Path, flag: str, error: type[Exception] = UnsafeValueError) -> Path:
    """``out`` resolved, when it may be written as a wheelhouse; else ``error`` saying which folder to give."""
    if "\x00" in str(out):  # no path holds one (the OS refuses it); a config file's string can
        raise error(f"{flag} {printable(str(out))[:200]} holds a NUL character: give a folder's path")
    resolved = Path(os.path.realpath(out))
    text = resolved.as_posix()
    try:
        home = Path.home().resolve()
    except (RuntimeError, OSError):
        home = None
    if resolved == Path(resolved.anchor) or resolved == home or text in SYSTEM_FOLDERS \
            or any(text.startswith(tree + "/") for tree in SYSTEM_TREES):
        raise error(f"{flag} {printable(str(out))[:200]} is not a wheelhouse (the filesystem root, your home folder or"
                    " a system folder): give a folder of its own, the one imagegen build --out wrote")
    return resolved


# --------------------------------------------------------------------------------------------
# Member names of an archive (a wheel) imagegen reads or rewrites

_DRIVE = re.compile(r"[A-Za-z]:")


def member_name_problem(name: str) -> str | None:
    """Why the member ``name`` of a wheel (a zip archive) would land outside the folder it is unpacked
    into: an absolute name, a drive, a ``..`` part (either slash); None for a plain relative name.
    pip refuses to install a wheel with such a member; a tool that unpacks with zipfile (auditwheel)
    turns it into a top-level folder instead, which pip would then install."""
    if not name:
        return "has no name"
    if name.startswith(("/", "\\")) or _DRIVE.match(name):
        return "is an absolute path"
    if ".." in re.split(r"[/\\]", name):
        return "has a '..' part"
    return None
