"""``sglpatch check --redundant-renditions``: a rendition its neighbour reproduces (the very same
tree, by an exact or a three-way apply, on every pin it covers) is noted, not refused, and kept:
removing it is ``sglpatch patch tidy``'s work, not ``check``'s."""

from __future__ import annotations

import json

from conftest import BASE_FILES, example_lines, format_patch, make_wheel, pin_entry, tree_files
from sglpatch import cli
from sglpatch.rebase.redundant import reproduced_renditions

EXAMPLE = "python/sglang/srt/layers/example.py"


def _patch(tmp_path, base, edit, applies_to):
    return format_patch(tmp_path, base, {EXAMPLE: edit}, "example: patch line 20", trailers={"Applies-To": applies_to})


def test_a_rendition_whose_neighbour_gives_the_same_tree_is_noted_with_the_step_and_kept(fake_project, tmp_path, capsys):
    # 0.2.5 changed a line near the patch: its rendition (the main file) is what 0.2.0's gives by a three-way apply.
    changed = example_lines({17: "0.2.5 changed line 17\n"})
    wheel = make_wheel(fake_project.index, "0.2.5", {**BASE_FILES, "sglang/srt/layers/example.py": changed})
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.2.5", wheel))
    old = _patch(tmp_path, tree_files("0.1.0"), example_lines({20: "patched\n"}), "==0.1.0")
    same = _patch(tmp_path, tree_files("0.2.0"), example_lines({20: "patched\n"}), "==0.2.0")
    merged = _patch(tmp_path, {**tree_files("0.2.5"), EXAMPLE: changed}, changed.replace("line 20\n", "patched\n"), "==0.2.5")
    # The main file is the newest rendition (0.2.5's), as ``check`` requires.
    fake_project.set_patches([("0001-example.patch", merged)], {"0001-example": [("0.1.0.patch", old), ("0.2.0.patch", same)]})
    found = {(r.rendition.rsplit("/", 1)[-1], r.neighbour.rsplit("/", 1)[-1]): (r.step, r.pins)
             for r in reproduced_renditions(fake_project.project)}
    assert found == {
        ("0.1.0.patch", "0.2.0.patch"): ("exact", ["0.1.0"]),
        ("0.2.0.patch", "0.1.0.patch"): ("exact", ["0.2.0"]),
        ("0001-example.patch", "0.2.0.patch"): ("three-way", ["0.2.5"]),
        ("0.2.0.patch", "0001-example.patch"): ("three-way", ["0.2.0"]),
    }
    # ``check`` prints them as notes, not problems: the exit status stays 0 and nothing is removed.
    patches = fake_project.root / "patches"
    before = {p.relative_to(patches).as_posix(): p.read_bytes() for p in patches.rglob("*.patch")}
    assert len(before) == 3
    assert cli.main(["--root", str(fake_project.root), "check", "--redundant-renditions", "--json"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["problems"] == [] and len(document["redundant_renditions"]) == 4
    assert ("note: patches/0001-example.patch: patches/renditions/0001-example/0.2.0.patch gives the same"
            " tree by its three-way apply on 0.2.5; `sglpatch patch tidy` removes it") in captured.err
    assert {p.relative_to(patches).as_posix(): p.read_bytes() for p in patches.rglob("*.patch")} == before
    # Without the flag, ``check`` reads no pristine tree and says nothing of it.
    assert cli.main(["--root", str(fake_project.root), "check", "--json"]) == 0
    assert "redundant_renditions" not in json.loads(capsys.readouterr().out)


def test_a_rendition_that_differs_from_what_its_neighbour_gives_is_not_noted(fake_project, tmp_path):
    old = _patch(tmp_path, tree_files("0.1.0"), example_lines({20: "patched\n"}), "==0.1.0")
    other = _patch(tmp_path, tree_files("0.2.0"), example_lines({20: "patched, another way\n"}), "==0.2.0")
    fake_project.set_patches([("0001-example.patch", old)], {"0001-example": [("0.2.0.patch", other)]})
    assert reproduced_renditions(fake_project.project) == []
