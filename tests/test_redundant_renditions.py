"""``sglpatch check --redundant-renditions``: a rendition its neighbour reproduces (the very same
tree, by an exact or a three-way apply, on every pin it covers) is noted, not refused, and kept."""

from __future__ import annotations

import json

from conftest import BASE_FILES, format_patch, make_wheel, pin_entry, tree_files
from sglpatch import cli
from sglpatch.rebase.redundant import reproduced_renditions

EXAMPLE = "python/sglang/srt/layers/example.py"


def _lines(replace):
    lines = [f"line {n}\n" for n in range(1, 41)]
    for number, text in replace.items():
        lines[number - 1] = text
    return "".join(lines)


def _patch(tmp_path, base, edit, applies_to):
    return format_patch(tmp_path, base, {EXAMPLE: edit}, "example: patch line 20", trailers={"Applies-To": applies_to})


def test_a_rendition_whose_neighbour_gives_the_same_tree_is_noted_with_the_step_and_kept(fake_project, tmp_path, capsys):
    # 0.2.5 changed a line near the patch: its rendition is what 0.2.0's gives by a three-way apply.
    changed = _lines({17: "0.2.5 changed line 17\n"})
    wheel = make_wheel(fake_project.index, "0.2.5", {**BASE_FILES, "sglang/srt/layers/example.py": changed})
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.2.5", wheel))
    old = _patch(tmp_path, tree_files("0.1.0"), _lines({20: "patched\n"}), "==0.1.0")
    same = _patch(tmp_path, tree_files("0.2.0"), _lines({20: "patched\n"}), "==0.2.0")
    merged = _patch(tmp_path, {**tree_files("0.2.5"), EXAMPLE: changed}, changed.replace("line 20\n", "patched\n"), "==0.2.5")
    fake_project.set_patches([("0001-example.patch", old)], {"0001-example": [("0.2.0.patch", same), ("0.2.5.patch", merged)]})
    found = {(r.rendition.rsplit("/", 1)[-1], r.neighbour.rsplit("/", 1)[-1]): (r.step, r.pins)
             for r in reproduced_renditions(fake_project.project)}
    assert found == {
        ("0001-example.patch", "0.2.0.patch"): ("exact", ["0.1.0"]),
        ("0.2.0.patch", "0001-example.patch"): ("exact", ["0.2.0"]),
        ("0.2.5.patch", "0.2.0.patch"): ("three-way", ["0.2.5"]),
        ("0.2.0.patch", "0.2.5.patch"): ("three-way", ["0.2.0"]),
    }
    # ``check`` prints them as notes, not problems: the exit status stays 0 and nothing is removed.
    before = sorted(p.name for p in (fake_project.root / "patches").rglob("*.patch"))
    assert cli.main(["--root", str(fake_project.root), "check", "--redundant-renditions", "--json"]) == 0
    captured = capsys.readouterr()
    document = json.loads(captured.out)
    assert document["problems"] == [] and len(document["redundant_renditions"]) == 4
    assert ("note: patches/renditions/0001-example/0.2.5.patch: patches/renditions/0001-example/0.2.0.patch gives the same"
            " tree by its three-way apply on 0.2.5") in captured.err
    assert sorted(p.name for p in (fake_project.root / "patches").rglob("*.patch")) == before
    # Without the flag, ``check`` reads no pristine tree and says nothing of it.
    assert cli.main(["--root", str(fake_project.root), "check", "--json"]) == 0
    assert "redundant_renditions" not in json.loads(capsys.readouterr().out)


def test_a_rendition_that_differs_from_what_its_neighbour_gives_is_not_noted(fake_project, tmp_path):
    old = _patch(tmp_path, tree_files("0.1.0"), _lines({20: "patched\n"}), "==0.1.0")
    other = _patch(tmp_path, tree_files("0.2.0"), _lines({20: "patched, another way\n"}), "==0.2.0")
    fake_project.set_patches([("0001-example.patch", old)], {"0001-example": [("0.2.0.patch", other)]})
    assert reproduced_renditions(fake_project.project) == []
