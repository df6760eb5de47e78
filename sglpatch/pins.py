"""Pinned upstream releases, read from ``upstream/pins.toml``."""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path

from packaging.version import InvalidVersion, Version

from sglpatch.errors import SglpatchError

SHA256_RE = re.compile(r"^[0-9a-f]{64}$")
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
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
    try:
        data = tomllib.loads(path.read_text())
    except FileNotFoundError:
        raise SglpatchError(f"{path}: pins file not found") from None
    except tomllib.TOMLDecodeError as exc:
        raise SglpatchError(f"{path}: not valid TOML: {exc}") from None
    if "index_url" in data:
        raise SglpatchError(
            f"{path}: index_url is not read here: the package index is pip's (pip.conf, PIP_INDEX_URL) "
            "or SGLPATCH_INDEX_URL; remove the key"
        )
    entries = data.get("pin", [])
    if not entries:
        raise SglpatchError(f"{path}: no [[pin]] entries")
    pins = [_parse_pin(path, number, entry) for number, entry in enumerate(entries, 1)]
    versions = [pin.version for pin in pins]
    duplicated = sorted({v for v in versions if versions.count(v) > 1})
    if duplicated:
        raise SglpatchError(f"{path}: pin {', '.join(duplicated)} listed more than once")
    pins.sort(key=lambda pin: pin.parsed_version)
    return Pins(path=path, pins=tuple(pins))


def _parse_pin(path: Path, number: int, entry: dict) -> Pin:
    where = f"{path}: pin #{number}"
    missing = [name for name in REQUIRED_FIELDS if not entry.get(name)]
    if missing:
        raise SglpatchError(f"{where}: missing {', '.join(missing)}")
    try:
        Version(entry["version"])
    except InvalidVersion:
        raise SglpatchError(f"{where}: version {entry['version']!r} is not a PEP 440 version") from None
    if not SHA256_RE.match(entry["sha256"]):
        raise SglpatchError(f"{where} ({entry['version']}): sha256 must be 64 lowercase hex digits")
    commit = entry.get("commit", "")
    verified = bool(entry.get("commit_verified", False))
    if commit and not COMMIT_RE.match(commit):
        raise SglpatchError(f"{where} ({entry['version']}): commit must be a full 40-digit SHA or empty")
    if verified and not commit:
        raise SglpatchError(f"{where} ({entry['version']}): commit_verified without a commit")
    if entry["version"] not in entry["artifact"]:
        raise SglpatchError(
            f"{where} ({entry['version']}): artifact {entry['artifact']!r} is not of this version"
        )
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
