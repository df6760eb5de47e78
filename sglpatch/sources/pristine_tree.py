"""A pin's pristine tree, as a git commit in upstream's layout (``python/sglang/...``).

Two ways in. The default takes the package-index artifact (checked by sha256) and streams its
members straight into ``git fast-import`` -- no unpacked copy on disk, no ``git add`` scan -- with a
fixed identity and the release's upload time as the date, so the pristine commit hash is the same on
every machine. The other fetches the pinned commit from a git remote or mirror with git itself and
checks its SHA.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import stat
import tarfile
import tempfile
import zipfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path, PurePosixPath

from sglpatch.plumbing import cache, progress
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import IDENTITY_EMAIL, IDENTITY_NAME, git_out, run_git
from sglpatch.sources import index_listing, package_index
from sglpatch.sources.index_listing import file_sha256
from sglpatch.sources.package_index import IndexConfig
from sglpatch.sources.pins import Pin

PRISTINE_REF = "refs/heads/pristine"
FETCH_TIMEOUT_S = 600  # one shallow fetch of a release; past it the remote is hung
COMPLETE_MARKER = "sglpatch-complete.json"

# What the artifacts hold that upstream's git does not; docs/series.md lists the same.
LEFT_OUT_DESCRIPTION = (
    "compiled extension modules (*.so), packaging metadata (*.dist-info/, *.egg-info/, PKG-INFO, "
    "the setup.cfg that setuptools writes into an sdist), and the generated sglang/_version.py"
)
_SETUPTOOLS_SETUP_CFG = re.compile(rb"^\s*\[egg_info\]\s*\ntag_build\s*=\s*\ntag_date\s*=\s*0\s*$")


@dataclass(frozen=True)
class Member:
    """One file of the pristine tree: its path in upstream's layout, git mode and bytes."""

    path: str
    mode: str
    data: bytes


@dataclass(frozen=True)
class Pristine:
    repo: Path
    commit: str
    source: str


# -- download -----------------------------------------------------------------------------------


def fetch_artifact(pin: Pin, index: IndexConfig | str | None = None) -> Path:
    """The pin's artifact in the cache, downloaded if absent, refused unless its sha256 matches.

    ``index`` defaults to pip's configuration here (``sglpatch.sources.package_index``)."""
    dest = cache.cache_root() / "artifacts" / pin.artifact
    with cache.entry_lock(dest):
        if dest.exists():
            identity = _file_identity(dest)
            if file_sha256(dest) == pin.sha256:
                _checked[str(dest)] = (identity, pin.sha256)
                return dest
            dest.unlink()  # a damaged or tampered cache entry: fetch it again
        config = package_index.resolve(index)
        url = _artifact_url(config, pin.artifact)
        fd, tmp_name = tempfile.mkstemp(dir=dest.parent, prefix=".download-")
        tmp = Path(tmp_name)
        try:
            digest = hashlib.sha256()
            with os.fdopen(fd, "wb") as out, config.open(url) as response:
                length = response.headers.get("Content-Length") if hasattr(response, "headers") else None
                with progress.transfer(f"download {pin.artifact}", int(length) if length else None) as shown:
                    while chunk := response.read(1 << 20):
                        digest.update(chunk)
                        out.write(chunk)
                        shown.advance(len(chunk))
            got = digest.hexdigest()
            if got != pin.sha256:
                raise SglpatchError(
                    f"{pin.artifact} from {url}: sha256 {got} does not match the pin's {pin.sha256}; "
                    "refusing it (upstream/pins.toml)"
                )
            os.replace(tmp, dest)
            _checked[str(dest)] = (_file_identity(dest), got)
        except OSError as exc:
            raise SglpatchError(f"{pin.artifact} from {url}: download failed: {exc}") from None
        finally:
            tmp.unlink(missing_ok=True)
    return dest


def pin_metadata(pin: Pin, index: IndexConfig | str | None = None) -> str:
    """The core metadata of the pin's artifact, read out of it once per artifact sha256.

    The cache entry is keyed by the pin's sha256, the artifact's content, so a valid one needs no
    artifact at all: a warm run neither hashes nor opens the release (``pristine_from_index``
    trusts its entry the same way)."""
    return _remembered_metadata(pin.sha256, lambda: fetch_artifact(pin, index))


def artifact_metadata(artifact: Path, sha256: str | None = None) -> str:
    """The core metadata (METADATA of a wheel, PKG-INFO of an sdist) of a downloaded artifact,
    remembered by the artifact's sha256 as ``pin_metadata`` does. Without ``sha256`` the digest
    is the one ``fetch_artifact`` checked for this file in this process, else the file's own."""
    if sha256 is None:
        try:
            sha256 = _checked_digest(artifact) or file_sha256(artifact)
        except OSError as exc:
            raise SglpatchError(f"{artifact}: cannot read its metadata: {exc}") from None
    return _remembered_metadata(sha256, lambda: artifact)


