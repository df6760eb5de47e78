"""The real patches leave as pull requests on a clone of 0.5.23 with a later upstream commit on
the files they edit: 0002 as one, 0003 as its two, each on the clone's later commit with its own
regression test under test/registered/unit/, sglang's pre-commit hooks clean and a body in
upstream's template that shows that test failing without the change and passing with it."""

from __future__ import annotations

import re

import pytest

from conftest import REAL_PINS, REPO_ROOT, git
from sglpatch.plumbing.project import Project
from sglpatch.sources import pristine_tree
from sglpatch.upstream import upstream_pr

pytestmark = pytest.mark.network
GLM = "python/sglang/srt/models/glm4_moe.py"
OVERRIDES = "python/sglang/srt/arg_groups/overrides.py"
UNIT = "test/registered/unit"
P0002 = "0002-quark-keep-mtp-draft-excluded-modules-unquantized"
P0003 = "0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default"


def _clone_with_history(tmp_path):
    """A clone whose main is the 0.5.23 release's files (tagged v0.5.23) plus one later commit
    that edits a file 0002 edits and one 0003 edits, far from the patches' hunks."""
    pristine = pristine_tree.pristine_from_index(REAL_PINS.select(["0.5.23"])[0])
    repo = tmp_path / "sglang"
    git(tmp_path, "clone", "-q", str(pristine.repo), str(repo))
    git(repo, "checkout", "-q", "-b", "main", pristine.commit)
    git(repo, "tag", "v0.5.23")
    path = repo / GLM
    text = path.read_text()
    path.write_text(text.replace("import copy\n", "import copy  # later upstream work\n", 1))
    path = repo / OVERRIDES
    path.write_text(path.read_text().replace("override dispatch.", "override dispatch (later upstream work).", 1))
    git(repo, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-q", "-am", "Later upstream work")
    return repo, git(repo, "rev-parse", "main").strip()


def _shows_its_own_test(result, test: str, others: tuple[str, ...] = ()):
    """The pull request adds ``test`` and its body shows that test's command, failing without the
    change and passing with it, in upstream's template and words."""
    assert result.tests == (test,) and git(result.repo, "cat-file", "-e", f"{result.commit}:{test}") == ""
    body = result.body.read_text()
    assert re.findall(r"(?m)^## .*", body) == ["## Motivation", "## Modifications", "## Accuracy Tests",
                                               "## Speed Tests and Profiling", "## Checklist"]
    name = test.rsplit("/", 1)[1]
    assert f"```bash\npython3 {test}\n```" in body
    assert re.search(rf"Without the change it fails:\n\n```\n\d+ failed assertion\(s\) in \d+ tests \({re.escape(name)} ", body)
    assert re.search(rf"With the change it passes:\n\n```\n\d+ passed \({re.escape(name)} \d+ run\)", body)
    assert "[doubles" not in body and all(other.rsplit("/", 1)[1] not in body for other in others)
    assert "Not measured on MI355X" in body and max(len(line) for line in body.splitlines()) <= 140
    assert result.hooks.startswith("clean")
    return body


def test_0002_rebases_onto_a_clones_later_commit_as_a_quark_pr_with_its_test_and_clean_hooks(tmp_path):
    repo, later = _clone_with_history(tmp_path)
    [result] = upstream_pr.export(Project(REPO_ROOT), "0002", base="main", base_repo=repo, out=tmp_path / "out")
    assert git(repo, "rev-parse", f"{result.commit}^").strip() == later
    assert git(repo, "merge-base", "--is-ancestor", "v0.5.23", result.commit) == ""
    text = git(repo, "show", f"{result.commit}:{GLM}")
    assert "import copy  # later upstream work" in text and "_map_mtp_ckpt_pattern" in text
    assert result.title.startswith("[Quark] ")
    test = f"{UNIT}/models/test_glm4_moe_nextn_quark_exclude.py"
    assert git(repo, "diff", "--name-only", later, result.commit).split() == [GLM, test]
    _shows_its_own_test(result, test)


def test_0003_leaves_as_two_prs_on_the_clone_each_with_its_own_test_the_default_naming_its_bench(tmp_path):
    repo, later = _clone_with_history(tmp_path)
    kv, warning = upstream_pr.export(Project(REPO_ROOT), "0003", base="main", base_repo=repo, out=tmp_path / "out")
    assert (kv.part, warning.part) == ("fp8-kv-default", "inert-fusion-warning")
    assert kv.title == "[AMD] Default GLM-5 DSA models to an fp8 KV cache on gfx950"
    assert warning.title == "[AMD] Enable GLM-5's aiter all-reduce fusion only where it runs; warn when the flag cannot"
    kv_test = f"{UNIT}/server_args/test_glm5_gfx950_kv_cache_dtype.py"
    warning_test = f"{UNIT}/server_args/test_aiter_allreduce_fusion_inert_warning.py"
    for result, path, test, other in ((kv, "overrides.py", kv_test, warning_test),
                                      (warning, "model_hook.py", warning_test, kv_test)):
        assert git(repo, "rev-parse", f"{result.commit}^").strip() == later
        changed = git(repo, "diff", "--name-only", later, result.commit).split()
        assert changed == [f"python/sglang/srt/arg_groups/{path}", test]
        _shows_its_own_test(result, test, (other,))
    assert "(later upstream work)" in git(repo, "show", f"{kv.commit}:{OVERRIDES}")
    assert "python -m sglang.benchmark.serving" in kv.body.read_text()
    assert "benchmark.serving" not in warning.body.read_text()
