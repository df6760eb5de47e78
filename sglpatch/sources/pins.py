"""Pinned upstream releases, read from ``upstream/pins.toml``, and the file written with a pin
added or removed (tomlkit keeps its comments and layout)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import asdict, dataclass
from datetime import datetime
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sglpatch.plumbing.errors import SglpatchError

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
RELEASED_RE = re.compile(r"^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}Z$")
REQUIRED_FIELDS = ("version", "tag", "artifact", "sha256", "released", "rocm_image")


@dataclass(frozen=True)
class Pin:
    version: str
    tag: str
    commit: str
    commit_verified: bool
    commit_evidence: str
    artifact: str
    sha256: str
    released: str
    rocm_image: str

    @property
    def parsed_version(self) -> Version:
        return Version(self.version)

    @property
    def artifact_kind(self) -> str:
        return "sdist" if self.artifact.endswith((".tar.gz", ".zip")) else "wheel"


@dataclass(frozen=True)
class Pins:
    path: Path
    pins: tuple[Pin, ...]

    def select(self, names: list[str] | None) -> list[Pin]:
        """The pins named (all when none are), refusing a name that is not pinned."""
        if not names:
            return list(self.pins)
        by_version = {pin.version: pin for pin in self.pins}
        unknown = [name for name in names if name.removeprefix("v") not in by_version]
        if unknown:
            raise SglpatchError(
                f"{self.path}: unknown pin {', '.join(unknown)}; "
                f"pinned: {', '.join(by_version)}"
            )
        return [by_version[name.removeprefix("v")] for name in names]

    @property
    def newest(self) -> Pin:
        return max(self.pins, key=lambda pin: pin.parsed_version)


def load_pins(path: Path) -> Pins:
    """The pins file, every entry checked; a malformed one is refused naming the file and line."""
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise SglpatchError(f"{path}: pins file not found") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise SglpatchError(f"{path}: cannot read it: {exc}") from None
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise SglpatchError(f"{path}: not valid TOML: {exc}") from None
    if "index_url" in data:
        raise SglpatchError(
            f"{path}: index_url is not read here: the package index is pip's (pip.conf, PIP_INDEX_URL) "
            "or SGLPATCH_INDEX_URL; remove the key"
        )
    entries = data.get("pin", [])
    if not isinstance(entries, list) or not all(isinstance(entry, dict) for entry in entries):
        raise SglpatchError(f"{path}: 'pin' must be an array of tables, written [[pin]] (one per release)")
    if not entries:
        raise SglpatchError(f"{path}: no [[pin]] entries")
    lines = [number for number, line in enumerate(text.splitlines(), 1) if line.strip().startswith("[[pin]]")]
    pins = [
        _parse_pin(path, number, lines[number - 1] if number <= len(lines) else 0, entry)
        for number, entry in enumerate(entries, 1)
    ]
    versions = [pin.version for pin in pins]
    duplicated = sorted({v for v in versions if versions.count(v) > 1})
    if duplicated:
        raise SglpatchError(f"{path}: pin {', '.join(duplicated)} listed more than once")
    pins.sort(key=lambda pin: pin.parsed_version)
    return Pins(path=path, pins=tuple(pins))


STRING_FIELDS = (*REQUIRED_FIELDS, "commit", "commit_evidence")


def _parse_pin(path: Path, number: int, line: int, entry: dict) -> Pin:
    where = f"{path}:{line}: pin #{number}" if line else f"{path}: pin #{number}"
    wrong = [name for name in STRING_FIELDS if name in entry and not isinstance(entry[name], str)]
    if wrong:
        raise SglpatchError(f"{where}: {', '.join(wrong)} must be a string (in double quotes)")
    if "commit_verified" in entry and not isinstance(entry["commit_verified"], bool):
        raise SglpatchError(f"{where}: commit_verified must be true or false")
    missing = [name for name in REQUIRED_FIELDS if not entry.get(name)]
    if missing:
        raise SglpatchError(f"{where}: missing {', '.join(missing)}")
    try:
        Version(entry["version"])
    except InvalidVersion:
        raise SglpatchError(f"{where}: version {entry['version']!r} is not a PEP 440 version") from None
    where = f"{where} ({entry['version']})"
    if not SHA256_RE.match(entry["sha256"]):
        raise SglpatchError(f"{where}: sha256 must be 64 lowercase hex digits")
    if not RELEASED_RE.match(entry["released"]):
        raise SglpatchError(f"{where}: released {entry['released']!r} must be a UTC time like 2026-04-05T23:57:27Z")
    try:
        datetime.fromisoformat(entry["released"].replace("Z", "+00:00"))
    except ValueError as exc:
        raise SglpatchError(f"{where}: released {entry['released']!r} is not a real time: {exc}") from None
    commit = entry.get("commit", "")
    verified = entry.get("commit_verified", False)
    if commit and not COMMIT_RE.match(commit):
        raise SglpatchError(f"{where}: commit must be a full 40-digit SHA or empty")
    if verified and not commit:
        raise SglpatchError(f"{where}: commit_verified without a commit")
    if entry["version"] not in entry["artifact"]:
        raise SglpatchError(f"{where}: artifact {entry['artifact']!r} is not of this version")
    if "/" in entry["artifact"] or "\\" in entry["artifact"] or entry["artifact"].startswith("."):
        raise SglpatchError(f"{where}: artifact {entry['artifact']!r} must be a plain file name")
    return Pin(
        version=entry["version"],
        tag=entry["tag"],
        commit=commit,
        commit_verified=verified,
        commit_evidence=entry.get("commit_evidence", ""),
        artifact=entry["artifact"],
        sha256=entry["sha256"],
        released=entry["released"],
        rocm_image=entry["rocm_image"],
    )


# -- writing pins.toml ----------------------------------------------------------------------------
# tomlkit is imported by the writers alone: the noxfile reads the pins in nox's own Python, which
# has nox and its dependencies (packaging) but not ours.


def with_pin(pins_text: str, pin: Pin, note: str = "") -> str:
    """``pins.toml`` with ``pin`` inserted in version order (before the first newer pin); ``note``,
    where given, says in a comment where its ``released`` came from."""
    import tomlkit

    document = tomlkit.parse(pins_text)
    entries = document["pin"]
    entry = tomlkit.table()
    if note:
        entry.add(tomlkit.comment(f"released: {note}"))
    for name, value in asdict(pin).items():
        entry.add(name, value)
    newer = next((number for number, other in enumerate(entries) if Version(other["version"]) > pin.parsed_version), None)
    if newer is None:
        entries[-1].add(tomlkit.nl())
        entries.append(entry)
    else:
        entry.add(tomlkit.nl())
        entries.insert(newer, entry)
    return tomlkit.dumps(document)


def without_pin(pins_text: str, version: str) -> str:
    """``pins.toml`` without the pin of ``version``."""
    import tomlkit

    document = tomlkit.parse(pins_text)
    entries = document.get("pin", [])
    found = next((number for number, entry in enumerate(entries) if entry.get("version") == version), None)
    if found is None:
        raise SglpatchError(f"upstream/pins.toml: {version} is not pinned")
    del entries[found]
    return tomlkit.dumps(document)
