"""The pin of a release that is not pinned yet, from the package index: its CPython 3.11 x86_64
wheel, else its sdist, with the sha256 and upload time the index gives (``pins.with_pin`` writes
it into ``pins.toml``)."""

from __future__ import annotations

import datetime
import re
import tarfile
import zipfile
from dataclasses import asdict
from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources import index_listing, pristine_tree
from sglpatch.sources.pins import Pin


def new_pin(version: str, index=None) -> tuple[Pin, str]:
    """The pin for ``version`` from the index -- its CPython 3.11 x86_64 wheel, else its sdist --
    and a note where the upload time did not come from the index."""
    entries = index_listing.index_entries(index)
    candidates = [f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl", f"sglang-{version}.tar.gz"]
    name = next((candidate for candidate in candidates if candidate in entries), None)
    if name is None:
        where = pristine_tree.package_index.resolve(index).describe()
        raise SglpatchError(f"sglang {version}: neither {' nor '.join(candidates)} is on the index {where}")
    entry = entries[name]
    sha256 = entry["sha256"] or ""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise SglpatchError(f"{name}: the index gives no sha256 for it; pin it by hand")
    pin = Pin(
        version=version,
        tag=f"v{version}",
        commit="",
        commit_verified=False,
        commit_evidence="none yet: pinned by sglpatch rebase from the package index",
        artifact=name,
        sha256=sha256,
        released=re.sub(r"\.\d+Z$", "Z", entry["released"] or "") or "1970-01-01T00:00:00Z",
        rocm_image=f"lmsysorg/sglang:v{version}-rocm720-mi35x",
    )
    if entry["released"]:
        return pin, ""
    # Simple (PEP 503) pages carry no upload time; the artifact's own newest file time is a fact
    # about it, and the pin's comment says where it came from.
    released = _artifact_time(pristine_tree.fetch_artifact(pin, index))
    pin = Pin(**{**asdict(pin), "released": released})
    return pin, "the index gives no upload time; this is the newest file time inside the artifact"


def _artifact_time(artifact: Path) -> str:
    if artifact.name.endswith(".whl"):
        with zipfile.ZipFile(artifact) as archive:
            stamp = max(datetime.datetime(*info.date_time, tzinfo=datetime.UTC) for info in archive.infolist())
    else:
        with tarfile.open(artifact) as archive:
            stamp = datetime.datetime.fromtimestamp(max(m.mtime for m in archive.getmembers()), datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")
