"""``sglpatch patch tidy``: a rendition its neighbour reproduces (the same tree, by an exact or a
three-way apply, on every pin it covers) is removed and the neighbour's Applies-To grows to take
its pins; the newest rendition is the main file; nothing is written unless the staged series passes
``check`` and gives every pin the lock's tree. Also ``check``'s "main file must be the newest"
problem and ``staged.move_in``'s removals."""

from __future__ import annotations

import json
import os

import pytest

from conftest import BASE_FILES, TextWitness, example_lines, format_patch, git, make_wheel, pin_entry, tree_files
from sglpatch import cli
from sglpatch.apply import staged
from sglpatch.apply.apply_pins import apply_series
from sglpatch.plumbing.errors import SglpatchError

EXAMPLE = "python/sglang/srt/layers/example.py"
STEM = "0001-example"
MAIN = f"{STEM}.patch"
# 0.2.5 changed line 17, three lines above the patched line 20: in the hunk's context, so a
# rendition made on 0.2.0 does not apply exactly to 0.2.5 (nor one made on 0.2.5 to 0.2.0), but
# git's three-way apply from the blobs it was made on gives the same tree as the pin's own rendition.
CHANGED = "0.2.5 changed line 17\n"


@pytest.fixture
def three_pins(fake_project, test_witnesses, monkeypatch):
    """The fake project with a third pin, 0.2.5, whose example.py changed line 17; and a witness
    that finds the bug fixed where "patched" is in example.py."""
    wheel = make_wheel(fake_project.index, "0.2.5", {**BASE_FILES, "sglang/srt/layers/example.py": example_lines({17: CHANGED})})
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.2.5", wheel))
    fake_project.versions.append("0.2.5")
    monkeypatch.setitem(test_witnesses, "example-text", TextWitness("example-text", EXAMPLE, "patched"))
    return fake_project


def _patch(tmp_path, version, line20, applies_to):
    """The patch of line 20 made on ``version``'s example.py."""
    base = {**tree_files(version), EXAMPLE: example_lines({17: CHANGED} if version == "0.2.5" else {})}
    edit = base[EXAMPLE].replace("line 20\n", line20)
    return format_patch(tmp_path, base, {EXAMPLE: edit}, "example: patch line 20",
                        trailers={"Applies-To": applies_to, "Witness": "example-text"})


def _project_files(project) -> dict[str, bytes]:
    """Every file under patches/ and the lock, byte for byte."""
    files = {str(p.relative_to(project.root)): p.read_bytes() for p in sorted((project.root / "patches").rglob("*")) if p.is_file()}
    files["series.lock"] = project.lock_file.read_bytes()
    return files


def _lock(project) -> dict:
    return json.loads(project.lock_file.read_text())["pins"]


def _trees(project) -> dict[str, str]:
    return {version: entry["tree"] for version, entry in _lock(project).items()}


def _statuses(project) -> dict[str, str]:
    return {version: entry["patches"][0]["status"] for version, entry in _lock(project).items()}


def _reproduced_older_rendition(project, tmp_path):
    """The main file made on 0.2.5 (the newest pin), and a rendition made on 0.2.0 for 0.1.0 and
    0.2.0 that the main file reproduces there by its three-way apply; the lock proven by apply."""
    project.set_patches([(MAIN, _patch(tmp_path, "0.2.5", "patched\n", ">=0.2.5"))],
                        {STEM: [("0.2.0.patch", _patch(tmp_path, "0.2.0", "patched\n", "<0.2.5"))]})
    report = apply_series(project.project)
    assert report.ok, report.to_json()
    assert _statuses(project.project) == {"0.1.0": "applied", "0.2.0": "applied", "0.2.5": "applied"}


