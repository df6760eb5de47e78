"""Writing patches with quilt and git habits: start, commit, refresh, export for quilt and git am."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from conftest import TextWitness, format_patch, git, pristine_subtree, tree_files
from sglpatch.apply.apply_pins import apply_series
from sglpatch.series import authoring, export

EXAMPLE = "python/sglang/srt/layers/example.py"
USER = ["-c", "user.name=Patch Writer", "-c", "user.email=writer@example.com"]


def _example_patch(tmp_path):
    files = tree_files("0.1.0")
    return format_patch(tmp_path, files, {EXAMPLE: files[EXAMPLE].replace("line 20\n", "line 20 patched\n")},
                        "example: patch line 20")


@pytest.fixture
def applied(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    assert apply_series(fake_project.project, run_witnesses=False).ok
    return fake_project


def _commit(tree, path, old, new, message):
    target = tree / path
    target.write_text(target.read_text().replace(old, new))
    git(tree, "add", path)
    git(tree, *USER, "commit", "-q", "-m", message)


def test_a_new_commit_becomes_the_next_numbered_patch_in_the_series(applied):
    project = applied.project
    tree = project.build_dir / "trees" / "0.1.0"
    _commit(tree, EXAMPLE, "line 30\n", "line 30 mine\n", "layers: fix line 30\n\nProblem, cause, fix.\n\nWitness: guard-text\nOrigin: a test")
    refreshed = authoring.refresh(project, "0.1.0")
    assert [(r.action, r.path.name) for r in refreshed] == [
        ("unchanged", "0001-example.patch"), ("new", "0002-layers-fix-line-30.patch")]
    written = (project.patches_dir / "0002-layers-fix-line-30.patch").read_text()
    assert "Applies-To: ==0.1.0" in written and "Upstream-Status: Pending" in written and "Witness: guard-text" in written
    assert (project.patches_dir / "series").read_text().splitlines()[-1] == "0002-layers-fix-line-30.patch"
    assert authoring.problems_of(project, refreshed) == ([], [])
    # apply takes the patch as the series' own commit; the refreshed commit is kept under refs/sglpatch.
    report = apply_series(project, ["0.1.0"], update_lock=True, run_witnesses=False)
    assert report.ok, report.to_json()
    assert "line 30 mine" in (tree / EXAMPLE).read_text()
    assert git(tree, "log", "-1", "--format=%ce").strip() == "sglpatch@localhost"
    assert "refs/sglpatch/refreshed/" in git(tree, "for-each-ref", "--format=%(refname)")


def test_a_new_patch_is_named_in_the_series_style_lowercase_words_of_its_subject(applied):
    project = applied.project
    tree = project.build_dir / "trees" / "0.1.0"
    _commit(tree, EXAMPLE, "line 30\n", "line 30 mine\n",
            "[AMD] Parse the connector type up to the first `://` only\n\nWitness: guard-text\nOrigin: a test")
    [*_, new] = authoring.refresh(project, "0.1.0")
    assert new.path.name == "0002-amd-parse-the-connector-type-up-to-the-first-only.patch"
    assert (project.patches_dir / "series").read_text().splitlines()[-1] == new.path.name
    assert authoring.patch_file_name(12, "A very long subject " + "word " * 30).startswith("0012-a-very-long-subject-word-")
    assert len(authoring.patch_file_name(12, "A very long subject " + "word " * 30)) <= len("0012-.patch") + authoring.NAME_LENGTH


def test_a_new_patch_without_its_witness_is_named_by_check(applied):
    project = applied.project
    tree = project.build_dir / "trees" / "0.1.0"
    _commit(tree, EXAMPLE, "line 31\n", "line 31 mine\n", "layers: fix line 31")
    refreshed = authoring.refresh(project, "0.1.0")
    problems, _ = authoring.problems_of(project, refreshed)
    assert any("missing the Witness trailer" in p for p in problems) and any("missing the Origin trailer" in p for p in problems)


def test_a_new_patch_whose_test_is_still_to_write_is_told_where_it_goes_and_check_still_refuses(applied, capsys):
    from sglpatch import cli

    project = applied.project
    tree = project.build_dir / "trees" / "0.1.0"
    (project.patches_dir / "tests").mkdir()  # the series keeps regression tests: a new patch needs one
    _commit(tree, EXAMPLE, "line 32\n", "line 32 mine\n", "layers: fix line 32\n\nProblem, cause, fix.\n\nWitness: guard-text\nOrigin: a test")
    assert cli.main(["--root", str(project.root), "patch", "refresh", "0.1.0"]) == 0
    said = capsys.readouterr().out
    assert "next: its regression test: add patches/tests/0002-layers-fix-line-32/test/registered/unit/" in said
    assert cli.main(["--root", str(project.root), "check"]) != 0
    assert "no regression test" in capsys.readouterr().out


def test_amending_a_series_commit_updates_that_patch(applied):
    project = applied.project
    tree = project.build_dir / "trees" / "0.1.0"
    target = tree / EXAMPLE
    target.write_text(target.read_text().replace("line 20 patched\n", "line 20 patched better\n"))
    git(tree, "add", EXAMPLE)
    git(tree, *USER, "commit", "-q", "--amend", "--no-edit")
    refreshed = authoring.refresh(project, "0.1.0")
    assert [(r.action, r.path.name) for r in refreshed] == [("updated", "0001-example.patch")]
    assert "+line 20 patched better" in (project.patches_dir / "0001-example.patch").read_text()
    assert (project.patches_dir / "series").read_text().count(".patch") == 1
    assert apply_series(project, ["0.1.0"], update_lock=True, run_witnesses=False).ok


def test_a_commit_for_another_layout_becomes_a_rendition(applied):
    project = applied.project
    tree = project.build_dir / "trees" / "0.1.0"
    _commit(tree, EXAMPLE, "line 5\n", "line 5 here\n", "layers: the example for this layout\n\nWitness: guard-text\nOrigin: a test")
    refreshed = authoring.refresh(project, "0.1.0", rendition_of="0001-example")
    path = project.patches_dir / "renditions" / "0001-example" / "0.1.0.patch"
    assert [(r.action, r.path) for r in refreshed][-1] == ("new rendition", path)
    assert "Applies-To: ==0.1.0" in path.read_text()
    assert (project.patches_dir / "series").read_text().count(".patch") == 1


@pytest.fixture
def prefixed(fake_project, tmp_path, monkeypatch, test_witnesses):
    """A series whose subjects carry upstream's bracketed prefixes, as every patch of ours does:
    git am (git mailinfo) drops them from the commit's subject."""
    files = tree_files("0.1.0")
    first = format_patch(tmp_path, files, {EXAMPLE: files[EXAMPLE].replace("line 20\n", "line 20 patched\n")},
                         "[AMD] example: patch line 20", trailers={"Witness": "line-20"})
    files = {**files, EXAMPLE: files[EXAMPLE].replace("line 20\n", "line 20 patched\n")}
    second = format_patch(tmp_path, files, {EXAMPLE: files[EXAMPLE].replace("line 25\n", "line 25 patched\n")},
                          "[Quark] [v2] example: patch line 25", trailers={"Witness": "line-25"})
    monkeypatch.setitem(test_witnesses, "line-20", TextWitness("line-20", EXAMPLE, "line 20 patched"))
    monkeypatch.setitem(test_witnesses, "line-25", TextWitness("line-25", EXAMPLE, "line 25 patched"))
    fake_project.set_patches([("0001-amd-example.patch", first), ("0002-quark-example.patch", second)])
    assert apply_series(fake_project.project).ok
    return fake_project


