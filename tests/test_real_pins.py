"""The real sglang artifacts of every pin: downloaded once (shared cache), checked, applied, and the
result compared with the committed series.lock bit for bit."""

from __future__ import annotations


import pytest

from conftest import REPO_ROOT, git
from sglpatch import sources
from sglpatch.pins import load_pins
from sglpatch.project import apply_series

PINS = load_pins(REPO_ROOT / "upstream" / "pins.toml")

pytestmark = pytest.mark.network


@pytest.mark.parametrize("version", [pin.version for pin in PINS.pins])
def test_pristine_tree_of_the_real_release_is_upstream_layout(version):
    pin = PINS.select([version])[0]
    pristine = sources.pristine_from_index(pin)
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
    assert (project_copy.root / "series.lock").read_text() == lock_before
    tree = tmp_path / "out" / "trees" / version
    assert git(tree, "rev-parse", "HEAD").strip() == result.commit
    assert git(tree, "status", "--porcelain").strip() == ""
