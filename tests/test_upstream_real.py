"""The real patches leave as pull requests on a clone of 0.5.23 with a later upstream commit on
the files they edit and sglang's own pre-commit configuration at its root (test fixtures, sources
stated in tests/test_upstream_fixtures/): 0002 as one, 0003 as its two, each on the clone's later
commit with its own regression test under test/registered/unit/, the clone's hooks run by the
real pre-commit, and a body in upstream's template that shows the test's command, what that
command printed without and with the change (run in the release's own torch and torchvision:
unittest's report), the in-process run it was judged by, and the upstream work it relates to."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from conftest import REAL_PINS, REPO_ROOT, git
from sglpatch.plumbing.project import Project
from sglpatch.sources import pristine_tree
from sglpatch.upstream import upstream_pr

pytestmark = pytest.mark.network
FIXTURES = Path(__file__).parent / "test_upstream_fixtures"
GLM = "python/sglang/srt/models/glm4_moe.py"
OVERRIDES = "python/sglang/srt/arg_groups/overrides.py"
UNIT = "test/registered/unit"
SECTIONS = ["## Motivation", "## Modifications", "## Related upstream work", "## Accuracy Tests",
            "## Speed Tests and Profiling", "## Checklist"]


def _clone_with_history(tmp_path):
    """A clone whose main is the 0.5.23 release's files (tagged v0.5.23), sglang's pre-commit
    configuration, then one later commit that edits a file 0002 edits and one 0003 edits, far
    from the patches' hunks."""
    pristine = pristine_tree.pristine_from_index(REAL_PINS.select(["0.5.23"])[0])
    repo = tmp_path / "sglang"
    git(tmp_path, "clone", "-q", str(pristine.repo), str(repo))
    git(repo, "checkout", "-q", "-b", "main", pristine.commit)
    git(repo, "tag", "v0.5.23")
    (repo / ".pre-commit-config.yaml").write_text((FIXTURES / "sglang-pre-commit-config.yaml").read_text())
    (repo / ".isort.cfg").write_text((FIXTURES / "sglang-isort.cfg").read_text())
    (repo / "python/pyproject.toml").write_text((FIXTURES / "sglang-python-pyproject-codespell.toml").read_text())
    path = repo / GLM
    path.write_text(path.read_text().replace("import copy\n", "import copy  # later upstream work\n", 1))
    path = repo / OVERRIDES
    path.write_text(path.read_text().replace("override dispatch.", "override dispatch (later upstream work).", 1))
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-q", "-m", "Later upstream work")
    return repo, git(repo, "rev-parse", "main").strip()


def _shows_its_own_test(result, test: str, others: tuple[str, ...] = ()):
    """The pull request adds ``test``; its body shows that test's command, what the command
    printed without and with the change, and the in-process run (failing, then passing) as a
    line of its own, in upstream's template and words; the clone's hooks all ran."""
    assert result.tests == (test,) and git(result.repo, "cat-file", "-e", f"{result.commit}:{test}") == ""
    body = result.body.read_text()
    assert re.findall(r"(?m)^## .*", body) == SECTIONS
    related = body.split("## Related upstream work\n")[1].split("\n## ")[0]
    assert re.search(r"#\d{5}\b", related) and "github.com/sgl-project" not in related
    name = test.rsplit("/", 1)[1]
    assert f"```bash\npython3 {test}\n```" in body
    flat = " ".join(body.split())
    assert "Run as shown from the repository root on a CPU-only machine (Python 3." in flat
    assert re.search(r"\((trimmed: the last \d+ of its \d+ lines|all \d+ lines|its one line|excerpt of its \d+ lines: [^)]*)\)", flat)
    # The command itself ran the tests, in the release's own torch and torchvision: unittest's
    # report says they failed without the change and passed with it.
    assert re.search(r"without the change it printed .*?``` .*?Ran \d+ tests in [\d.]+s FAILED \((errors|failures)=\d+\) ```", flat)
    assert re.search(r"With the change it printed .*?``` .*?Ran \d+ tests in [\d.]+s OK ```", flat)
    assert re.search(r"torch 2\.14\.1 and torchvision 0\.\d+\.\d+ as the release requires them", flat)
    replayed = r"(?: \(replayed: [^)]*\))?"  # a second run's kept answers say so
    assert re.search(rf"without the change{replayed}: fails: \d+ failed assertion\(s\) in \d+ tests \({re.escape(name)} ",
                     flat)
    assert re.search(rf"with the change{replayed}: passes: \d+ passed \({re.escape(name)} \d+ run\)", flat)
    assert "[doubles" not in body and all(other.rsplit("/", 1)[1] not in body for other in others)
    assert "Not measured on MI355X" in body and max(len(line) for line in body.splitlines()) <= 200
    assert result.hooks.startswith("clean (the clone's .pre-commit-config.yaml with pre-commit 4.7.0: ")
    assert "- [x] Format your code according to pre-commit (the repository's `.pre-commit-config.yaml`, every hook" in flat
    return body


def test_0002_rebases_onto_a_clones_later_commit_as_a_quark_pr_with_its_test_and_the_clones_hooks(tmp_path):
    repo, later = _clone_with_history(tmp_path)
    [result] = upstream_pr.export(Project(REPO_ROOT), "0002", base="main", base_repo=repo, out=tmp_path / "out")
    assert git(repo, "rev-parse", f"{result.commit}^").strip() == later
    assert git(repo, "merge-base", "--is-ancestor", "v0.5.23", result.commit) == ""
    assert "import copy  # later upstream work" in git(repo, "show", f"{result.commit}:{GLM}")
    assert result.title.startswith("[Quark] ")
    test = f"{UNIT}/models/test_glm4_moe_nextn_quark_exclude.py"
    assert list(result.tests) == [test]
    assert git(repo, "diff", "--name-only", later, result.commit).split() == [GLM, test]
    _shows_its_own_test(result, test)


def test_0003_leaves_as_two_prs_on_the_clone_each_with_its_own_test_and_branch(tmp_path):
    repo, later = _clone_with_history(tmp_path)
    kv, warning = upstream_pr.export(Project(REPO_ROOT), "0003", base="main", base_repo=repo, out=tmp_path / "out")
    assert (kv.part, warning.part) == ("fp8-kv-default", "inert-fusion-warning")
    assert (kv.branch, warning.branch) == ("sglpatch-upstream/0003-fp8-kv-default", "sglpatch-upstream/0003-inert-fusion-warning")
    assert kv.title == "[AMD] Default GLM-5 DSA models to an fp8 KV cache on gfx950"
    assert warning.title == "[AMD] Enable GLM-5's aiter all-reduce fusion only where it runs; warn when the flag cannot"
    for result, path, other in ((kv, "overrides.py", warning), (warning, "model_hook.py", kv)):
        assert git(repo, "rev-parse", f"{result.commit}^").strip() == later
        changed = git(repo, "diff", "--name-only", later, result.commit).split()
        [test] = result.tests
        assert changed == [f"python/sglang/srt/arg_groups/{path}", test]
        _shows_its_own_test(result, test, other.tests)
    assert "(later upstream work)" in git(repo, "show", f"{kv.commit}:{OVERRIDES}")
    assert "python -m sglang.benchmark.serving" in kv.body.read_text()