def test_tidy_removes_a_rendition_its_neighbour_reproduces_by_three_way_and_every_pin_keeps_its_tree(three_pins, tmp_path, capsys):
    _reproduced_older_rendition(three_pins, tmp_path)
    project = three_pins.project
    trees_before = _trees(project)
    commits_before = {version: entry["commit"] for version, entry in _lock(project).items()}
    newest_text = (project.patches_dir / MAIN).read_text()
    assert cli.main(["--root", str(three_pins.root), "check"]) == 0
    capsys.readouterr()

    assert cli.main(["--root", str(three_pins.root), "patch", "tidy"]) == 0
    said = capsys.readouterr().out
    assert (f"removed  patches/renditions/{STEM}/0.2.0.patch: patches/{MAIN} gives the same tree by its three-way "
            "apply on 0.1.0, 0.2.0") in said
    assert "written; applied to 0.1.0, 0.2.0, 0.2.5: every tree is the lock's" in said
    # The older rendition is gone; the newest stays in the main file, its Applies-To grown to every pin.
    assert sorted(str(p.relative_to(project.patches_dir)) for p in project.patches_dir.rglob("*.patch")) == [MAIN]
    main = project.series().get(MAIN).main
    assert main.trailer("Applies-To") == ">=0.1.0,<=0.2.5"
    assert (project.patches_dir / MAIN).read_text() == newest_text.replace("Applies-To: >=0.2.5", "Applies-To: >=0.1.0,<=0.2.5")
    # The lock the tidy wrote holds every pin's tree as before, made from the main file now.
    assert _trees(project) == trees_before
    assert _statuses(project) == {"0.1.0": "applied-three-way", "0.2.0": "applied-three-way", "0.2.5": "applied"}
    # The commits are recorded again: each carries the main file's message, its new Applies-To in it.
    assert all(_lock(project)[version]["commit"] != commit for version, commit in commits_before.items())

    # ``sglpatch apply`` (witnesses run) reproduces the lock the tidy wrote, tree for tree.
    lock_after_tidy = project.lock_file.read_bytes()
    assert cli.main(["--root", str(three_pins.root), "apply"]) == 0
    capsys.readouterr()
    applied = json.loads((three_pins.root / "build" / "apply-report.json").read_text())
    assert {pin["version"]: pin["tree"] for pin in applied["pins"]} == trees_before
    assert {pin["lock"] for pin in applied["pins"]} == {"matches"}
    by_pin = {pin["version"]: pin["patches"][0] for pin in applied["pins"]}
    assert {version: outcome["status"] for version, outcome in by_pin.items()} == _statuses(project)
    assert "lent by 0.2.5's pristine tree" in by_pin["0.1.0"]["detail"]
    assert project.lock_file.read_bytes() == lock_after_tidy
    for version in three_pins.versions:
        assert "patched\n" in (three_pins.root / "build" / "trees" / version / EXAMPLE).read_text()
    assert (three_pins.root / "build" / "trees" / "0.1.0" / EXAMPLE).read_text() == example_lines({20: "patched\n"})
    assert cli.main(["--root", str(three_pins.root), "check"]) == 0
    # Nothing is left to tidy.
    capsys.readouterr()
    assert cli.main(["--root", str(three_pins.root), "patch", "tidy"]) == 0
    assert "nothing to tidy" in capsys.readouterr().out


def test_tidy_dry_run_says_what_it_would_remove_and_writes_nothing(three_pins, tmp_path, capsys):
    _reproduced_older_rendition(three_pins, tmp_path)
    before = _project_files(three_pins.project)
    assert cli.main(["--root", str(three_pins.root), "patch", "tidy", "--dry-run"]) == 0
    said = capsys.readouterr().out
    assert (f"removed  patches/renditions/{STEM}/0.2.0.patch: patches/{MAIN} gives the same tree by its three-way "
            "apply on 0.1.0, 0.2.0") in said
    assert "dry run: nothing written (it would apply 0.1.0, 0.2.0, 0.2.5" in said
    assert _project_files(three_pins.project) == before


def test_tidy_writes_nothing_when_the_staged_series_gives_a_pin_another_tree_than_the_lock(three_pins, tmp_path, capsys):
    _reproduced_older_rendition(three_pins, tmp_path)
    project = three_pins.project
    # The lock holds another tree for 0.2.0 (here: the pristine one), so the tidied series' tree
    # there is not the lock's.
    locked = json.loads(project.lock_file.read_text())
    tree_repo = three_pins.root / "build" / "trees" / "0.2.0"
    pristine_tree = git(tree_repo, "rev-parse", f"{locked['pins']['0.2.0']['pristine']}^{{tree}}").strip()
    assert pristine_tree != locked["pins"]["0.2.0"]["tree"]
    locked["pins"]["0.2.0"]["tree"] = pristine_tree
    project.lock_file.write_text(json.dumps(locked, indent=2) + "\n")
    before = _project_files(project)
    capsys.readouterr()

    assert cli.main(["-q", "--root", str(three_pins.root), "patch", "tidy"]) == 2
    error = capsys.readouterr().err
    assert len(error.strip().splitlines()) == 1, error
    assert error.startswith("sglpatch: error: sglang 0.2.0: the tidied series gives tree ")
    assert f"the lock has {pristine_tree[:12]}; nothing written" in error
    assert _project_files(project) == before


