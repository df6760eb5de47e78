"""The watch where a patch needs a hand port: an issue (with gh) names the patch, why the judge
refused every candidate and where the prepared tree is; a port made by a merge tool is marked for review."""

from __future__ import annotations

import os

from test_watch import _calls, _lines, _release, example_witness, fake_gh, watched  # noqa: F401 - fixtures

from conftest import git
from sglpatch import cli


def test_a_release_that_needs_a_hand_port_opens_an_issue_saying_which_patch_and_where(watched, tmp_path, monkeypatch):  # noqa: F811
    _release(watched.index, "0.3.0", _lines({20: "upstream rewrote line 20\n"}))
    gh = fake_gh(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{gh}{os.pathsep}{os.environ['PATH']}")
    assert cli.main(["--root", str(watched.root), "watch", "--open-pr"]) == 1
    (call,) = _calls(gh)
    args = call["args"]
    assert args[:2] == ["issue", "create"]
    assert args[args.index("--title") + 1] == "sglang 0.3.0: 0001-example.patch needs a hand port"
    body = call["body"]
    assert "**Needs a hand port:** `0001-example.patch`" in body
    assert "`build/port/0.3.0`" in body and "sglpatch patch refresh 0.3.0" in body
    assert (watched.root / "build" / "port" / "0.3.0" / "python").is_dir()


def test_a_pull_request_marks_a_rendition_a_merge_tool_made_for_review(watched, tmp_path, monkeypatch):  # noqa: F811
    from test_watch import _git_project

    remote = _git_project(watched.root, tmp_path)
    # The release changed the line just above the patched one: git's merges conflict there (a
    # three-way apply would carry the main file over, no new file), wiggle merges it.
    _release(watched.index, "0.3.0", _lines({19: "upstream changed line 19\n"}))
    gh = fake_gh(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{gh}{os.pathsep}{os.environ['PATH']}")
    assert cli.main(["--root", str(watched.root), "watch", "--open-pr"]) == 0
    (call,) = _calls(gh)
    assert call["args"][:2] == ["pr", "create"]
    assert "judge: accepted (names, witness, imports)" in call["body"]
    # 0.3.0 is newer than every pin, so the new rendition is the main file; the old text moved aside.
    assert "**Made by a merge tool, review before merging:** `patches/0001-example.patch` (wiggle)" in call["body"]
    files = git(remote, "diff", "--name-only", "main", "sglpatch-watch/sglang-0.3.0").split()
    assert sorted(files) == ["patches/0001-example.patch", "patches/renditions/0001-example/0.2.0.patch", "series.lock",
                             "upstream/pins.toml"]