def test_refresh_after_start_with_no_edit_changes_nothing_when_subjects_carry_bracketed_prefixes(prefixed):
    project = prefixed.project
    tree = project.build_dir / "trees" / "0.1.0"
    # git am's rewriting, as the tree holds it: the prefixes are gone from the commits' subjects.
    assert git(tree, "log", "-2", "--format=%s").splitlines() == ["example: patch line 25", "example: patch line 20"]
    before = {p: p.read_bytes() for p in project.patches_dir.rglob("*") if p.is_file()}
    authoring.start(project, "0.1.0")
    refreshed = authoring.refresh(project, "0.1.0")
    assert [(r.action, r.path.name) for r in refreshed] == [
        ("unchanged", "0001-amd-example.patch"), ("unchanged", "0002-quark-example.patch")]
    assert {p: p.read_bytes() for p in project.patches_dir.rglob("*") if p.is_file()} == before


def test_amending_a_commit_whose_patch_has_a_bracketed_prefix_updates_that_patch_and_keeps_its_subject(prefixed):
    project = prefixed.project
    tree = project.build_dir / "trees" / "0.1.0"
    git(tree, "checkout", "-q", "sglpatch~1")
    target = tree / EXAMPLE
    target.write_text(target.read_text().replace("line 20 patched\n", "line 20 patched better\n"))
    git(tree, "add", EXAMPLE)
    git(tree, *USER, "commit", "-q", "--amend", "--no-edit")
    amended = git(tree, "rev-parse", "HEAD").strip()
    git(tree, "checkout", "-q", "sglpatch")
    git(tree, *USER, "rebase", "-q", "--onto", amended, "sglpatch~1", "sglpatch")
    refreshed = authoring.refresh(project, "0.1.0")
    assert [(r.action, r.path.name) for r in refreshed] == [
        ("updated", "0001-amd-example.patch"), ("unchanged", "0002-quark-example.patch")]
    first = (project.patches_dir / "0001-amd-example.patch").read_text()
    assert "+line 20 patched better" in first and "Subject: [PATCH] [AMD] example: patch line 20\n" in first
    assert "Subject: [PATCH] [Quark] [v2] example: patch line 25\n" in (project.patches_dir / "0002-quark-example.patch").read_text()
    assert (project.patches_dir / "series").read_text().count(".patch") == 2
    report = apply_series(project, ["0.1.0"], update_lock=True)
    assert report.ok, report.to_json()