def test_check_says_the_main_file_must_be_the_newest_rendition_and_tidy_moves_it(three_pins, tmp_path, capsys):
    # The 0.2.5 rendition makes another change than the main file's, so neither reproduces the
    # other and both stay; but the main file is the older one.
    old_main = _patch(tmp_path, "0.2.0", "patched\n", "<0.2.5")
    newest = _patch(tmp_path, "0.2.5", "patched for 0.2.5\n", ">=0.2.5")
    three_pins.set_patches([(MAIN, old_main)], {STEM: [("0.2.5.patch", newest)]})
    assert apply_series(three_pins.project).ok
    project = three_pins.project
    trees_before = _trees(project)

    assert cli.main(["--root", str(three_pins.root), "check"]) == 1
    said = capsys.readouterr().out
    assert (f"{MAIN}: the main file must be the newest rendition, but renditions/{STEM}/0.2.5.patch covers the newest "
            "pin 0.2.5; `sglpatch patch tidy` moves it") in said
    assert f"patches/{MAIN}" in said

    assert cli.main(["--root", str(three_pins.root), "patch", "tidy"]) == 0
    said = capsys.readouterr().out
    assert f"main     {MAIN}: the newest rendition is now the main file; its old text is patches/renditions/{STEM}/0.2.0.patch" in said
    assert "removed" not in said
    assert (project.patches_dir / MAIN).read_text() == newest
    assert (project.patches_dir / "renditions" / STEM / "0.2.0.patch").read_text() == old_main
    assert not (project.patches_dir / "renditions" / STEM / "0.2.5.patch").exists()
    assert _trees(project) == trees_before
    assert cli.main(["--root", str(three_pins.root), "check"]) == 0
    assert apply_series(project).ok and _trees(project) == trees_before


def test_move_in_removes_a_file_for_a_none_entry(tmp_path):
    gone, kept, new = tmp_path / "gone.patch", tmp_path / "kept.patch", tmp_path / "sub" / "new.patch"
    gone.write_bytes(b"old rendition\n")
    kept.write_bytes(b"before\n")
    staged.move_in({gone: None, kept: b"after\n", new: b"created\n", tmp_path / "never-there.patch": None})
    assert not gone.exists() and kept.read_bytes() == b"after\n" and new.read_bytes() == b"created\n"
    assert sorted(p.name for p in tmp_path.rglob("*") if p.is_file()) == ["kept.patch", "new.patch"]


def test_move_in_puts_a_removed_file_back_when_a_later_move_fails(tmp_path, monkeypatch):
    gone, kept, last = tmp_path / "gone.patch", tmp_path / "kept.patch", tmp_path / "last.patch"
    gone.write_bytes(b"old rendition\n")
    kept.write_bytes(b"before\n")
    last.write_bytes(b"last before\n")
    real_replace, calls = os.replace, []

    def fails_on_the_second(src, dst):
        calls.append(dst)
        if len(calls) == 2:
            raise OSError(28, "No space left on device")
        return real_replace(src, dst)

    # (The process runs as root here, so no permission makes a rename fail: the rename is made to.)
    monkeypatch.setattr(staged.os, "replace", fails_on_the_second)
    with pytest.raises(SglpatchError, match=r"cannot move .*last\.patch into place: \[Errno 28\] No space left on device; the files are as they were"):
        staged.move_in({gone: None, kept: b"after\n", last: b"last after\n"})
    monkeypatch.undo()
    assert gone.read_bytes() == b"old rendition\n"
    assert kept.read_bytes() == b"before\n" and last.read_bytes() == b"last before\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["gone.patch", "kept.patch", "last.patch"]  # no temporary left


def test_move_in_refuses_a_destination_it_cannot_read_back_and_leaves_no_temporary(tmp_path):
    removed, folder = tmp_path / "a.patch", tmp_path / "dir.patch"
    removed.write_bytes(b"kept\n")
    folder.mkdir()
    (folder / "inside").write_text("x")
    with pytest.raises(SglpatchError, match=r"cannot read .*dir\.patch, which would be replaced: .*; nothing written"):
        staged.move_in({removed: None, folder: b"new\n"})
    assert removed.read_bytes() == b"kept\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a.patch", "dir.patch"]


def test_tidy_without_a_lock_is_refused_in_one_line(three_pins, tmp_path, capsys):
    _reproduced_older_rendition(three_pins, tmp_path)
    project = three_pins.project
    project.lock_file.unlink(missing_ok=True)
    patches = lambda: {p: p.read_bytes() for p in (project.root / "patches").rglob("*") if p.is_file()}  # noqa: E731
    before = patches()
    capsys.readouterr()
    assert cli.main(["--root", str(project.root), "-q", "patch", "tidy"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "series.lock: not found" in err[0] and "Traceback" not in err[0]
    assert patches() == before and not project.lock_file.exists()
