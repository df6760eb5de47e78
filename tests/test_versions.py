"""Series versions: bump records one; diff is a range-diff with one-sided patches shown plainly."""

from __future__ import annotations

import datetime

import pytest

from conftest import format_patch, git, tree_files
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.series import versions
from sglpatch.series.patches import series_version

EXAMPLE = "python/sglang/srt/layers/example.py"


def _patch(tmp_path, line, text, subject):
    files = tree_files("0.1.0")
    return format_patch(tmp_path, files, {EXAMPLE: files[EXAMPLE].replace(f"line {line}\n", text)}, subject)


def _commit_all(root, message):
    git(root, "add", "-A")
    git(root, "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", message)


def test_bump_records_the_next_version_with_its_entry(fake_project):
    patches = fake_project.root / "patches"
    assert versions.bump(patches, "Refresh 0001 for 0.2.0", today=datetime.date(2026, 12, 1)) == "2"
    assert series_version(patches) == "2"
    text = (patches / "CHANGELOG.md").read_text()
    assert text.index("## v2 — 2026-12-01\n\n- Refresh 0001 for 0.2.0\n") < text.index("## v1")


def test_bump_needs_a_message(fake_project):
    with pytest.raises(SglpatchError, match="needs a changelog message"):
        versions.bump(fake_project.root / "patches", "  ")


def test_diff_between_versions_shows_changed_pairs_and_added_patches_plainly(fake_project, tmp_path):
    root = fake_project.root
    git(root, "init", "-q")
    fake_project.set_patches([("0001-a.patch", _patch(tmp_path, 20, "twenty\n", "example: change line 20")),
                              ("0002-b.patch", _patch(tmp_path, 30, "thirty\n", "example: change line 30"))])
    _commit_all(root, "series v1")
    versions.bump(root / "patches", "0001 reworked, 0002 dropped, 0003 added")
    fake_project.set_patches([("0001-a.patch", _patch(tmp_path, 20, "TWENTY\n", "example: change line 20")),
                              ("0003-c.patch", _patch(tmp_path, 10, "ten\n", "example: change line 10"))])
    output = versions.range_diff(fake_project.project, "1", "2")
    assert output.startswith("series v1 -> v2 on sglang 0.1.0")
    assert "removed in the new version: example: change line 30" in output
    assert "added in the new version: example: change line 10" in output
    assert " ! 1:  " in output and "example: change line 20" in output
    assert "    -+twenty\n    ++TWENTY" in output
    assert "-:  -------" not in output


def test_unknown_version_is_refused(fake_project):
    git(fake_project.root, "init", "-q")
    _commit_all(fake_project.root, "v1")
    with pytest.raises(SglpatchError, match="series v7 is in neither"):
        versions.range_diff(fake_project.project, "7", "1")