def _pristine_checkout(tree, dest):
    archive = subprocess.run(["git", "archive", "pristine"], cwd=tree, capture_output=True, check=True).stdout
    dest.mkdir()
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _same_files(a, b):
    listing = lambda root: sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and ".pc" not in p.parts)  # noqa: E731
    assert listing(a) == listing(b)
    for name in listing(a):
        assert (a / name).read_bytes() == (b / name).read_bytes(), name


def _quilt_push(patches, tree):
    if shutil.which("quilt") is None:
        pytest.skip("quilt is not installed (Debian's quilt; .ci/run installs it)")
    env = {**os.environ, "QUILT_PATCHES": str(patches), "QUILT_PC": ".pc"}
    run = subprocess.run(["quilt", "push", "-a", "--fuzz=0"], cwd=tree, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    shutil.rmtree(tree / ".pc", ignore_errors=True)


def _quilt_export_gives_the_pins_tree(project, version, tmp_path):
    tree = project.build_dir / "trees" / version
    folder = export.export_quilt(project, version, tmp_path / "quilt-patches")
    work = _pristine_checkout(tree, tmp_path / "work")
    _quilt_push(folder, work)
    archive = subprocess.run(["git", "archive", "sglpatch"], cwd=tree, capture_output=True, check=True).stdout
    (tmp_path / "applied").mkdir()
    subprocess.run(["tar", "-x", "-C", str(tmp_path / "applied")], input=archive, check=True)
    _same_files(work, tmp_path / "applied")
    return folder


def _mbox_export_gives_the_locked_tree(project, version, tmp_path):
    mbox = export.export_mbox(project, version, tmp_path / "series.mbox")
    clone = tmp_path / "clone"
    git(tmp_path, "clone", "-q", str(project.build_dir / "trees" / version), str(clone))
    git(clone, "checkout", "-q", "-b", "am", "origin/pristine")
    git(clone, *USER, "am", "-q", str(mbox))
    locked = __import__("json").loads(project.lock_file.read_text())["pins"][version]["tree"]
    assert git(clone, "rev-parse", "HEAD^{tree}").strip() == locked


def test_a_quilt_export_pushes_with_real_quilt_onto_the_pristine_tree(applied, tmp_path):
    folder = _quilt_export_gives_the_pins_tree(applied.project, "0.1.0", tmp_path)
    assert (folder / "series").read_text().splitlines()[1:] == ["0001-example.patch"]


def test_an_mbox_export_gives_the_locked_tree_with_plain_git_am(applied, tmp_path):
    _mbox_export_gives_the_locked_tree(applied.project, "0.1.0", tmp_path)


def test_a_pin_whose_patch_apply_merged_three_way_exports_its_own_commit_for_quilt_and_git_am(three_way, tmp_path):
    # On 0.2.5 the rendition applies only by git's three-way merge: plain quilt and git am need the
    # pin's own patch, its locked commit as git format-patch writes it.
    project = three_way.project
    (tmp_path / "quilt").mkdir()
    folder = _quilt_export_gives_the_pins_tree(project, "0.2.5", tmp_path / "quilt")
    assert (folder / "0001-example.patch").read_bytes() != (project.root / "patches" / "0001-example.patch").read_bytes()
    (tmp_path / "am").mkdir()
    _mbox_export_gives_the_locked_tree(project, "0.2.5", tmp_path / "am")


def test_refresh_leaves_a_patch_apply_merged_three_way_unchanged_when_its_commit_is_the_series_own(three_way):
    # On 0.2.5 the pin's commit differs from the rendition's text (its context is 0.2.5's): it is
    # still the series' own commit, so refresh must not rewrite the rendition every other pin uses.
    project = three_way.project
    before = {p: p.read_bytes() for p in (project.root / "patches").rglob("*") if p.is_file()}
    authoring.start(project, "0.2.5")
    refreshed = authoring.refresh(project, "0.2.5")
    assert [(item.path.name, item.action) for item in refreshed] == [("0001-example.patch", "unchanged")]
    assert {p: p.read_bytes() for p in (project.root / "patches").rglob("*") if p.is_file()} == before


def test_export_refuses_to_overwrite(applied, tmp_path):
    from sglpatch.plumbing.errors import SglpatchError

    (tmp_path / "full").mkdir()
    (tmp_path / "full" / "mine").write_text("x")
    with pytest.raises(SglpatchError, match="not empty"):
        export.export_quilt(applied.project, "0.1.0", tmp_path / "full")
    (tmp_path / "taken.mbox").write_text("mine")
    with pytest.raises(SglpatchError, match="exists"):
        export.export_mbox(applied.project, "0.1.0", tmp_path / "taken.mbox")
    assert (tmp_path / "taken.mbox").read_text() == "mine"


@pytest.mark.network
def test_the_real_series_of_a_pin_pushes_with_quilt_to_the_locked_tree(project_copy, tmp_path):
    version = "0.5.14"
    report = apply_series(project_copy, [version], run_witnesses=False)
    assert report.ok, report.to_json()
    folder = export.export_quilt(project_copy, version, tmp_path / "patches")
    work = pristine_subtree(version, tmp_path / "work", path="python")
    _quilt_push(folder, work)
    tree = project_copy.build_dir / "trees" / version
    archive = subprocess.run(["git", "archive", "sglpatch", "python"], cwd=tree, capture_output=True, check=True).stdout
    (tmp_path / "applied").mkdir()
    subprocess.run(["tar", "-x", "-C", str(tmp_path / "applied")], input=archive, check=True)
    _same_files(work, tmp_path / "applied")
