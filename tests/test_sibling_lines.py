"""``merge_tools.sibling_lines``: a proposal's added line that uses a name the release lacks is
written as another rendition of the patch writes it in that place, on real git trees."""

from __future__ import annotations

import subprocess
from pathlib import Path

from conftest import git
from sglpatch.rebase import merge_tools

HOOK = "python/sglang/srt/arg_groups/parallel_hook.py"
RELEASE = """def warn(view):
    reasons = []
    return reasons
"""
# The proposal (a newer release's rendition merged onto this one): its middle line calls a
# helper the newer release added.
PROPOSED = """def warn(view):
    reasons = []
    if not view.use_aiter:
        reasons.append("SGLANG_USE_AITER is not set")
    if attn_dp_enabled_of(view):
        reasons.append("DP attention is enabled")
    return reasons
"""
OLDER_RENDITION = f"""diff --git a/{HOOK} b/{HOOK}
--- a/{HOOK}
+++ b/{HOOK}
@@ -1,3 +1,7 @@
 def warn(view):
     reasons = []
+    if not view.use_aiter:
+        reasons.append("SGLANG_USE_AITER is not set")
+    if view.enable_dp_attention:
+        reasons.append("DP attention is enabled")
     return reasons
"""
FINDING = f"names: {HOOK}:5: undefined name 'attn_dp_enabled_of'"


def _repo_with(tmp_path: Path, release: str, proposed: str) -> tuple[Path, str, str]:
    repo = tmp_path / "repo"
    (repo / Path(HOOK).parent).mkdir(parents=True)
    git(tmp_path, "init", "-q", str(repo))
    trees = []
    for text in (release, proposed):
        (repo / HOOK).write_text(text)
        git(repo, "add", "-A")
        trees.append(git(repo, "write-tree").strip())
    return repo, trees[0], trees[1]


def test_a_line_using_a_missing_name_is_written_as_the_older_rendition_writes_it_there(tmp_path):
    repo, onto, proposal = _repo_with(tmp_path, RELEASE, PROPOSED)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    got = merge_tools.sibling_lines(repo, proposal, onto, [FINDING], [("0.5.20.patch", OLDER_RENDITION)], scratch)
    assert got.tree and got.changed == [HOOK]
    text = subprocess.run(["git", "cat-file", "blob", f"{got.tree}:{HOOK}"], cwd=repo, capture_output=True, check=True).stdout.decode()
    assert text == PROPOSED.replace("if attn_dp_enabled_of(view):", "if view.enable_dp_attention:")
    assert "'if attn_dp_enabled_of(view):' -> 'if view.enable_dp_attention:' (as 0.5.20.patch writes it)" in got.detail


def test_no_tree_where_the_other_renditions_use_the_missing_name_too_or_write_nothing_there(tmp_path):
    repo, onto, proposal = _repo_with(tmp_path, RELEASE, PROPOSED)
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    same_name = OLDER_RENDITION.replace("if view.enable_dp_attention:", "if attn_dp_enabled_of(view):")
    unrelated = OLDER_RENDITION.replace(HOOK, "python/sglang/srt/other.py")
    for siblings in ([("a.patch", same_name)], [("b.patch", unrelated)], []):
        got = merge_tools.sibling_lines(repo, proposal, onto, [FINDING], siblings, scratch)
        assert got.tree == "" and "no other rendition" in got.detail, siblings
    # A finding that names no line (an import check) proposes nothing either.
    got = merge_tools.sibling_lines(repo, proposal, onto, ["imports: x"], [("0.5.20.patch", OLDER_RENDITION)], scratch)
    assert got.tree == ""