def _remembered_metadata(sha256: str, artifact) -> str:
    known = _metadata_memo.get(sha256)
    if known is None:
        entry = cache.cache_root() / "metadata" / f"{sha256}.json"
        known = _valid_metadata(entry, sha256)
        if known is None:
            known = _read_metadata(artifact())
            # Parallel readers of one artifact write the same text; the rename keeps it whole.
            cache.write_atomically(entry, json.dumps({
                "artifact_sha256": sha256, "metadata_sha256": _text_digest(known), "metadata": known,
            }))
        _metadata_memo[sha256] = known
    return known


# sha256 -> metadata text, for this process; the cache entry serves the next one.
_metadata_memo: dict[str, str] = {}
# path -> (its stat when fetch_artifact hashed it, the sha256 it had): a file changed since is
# hashed again.
_checked: dict[str, tuple[tuple[int, int, int, int], str]] = {}


def _file_identity(path: Path) -> tuple[int, int, int, int]:
    info = path.stat()
    return (info.st_ino, info.st_size, info.st_mtime_ns, info.st_ctime_ns)


def _checked_digest(path: Path) -> str | None:
    known = _checked.get(str(path))
    try:
        return known[1] if known is not None and known[0] == _file_identity(path) else None
    except OSError:
        return None


def _valid_metadata(entry: Path, sha256: str) -> str | None:
    """The entry's text when it is whole and for this artifact; else None (it is read again)."""
    try:
        saved = json.loads(entry.read_text())
        text = saved["metadata"]
        if saved["artifact_sha256"] != sha256 or saved["metadata_sha256"] != _text_digest(text):
            return None
        return text
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None


