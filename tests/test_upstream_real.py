"""The real patches leave as pull requests: 0002 rebased onto a clone of 0.5.23 with a later
upstream commit on the file it edits, 0003 as its two pull requests on the 0.5.23 pin, each with
sglang's pre-commit hooks clean and a body in upstream's template."""

from __future__ import annotations

import re

import pytest

from conftest import REAL_PINS, REPO_ROOT, git
from sglpatch import sources, upstream_pr
from sglpatch.project import Project

pytestmark = pytest.mark.network
GLM = "python/sglang/srt/models/glm4_moe.py"
P0002 = "0002-quark-keep-mtp-draft-excluded-modules-unquantized"
P0003 = "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default"


def _clone_with_history(tmp_path):
    """A clone whose main is the 0.5.23 release's files (tagged v0.5.23) plus one later commit
    that edits the file 0002 edits, far from the patch's hunks."""
    pristine = sources.pristine_from_index(REAL_PINS.select(["0.5.23"])[0])
    repo = tmp_path / "sglang"
    git(tmp_path, "clone", "-q", str(pristine.repo), str(repo))
    git(repo, "checkout", "-q", "-b", "main", pristine.commit)
    git(repo, "tag", "v0.5.23")
    path = repo / GLM
    text = path.read_text()
    path.write_text(text.replace("import copy\n", "import copy  # later upstream work\n", 1))
    git(repo, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-q", "-am", "Later upstream work on glm4_moe.py")
    return repo, git(repo, "rev-parse", "main").strip()


def test_0002_rebases_onto_a_clones_later_commit_as_a_quark_pr_with_clean_hooks(tmp_path):
    repo, later = _clone_with_history(tmp_path)
    [result] = upstream_pr.export(Project(REPO_ROOT), P0002, base="main", base_repo=repo, out=tmp_path / "out")
    assert git(repo, "rev-parse", f"{result.commit}^").strip() == later
    text = git(repo, "show", f"{result.commit}:{GLM}")
    assert "import copy  # later upstream work" in text and "_map_mtp_ckpt_pattern" in text
    assert result.title.startswith("[Quark] ") and result.hooks.startswith("clean")
    body = result.body.read_text()
    assert re.findall(r"(?m)^## .*", body) == ["## Motivation", "## Modifications", "## Accuracy Tests",
                                               "## Speed Tests and Profiling", "## Checklist"]
    assert "Without the change it fails:" in body and "With the change it passes:" in body
    assert "Not measured on MI355X" in body and max(len(line) for line in body.splitlines()) <= 140


def test_0003_leaves_as_two_prs_the_default_naming_its_bench(tmp_path):
    kv, warning = upstream_pr.export(Project(REPO_ROOT), P0003, base="0.5.23", out=tmp_path / "out")
    assert (kv.part, warning.part) == ("fp8-kv-default", "inert-fusion-warning")
    assert kv.title == "[AMD] Default GLM-5 DSA models to an fp8 KV cache on gfx950"
    assert warning.title == "[AMD] Warn when --enable-aiter-allreduce-fusion cannot engage"
    for result, path in ((kv, "overrides.py"), (warning, "parallel_hook.py")):
        changed = git(result.repo, "diff", "--name-only", result.base_commit, result.commit).split()
        assert changed == [f"python/sglang/srt/arg_groups/{path}"] and result.hooks.startswith("clean")
    assert "python -m sglang.benchmark.serving" in kv.body.read_text()
    assert "benchmark.serving" not in warning.body.read_text()
