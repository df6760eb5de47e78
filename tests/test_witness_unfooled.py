"""The upstream-test witness against the tests people really write (issue 35): a new 0004 made on
0.5.23 as the README's own-fix recipe says (``patch start``, the fix committed, ``patch refresh``),
each time with another test beside it, then ``sglpatch check`` and ``sglpatch apply 0.5.23
--update-lock`` as the recipe runs them. The real fix's real test goes bug -> clean, locked and
exported (tests/test_readme_recipes.py walks that recipe to the end, and
tests/test_witness_upstream_test.py's test_a_new_fix_with_only_a_test_is_witnessed_locked_and_exported
exports it); here, every weaker test ends as it must: never clean on a skip or an expected failure,
never not-needed or "fixed upstream" on the release the fix was written for, never bug -> clean
from the test's own edits, refused for reading source, unavailable (not flaky) without the network.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from conftest import REPO_ROOT, skip_unless_required
from test_readme_recipes import _shell_env, _the_fix, recipe
from test_witness_upstream_test import NEW_TEST, NEW_TEST_PATH

pytestmark = pytest.mark.network
STEPS = recipe("Your own fix, with its witness.")
ASSERTION = "        self.assertEqual(len(names), len(set(names)), sorted(names))\n"
assert ASSERTION in NEW_TEST


def _variant(body: str, header: str = "") -> str:
    return NEW_TEST.replace("import unittest\n", "import unittest\n" + header, 1).replace(ASSERTION, body)


VARIANTS = {
    # A test that never fails: on the very release the fix was written for, it is refused.
    "never-fails": (_variant("        self.assertTrue(True)\n"), 1, 1,
                    ["its test does not find the bug on 0.5.23, the release the fix was written for", "witness-refused"],
                    ["not-needed", "fixed upstream", "suggest for", "Upstream-Status"]),
    # A test that skips where the bug is: no verdict, never clean.
    "skips": (_variant("        if len(names) != len(set(names)):\n            self.skipTest('a name is listed twice')\n"
                       + ASSERTION), 4, 4, ["every test skipped", "witness-unavailable"], ["not-needed", "clean [unittest"]),
    # An expected failure whose assertion fails is no pass.
    "expected-failure": (_variant(ASSERTION).replace("    def test_all_names", "    @unittest.expectedFailure\n    def test_all_names"),
                         4, 4, ["expected failure (judges nothing)", "witness-unavailable"], ["1 passed", "not-needed"]),
    # A test that edits a file no patch touches, failing the first time: never bug -> clean.
    "edits-the-tree": (_variant("        readme = Path(sglang.__file__).with_name('README.md')\n"
                                "        if readme.stat().st_size != len('edited by the test\\n'):\n"
                                "            readme.write_text('edited by the test\\n')\n"
                                "            self.fail('the first run edits a file no patch touches')\n",
                                "from pathlib import Path\n\nimport sglang\n"),
                       4, 4, ["the tests changed the tree they judge (python/sglang/README.md)"],
                       ["bug [unittest gfx950] -> clean"]),
    # A test of the file's wording, not the code's behaviour: refused before anything runs.
    "reads-source": (_variant("        self.assertEqual(open(ci_register.__file__).read().count('\"register_musa_ci\"'), 1)\n"),
                     1, 1, ["reads source text (open on sglang's file"], ["bug [unittest"]),
    # A test that needs the network cannot tell here, the same way every time.
    "needs-the-network": (_variant("        import urllib.request\n\n"
                                   "        urllib.request.urlopen('https://example.org/', timeout=10).read()\n"
                                   + ASSERTION), 4, 4, ["no network in a regression test's run"], ["not-needed"]),
}


def _lines_of(said: str, stem: str) -> str:
    """The new patch's row of apply's table and the lines under it."""
    lines = said.splitlines()
    start = next(n for n, line in enumerate(lines) if line.startswith(f"  {stem}"))
    end = next((n for n in range(start + 1, len(lines)) if not lines[n].startswith("      ")), len(lines))
    return "\n".join(lines[start:end])


def _shell(line: str, cwd: Path, env: dict[str, str]) -> tuple[int, str]:
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    return done.returncode, done.stdout + done.stderr


@pytest.fixture(scope="module")
def refreshed(tmp_path_factory):
    """The project after the recipe's first three lines: 0.5.23's tree with the fix committed and
    refreshed into patches/0004-...patch (Applies-To ==0.5.23, Witness: upstream-test), no test yet."""
    work = tmp_path_factory.mktemp("recipe")
    root = work / "project"
    for part in ("upstream", "patches"):
        shutil.copytree(REPO_ROOT / part, root / part)
    shutil.copy(REPO_ROOT / "series.lock", root / "series.lock")
    env = _shell_env(work / "home")
    for line in STEPS:
        if line.startswith("#") or line.startswith("sglpatch check"):
            break
        if " commit -a" in line:
            _the_fix(root / "build" / "trees" / "0.5.23")
        code, said = _shell(line, root, env)
        assert code == 0, f"{line}\n{said}"
    [stem] = [name.removesuffix(".patch") for name in (root / "patches" / "series").read_text().split()
              if name.startswith("0004-")]
    assert "Applies-To: ==0.5.23" in (root / "patches" / f"{stem}.patch").read_text()
    return root, stem, env


@pytest.mark.parametrize("variant", sorted(VARIANTS))
def test_a_weak_test_beside_a_new_fix_never_passes_for_a_witness(refreshed, tmp_path, variant):
    made, stem, env = refreshed
    test, check_exit, apply_exit, words, never = VARIANTS[variant]
    root = tmp_path / "project"
    for part in ("upstream", "patches"):
        shutil.copytree(made / part, root / part)
    shutil.copy(made / "series.lock", root / "series.lock")
    target = root / "patches" / "tests" / stem / NEW_TEST_PATH
    target.parent.mkdir(parents=True)
    target.write_text(test)
    lock = (root / "series.lock").read_bytes()
    [check] = [line for line in STEPS if line.startswith("sglpatch check")]
    [apply] = [line for line in STEPS if line.startswith("sglpatch apply")]
    checked, said_check = _shell(check, root, env)
    applied, said_apply = _shell(apply, root, env)
    print(f"$ {check}\n{said_check}\n$ {apply}\n{said_apply}")
    if "CPU environment" in said_apply and "unavailable" in said_apply:
        skip_unless_required(f"the CPU environment could not be had here: {said_apply[-600:]}")
    assert (checked, applied) == (check_exit, apply_exit), said_check + said_apply
    for word in words:
        assert word in said_check + said_apply
    assert (root / "series.lock").read_bytes() == lock  # the lock untouched
    assert "suggest for" not in said_apply
    if variant == "reads-source":
        [line] = [n for n, text in enumerate(test.splitlines(), 1) if "open(ci_register.__file__)" in text]
        assert f"{target}:{line}: reads source text" in said_check and f"{target}:{line}: reads source text" in said_apply
        return
    row = _lines_of(said_apply, stem)
    for word in never:
        assert word not in row, row
