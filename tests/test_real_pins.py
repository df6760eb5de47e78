"""The real sglang artifacts of every pin: downloaded once (shared cache), checked, applied, and the
result compared with the committed series.lock bit for bit."""

from __future__ import annotations


import re

import pytest
from packaging.version import Version

from conftest import REPO_ROOT, git
from sglpatch.apply.apply_pins import apply_series
from sglpatch.series.patches import load_series
from sglpatch.sources import index_listing, pristine_tree
from sglpatch.sources.pins import load_pins
from sglpatch.sources.index_listing import released_versions

PINS = load_pins(REPO_ROOT / "upstream" / "pins.toml")

pytestmark = pytest.mark.network


@pytest.mark.parametrize("version", [pin.version for pin in PINS.pins])
def test_pristine_tree_of_the_real_release_is_upstream_layout(version):
    pin = PINS.select([version])[0]
    pristine = pristine_tree.pristine_from_index(pin)
    files = git(pristine.repo, "ls-tree", "-r", "--name-only", pristine.commit).splitlines()
    assert "python/sglang/__init__.py" in files
    assert any(f.endswith("/fused_metadata_copy.cuh") for f in files)
    assert all(f.startswith("python/") for f in files)
    assert not [f for f in files if f.endswith(".so") or ".dist-info/" in f or f == "python/sglang/_version.py"]


@pytest.mark.parametrize("version", [pin.version for pin in PINS.pins])
def test_apply_reproduces_the_committed_lock_exactly(project_copy, tmp_path, version):
    lock_before = (project_copy.root / "series.lock").read_text()
    report = apply_series(project_copy, [version], out_dir=tmp_path / "out")
    result = report.results[0]
    assert result.ok, result.error
    assert result.lock == "matches", f"{version}: {result.lock} {result.error}"
    # Witnessed both ways: a patch is applied only where its witness found the bug, and then passes;
    # a rendition claims a pin where it is not applied only because the pin holds it verbatim.
    for outcome in result.patches:
        if outcome.status in ("applied", "applied-with-offset", "applied-three-way"):
            assert outcome.witness_before.startswith("bug") and outcome.witness_after.startswith("clean"), outcome
        elif outcome.status == "not-needed":
            assert outcome.reverse_applies and outcome.witness_before.startswith("clean"), outcome
        else:
            assert outcome.status == "not-applicable", outcome
    assert (project_copy.root / "series.lock").read_text() == lock_before
    tree = tmp_path / "out" / "trees" / version
    assert git(tree, "rev-parse", "HEAD").strip() == result.commit
    assert git(tree, "status", "--porcelain").strip() == ""


def test_every_release_on_the_index_in_the_pinned_range_is_pinned():
    low, high = PINS.pins[0].parsed_version, PINS.newest.parsed_version
    pinned = {pin.parsed_version for pin in PINS.pins}
    missing = [str(v) for v in released_versions() if low <= v <= high and v not in pinned]
    assert not missing, f"on the package index but not pinned in upstream/pins.toml: {', '.join(missing)}"


def test_each_pin_is_its_index_artifact_with_the_index_sha256_and_upload_time():
    entries = index_listing.index_entries()
    for pin in PINS.pins:
        if pin.parsed_version <= Version("0.5.10.post1"):
            assert pin.artifact == f"sglang-{pin.version}.tar.gz"
        else:
            assert pin.artifact == f"sglang-{pin.version}-cp311-cp311-manylinux_2_34_x86_64.whl"
        entry = entries.get(pin.artifact)
        assert entry is not None, f"{pin.artifact} is not on the index"
        assert entry["sha256"] == pin.sha256, pin.version
        assert re.sub(r"\.\d+Z$", "Z", entry["released"]) == pin.released, pin.version


def test_every_rendition_claims_only_pinned_releases_of_the_index():
    pinned = {pin.parsed_version for pin in PINS.pins}
    releases = released_versions()
    for patch in load_series(REPO_ROOT / "patches").patches:
        for rendition in patch.renditions:
            claimed = [v for v in releases if rendition.applies_to.contains(v, prereleases=True)]
            assert claimed, f"{rendition.path}: claims no release"
            unpinned = [str(v) for v in claimed if v not in pinned]
            assert not unpinned, f"{rendition.path}: Applies-To {rendition.applies_to} claims unpinned {unpinned}"
