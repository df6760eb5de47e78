"""The clone's own pre-commit hooks, run by the real pre-commit (from the package index, never
GitHub) on a clone-like repository: the 0.5.23 release's files with sglang's real
``.pre-commit-config.yaml``, ``.isort.cfg`` and codespell table at its root (test fixtures, their
sources stated in tests/test_upstream_fixtures/). Every hook the config lists runs or is named;
clang-format reads the clone's own ``.clang-format``."""

from __future__ import annotations

from pathlib import Path

import pytest

from conftest import REAL_PINS, git
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources import pristine_tree
from sglpatch.upstream import upstream_hooks, upstream_precommit

pytestmark = pytest.mark.network
FIXTURES = Path(__file__).parent / "test_upstream_fixtures"
OVERRIDES = "python/sglang/srt/arg_groups/overrides.py"
KERNEL = "python/sglang/kernels/jit/csrc/new_kernel.cuh"
TEST = "test/registered/unit/server_args/test_new_default.py"
CLEAN_TEST = '''import unittest


class TestNewDefault(unittest.TestCase):
    def test_it(self):
        self.assertTrue(True)


if __name__ == "__main__":
    unittest.main()
'''


def _commit(repo: Path, message: str) -> str:
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-q", "-m", message)
    return git(repo, "rev-parse", "HEAD").strip()


@pytest.fixture(scope="module")
def clone(tmp_path_factory):
    """A clone whose main is 0.5.23's files plus sglang's pre-commit configuration."""
    pristine = pristine_tree.pristine_from_index(REAL_PINS.select(["0.5.23"])[0])
    repo = tmp_path_factory.mktemp("clone") / "sglang"
    git(repo.parent, "clone", "-q", str(pristine.repo), str(repo))
    git(repo, "checkout", "-q", "-b", "main", pristine.commit)
    (repo / ".pre-commit-config.yaml").write_text((FIXTURES / "sglang-pre-commit-config.yaml").read_text())
    (repo / ".isort.cfg").write_text((FIXTURES / "sglang-isort.cfg").read_text())
    (repo / "python/pyproject.toml").write_text((FIXTURES / "sglang-python-pyproject-codespell.toml").read_text())
    return repo, _commit(repo, "sglang's pre-commit configuration")


def _change(repo: Path, base: str, files: dict[str, str], edit: tuple[str, str] | None = None) -> str:
    git(repo, "checkout", "-q", "-B", "change", base)
    for path, text in files.items():
        (repo / path).parent.mkdir(parents=True, exist_ok=True)
        (repo / path).write_text(text)
    if edit:
        path = repo / OVERRIDES
        path.write_text(path.read_text().replace(edit[0], edit[1], 1))
    commit = _commit(repo, "a change")
    git(repo, "checkout", "-q", "main")
    return commit


def _hooks(repo: Path, base: str, commit: str):
    targets = upstream_hooks.changed_lines(repo, base, commit)
    return upstream_precommit.run_clone_hooks(repo, base, commit, "sglpatch-upstream/0009-change", targets)


def test_every_hook_of_the_clones_config_runs_on_a_clean_change_and_the_body_says_which(clone):
    repo, base = clone
    kernel = "#pragma once\n\ninline int* first(int* values) {\n  return values;\n}\n"
    commit = _change(repo, base, {TEST: CLEAN_TEST, KERNEL: kernel},
                     ("import logging\n", "import logging\n\n# The DSA KV cache default on gfx950.\n"))
    ran = _hooks(repo, base, commit)
    assert ran.findings == [] and ran.complete
    # The clone's clang-format style (Google, PointerAlignment: Left) accepts `int* values`;
    # LLVM's, used where no .clang-format is found, would move the star.
    assert ran.said.startswith("the repository's `.pre-commit-config.yaml`, every hook it lists, run with pre-commit "
                               "4.7.0 (`pre-commit run --files` on the 3 files this PR adds and changes): ")
    assert ("fmt, clippy could not be installed here and had no file of their kind (language rust: its toolchain is "
            "not on the package index)") in ran.said
    assert ran.console.startswith("clean (the clone's .pre-commit-config.yaml with pre-commit 4.7.0: ")


def test_the_clones_hooks_find_what_the_change_adds_and_only_that(clone):
    repo, base = clone
    kernel = "#pragma once\n\ninline int *first(int *values) { return values; }\n"
    commit = _change(repo, base, {TEST: CLEAN_TEST.replace("self.assertTrue(True)", "self.assertTrue( True )   # recieve"),
                                  KERNEL: kernel})
    ran = _hooks(repo, base, commit)
    found = {(f.tool, f.path, f.line) for f in ran.findings}
    assert ("black-jupyter", TEST, 6) in found
    assert any(f.tool == "codespell" and f.path == TEST and f.line == 6 and "recieve ==> receive" in f.what
               for f in ran.findings)
    assert any(f.tool == "clang-format" and f.path == KERNEL and f.line == 3 for f in ran.findings)
    assert all(f.path in (TEST, KERNEL) for f in ran.findings)


def test_a_hook_repository_that_cannot_be_had_is_named_and_the_box_stays_empty(clone):
    repo, base = clone
    git(repo, "checkout", "-q", "-B", "with-unknown", base)
    config = repo / ".pre-commit-config.yaml"
    config.write_text(config.read_text() + "  - repo: https://github.com/example/python-hooks\n    rev: v1.0\n"
                      "    hooks:\n      - id: lint-python\n        types: [python]\n")
    unknown_base = _commit(repo, "a hook repository nobody here knows")
    git(repo, "checkout", "-q", "main")
    commit = _change(repo, unknown_base, {TEST: CLEAN_TEST})
    ran = _hooks(repo, unknown_base, commit)
    assert ran.findings == [] and not ran.complete
    assert ("lint-python NOT RUN, could not be installed here (only its git repository defines its hooks, and it is "
            "out of reach here)") in ran.said
    assert ran.console.startswith("incomplete (") and "not run: lint-python" in ran.console


def test_a_config_pre_commit_cannot_read_is_refused_in_one_line_naming_it(clone):
    repo, base = clone
    git(repo, "checkout", "-q", "-B", "broken-config", base)
    (repo / ".pre-commit-config.yaml").write_text("repos:\n  - repo: https://github.com/psf/black\n    hooks: nope\n")
    broken = _commit(repo, "a config pre-commit refuses")
    git(repo, "checkout", "-q", "main")
    commit = _change(repo, broken, {TEST: CLEAN_TEST})
    with pytest.raises(SglpatchError) as refused:
        _hooks(repo, broken, commit)
    assert str(refused.value).startswith(".pre-commit-config.yaml: pre-commit cannot read it: ")
    assert "\n" not in str(refused.value)