def _text_digest(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()


def _read_metadata(artifact: Path) -> str:
    try:
        if artifact.name.endswith(".whl"):
            with zipfile.ZipFile(artifact) as archive:
                name = next((n for n in archive.namelist() if n.endswith(".dist-info/METADATA")), None)
                if name is None:
                    raise SglpatchError(f"{artifact}: the wheel holds no .dist-info/METADATA")
                return archive.read(name).decode()
        with tarfile.open(artifact) as archive:
            member = next(
                (m for m in archive.getmembers() if m.name.count("/") == 1 and m.name.endswith("/PKG-INFO")), None
            )
            handle = archive.extractfile(member) if member is not None else None
            if handle is None:
                raise SglpatchError(f"{artifact}: the sdist holds no top-level PKG-INFO")
            return handle.read().decode()
    except (zipfile.BadZipFile, tarfile.TarError, EOFError, OSError, UnicodeDecodeError) as exc:
        raise SglpatchError(f"{artifact}: cannot read its metadata: {exc}") from None


def _artifact_url(config: IndexConfig, filename: str) -> str:
    """Where ``filename`` lives: the first index (or find-links folder) that lists it."""
    for url in config.urls + config.find_links:
        folder = package_index.local_folder(url)
        if folder is not None and (folder / filename).is_file():
            # A flat local folder: the file is where its name says; listing it would hash everything.
            return (folder / filename).resolve().as_uri()
    entries = index_listing.index_entries(config)
    if filename not in entries:
        raise SglpatchError(f"{filename}: not on the package index {config.describe()}")
    return entries[filename]["url"]


# -- unpack -------------------------------------------------------------------------------------


def artifact_members(artifact: Path, pin: Pin) -> Iterator[Member]:
    """The artifact's files in upstream's layout, checked for unsafe paths, minus what git lacks."""
    if pin.artifact_kind == "sdist":
        top = f"sglang-{pin.version}"
        members = _tar_members(artifact)
    else:
        top = None
        members = _zip_members(artifact)
    for name, mode, data in members:
        parts = _safe_parts(artifact, name)
        if top is not None:
            if parts[0] != top:
                raise SglpatchError(f"{artifact.name}: member {name!r} is outside the {top}/ folder")
            parts = parts[1:]
        if not parts or _left_out(parts, data):
            continue
        path = "/".join(("python", *parts))
        if mode == "120000":
            _check_link(artifact, path, data.decode())
        yield Member(path=path, mode=mode, data=data)


def _safe_parts(artifact: Path, name: str) -> tuple[str, ...]:
    posix = PurePosixPath(name)
    if posix.is_absolute() or "\\" in name or ".." in posix.parts or not posix.parts:
        raise SglpatchError(f"{artifact.name}: unsafe member path {name!r}; refusing the artifact")
    return tuple(part for part in posix.parts if part != ".")


def _check_link(artifact: Path, path: str, target: str) -> None:
    """Refuse a link whose target, resolved from its folder, leaves the tree."""
    depth = len(PurePosixPath(path).parent.parts)
    for part in PurePosixPath(target).parts:
        if part == "/" or (part == ".." and depth == 0):
            raise SglpatchError(f"{artifact.name}: link {path} points outside the tree ({target})")
        depth += -1 if part == ".." else 0 if part == "." else 1


def _left_out(parts: tuple[str, ...], data: bytes) -> bool:
    first, last = parts[0], parts[-1]
    if first.endswith((".dist-info", ".egg-info", ".data")):
        return True
    if last.endswith((".so", ".pyd")) or ".so." in last:
        return True
    if parts == ("PKG-INFO",):
        return True
    if parts == ("setup.cfg",) and _SETUPTOOLS_SETUP_CFG.match(data):
        return True
    return parts == ("sglang", "_version.py")


def _tar_members(artifact: Path) -> Iterator[tuple[str, str, bytes]]:
    try:
        with tarfile.open(artifact) as archive:
            for info in archive:
                if info.isdir():
                    continue
                if info.issym():
                    yield info.name, "120000", info.linkname.encode()
                elif info.islnk():
                    raise SglpatchError(f"{artifact.name}: hard link {info.name!r}; refusing the artifact")
                elif info.isfile():
                    handle = archive.extractfile(info)
                    assert handle is not None
                    yield info.name, _file_mode(info.mode), handle.read()
                else:
                    raise SglpatchError(f"{artifact.name}: special file {info.name!r}; refusing the artifact")
    except (tarfile.TarError, EOFError, OSError) as exc:
        raise SglpatchError(f"{artifact.name}: not a readable tar archive: {exc}") from None


def _zip_members(artifact: Path) -> Iterator[tuple[str, str, bytes]]:
    try:
        with zipfile.ZipFile(artifact) as archive:
            for info in archive.infolist():
                if info.is_dir():
                    continue
                unix_mode = info.external_attr >> 16
                data = archive.read(info)
                if stat.S_ISLNK(unix_mode):
                    yield info.filename, "120000", data
                else:
                    yield info.filename, _file_mode(unix_mode), data
    except (zipfile.BadZipFile, OSError) as exc:
        raise SglpatchError(f"{artifact.name}: not a readable zip archive: {exc}") from None


def _file_mode(unix_mode: int) -> str:
    return "100755" if unix_mode & 0o111 else "100644"


# -- pristine commit ----------------------------------------------------------------------------


def pristine_from_index(pin: Pin, index: IndexConfig | str | None = None) -> Pristine:
    """The pin's pristine commit, built from its artifact once and cached."""
    path = _pristine_entry(pin)
    return Pristine(repo=path, commit=_imported(path, pin, index), source="index")


def cached_pristine(pin: Pin) -> Path | None:
    """The pin's pristine repository where the cache holds it whole already, else None."""
    path = _pristine_entry(pin)
    return path if _valid_entry(path) else None


def release_files(pin: Pin, paths: Iterable[str], index: IndexConfig | str | None = None) -> Path:
    """A repository whose one commit holds only ``paths`` of the pin's artifact (those it has):
    the blobs a three-way apply reads, where importing the whole release is not worth its time
    and cache (a user's first ``apply --into``). Its blobs are the pristine tree's, byte for byte."""
    wanted = sorted(set(paths))
    named = f"{pin.version}-{pin.sha256[:16]}-{_text_digest(chr(10).join(wanted))[:16]}.git"
    path = cache.cache_root() / "release-files" / named
    _imported(path, pin, index, frozenset(wanted))
    return path


def _pristine_entry(pin: Pin) -> Path:
    return cache.cache_root() / "pristine" / f"{pin.version}-{pin.sha256[:16]}.git"


def _imported(path: Path, pin: Pin, index: IndexConfig | str | None, only: frozenset[str] | None = None) -> str:
    with cache.entry_lock(path):
        commit = _valid_entry(path)
        if commit is None:
            # The entry is keyed by the artifact's sha256, so a valid one needs no artifact at all.
            artifact = fetch_artifact(pin, index)
            cache.remove(path)
            with cache.staging(path) as staging:
                run_git(["init", "--bare", "--quiet", str(staging)], staging.parent)
                commit = _fast_import(staging, pin, artifact, only)
                _finish_entry(staging, commit)
    return commit


def pristine_from_git(pin: Pin, url: str) -> Pristine:
    """The pin's commit fetched from ``url`` (remote or local mirror), its SHA checked."""
    if not pin.commit:
        raise SglpatchError(
            f"pin {pin.version}: no commit is recorded in upstream/pins.toml, so the git source "
            "cannot check what it fetches; use the index source"
        )
    path = cache.cache_root() / "git" / f"{pin.commit}.git"
    with cache.entry_lock(path):
        commit = _valid_entry(path)
        if commit is None:
            cache.remove(path)
            with cache.staging(path) as staging:
                run_git(["init", "--bare", "--quiet", str(staging)], staging.parent)
                fetched = run_git(["fetch", "--quiet", "--depth=1", url, pin.commit], staging, check=False,
                                  timeout=FETCH_TIMEOUT_S)
                if fetched.returncode != 0:
                    # Servers that refuse a bare SHA still serve the tag; the SHA check below is
                    # what makes either way trustworthy.
                    fetched = run_git(["fetch", "--quiet", "--depth=1", url, f"refs/tags/{pin.tag}"], staging,
                                      check=False, timeout=FETCH_TIMEOUT_S)
                    if fetched.returncode != 0:
                        raise SglpatchError(
                            f"pin {pin.version}: cannot fetch {pin.commit} or tag {pin.tag} from {url} "
                            f"(each fetch is given {FETCH_TIMEOUT_S} s): {fetched.stderr.decode(errors='replace').strip()}"
                        )
                commit = git_out(["rev-parse", "FETCH_HEAD^{commit}"], staging)
                if commit != pin.commit:
                    raise SglpatchError(
                        f"pin {pin.version}: {url} gave commit {commit} for {pin.tag}, "
                        f"but upstream/pins.toml pins {pin.commit}; refusing it"
                    )
                run_git(["update-ref", PRISTINE_REF, commit], staging)
                _finish_entry(staging, commit)
    return Pristine(repo=path, commit=commit, source=f"git:{url}")


def _fast_import(repo: Path, pin: Pin, artifact: Path, only: frozenset[str] | None = None) -> str:
    when = int(datetime.fromisoformat(pin.released.replace("Z", "+00:00")).timestamp())
    message = (
        f"sglang {pin.version} (pristine)\n\n"
        f"Tree of {pin.artifact}\n"
        f"sha256 {pin.sha256}\n"
        f"Left out: {LEFT_OUT_DESCRIPTION}.\n"
        + (f"Only {len(only)} of its files: those a patch changes.\n" if only is not None else "")
    ).encode()
    identity = f"{IDENTITY_NAME} <{IDENTITY_EMAIL}> {when} +0000".encode()
    members = sorted((member for member in artifact_members(artifact, pin) if only is None or member.path in only),
                     key=lambda member: member.path)
    seen: set[str] = set()
    stream = [b"commit ", PRISTINE_REF.encode(), b"\nauthor ", identity, b"\ncommitter ", identity]
    stream += [b"\ndata ", str(len(message)).encode(), b"\n", message, b"\n"]
    for member in members:
        if member.path in seen:
            raise SglpatchError(f"{artifact.name}: {member.path} appears twice; refusing the artifact")
        seen.add(member.path)
        stream += [b"M ", member.mode.encode(), b" inline ", _quote(member.path), b"\n"]
        stream += [b"data ", str(len(member.data)).encode(), b"\n", member.data, b"\n"]
    stream.append(b"done\n")
    # No deltas and light compression: this pack is a local cache entry, and both settings halve
    # the import time of a 5,800-file release.
    run_git(
        ["-c", "core.compression=1", "-c", "fastimport.unpackLimit=0", "fast-import", "--quiet", "--done", "--depth=0", "--date-format=raw"],
        repo,
        input=b"".join(stream),
    )
    return git_out(["rev-parse", PRISTINE_REF], repo)


def _quote(path: str) -> bytes:
    escaped = path.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
    return f'"{escaped}"'.encode()


def _finish_entry(repo: Path, commit: str) -> None:
    run_git(["symbolic-ref", "HEAD", PRISTINE_REF], repo)
    (repo / COMPLETE_MARKER).write_text(json.dumps({"commit": commit, "packs": _pack_sizes(repo)}))


def _valid_entry(path: Path) -> str | None:
    """The entry's commit if it was completed and its packs are intact, else None."""
    try:
        marker = json.loads((path / COMPLETE_MARKER).read_text())
    except (OSError, ValueError):
        return None
    if marker.get("packs") != _pack_sizes(path):
        return None
    check = run_git(["cat-file", "-e", f"{marker.get('commit')}^{{tree}}"], path, check=False)
    if check.returncode != 0:
        return None
    return marker["commit"]


def _pack_sizes(repo: Path) -> dict[str, int]:
    pack_dir = repo / "objects" / "pack"
    if not pack_dir.is_dir():
        return {}
    return {entry.name: entry.stat().st_size for entry in sorted(pack_dir.iterdir())}
