"""The README's recipes as a newcomer types them: the lines of "Your own fix, with its witness" and
"Send a fix upstream", read from README.md and run one by one in a shell, in a copy of the
project, with a home folder of the test's own (so `~/sglang` is a clone the test makes). Where a
recipe line is a comment saying what the user does by hand (edit, write the test), the test does
that and nothing more. The serve recipe is walked in tests/test_serve_recipe.py (from another
folder, on a detached HEAD and on a worktree); a new release, in tests/test_rebase.py (each pin
ported by a project that has never seen it)."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REAL_PINS, REPO_ROOT, git, skip_unless_required
from test_witness_upstream_test import NEW_TEST  # the same real fix's test: a duplicate in __all__
from sglpatch.apply.apply_pins import apply_series
from sglpatch.plumbing import cache
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import load_pins

pytestmark = pytest.mark.network
README = (REPO_ROOT / "README.md").read_text()
MESSAGE = """[CI] List each CI registration helper once in __all__

Problem: register_musa_ci is listed twice in sglang.test.ci.ci_register's
__all__.

Fix: list it once.

Testing: test/registered/unit/ci/test_ci_register_exports.py fails
before and passes after.

Origin: written while walking the README's recipe for a fix of your own
Witness: upstream-test
"""


def recipe(title: str) -> list[str]:
    """The indented lines of the README's recipe under ``**title**``, as written."""
    start = README.index(f"**{title}**")
    lines = []
    for line in README[start:].splitlines()[1:]:
        if line.startswith("    "):
            lines.append(line[4:])
        elif lines and line.strip():
            break
    assert lines, f"README has no recipe under {title!r}"
    return lines


def _shell_env(home: Path) -> dict[str, str]:
    """A user's shell: sglpatch on PATH, a home of the test's own with a git identity, an editor
    that writes the fix's message, and the real download cache (the user's own machine)."""
    home.mkdir(parents=True, exist_ok=True)
    (home / ".gitconfig").write_text("[user]\n\tname = Recipe User\n\temail = user@example.com\n")
    editor = home / "write-message"
    (home / "message").write_text(MESSAGE)
    editor.write_text(f"#!/bin/sh\ncp {shlex.quote(str(home / 'message'))} \"$1\"\n")
    editor.chmod(0o755)
    return {"PATH": f"{Path(sys.executable).parent}:/usr/local/bin:/usr/bin:/bin", "HOME": str(home),
            "GIT_EDITOR": str(editor), "SGLPATCH_CACHE_DIR": str(cache.cache_root()),
            "SGLPATCH_REQUIRE_WITNESSES": os.environ.get("SGLPATCH_REQUIRE_WITNESSES", ""), "LANG": "C.UTF-8"}


def _run(line: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(["bash", "-c", line], cwd=cwd, env=env, capture_output=True, text=True, timeout=1500)
    assert done.returncode == 0, f"{line}\n{done.stdout}\n{done.stderr}"
    return done.stdout


def _the_fix(tree: Path) -> None:
    """What the user edits: 0.5.23's ci_register lists register_musa_ci twice in __all__."""
    path = tree / "python/sglang/test/ci/ci_register.py"
    text = path.read_text()
    entry = '    "register_musa_ci",\n'
    second = text.index(entry, text.index(entry) + 1)
    path.write_text(text[:second] + text[second + len(entry):])


def _clone_with_history(home: Path) -> str:
    """~/sglang: the 0.5.23 release's files tagged v0.5.23, then a later upstream commit on main."""
    pin = load_pins(REPO_ROOT / "upstream" / "pins.toml").select(["0.5.23"])[0]
    pristine = pristine_tree.pristine_from_index(pin)
    repo = home / "sglang"
    git(home, "clone", "-q", str(pristine.repo), str(repo))
    git(repo, "checkout", "-q", "-b", "main", pristine.commit)
    git(repo, "tag", "v0.5.23")
    path = repo / "python/sglang/srt/models/glm4_moe.py"
    path.write_text(path.read_text().replace("import copy\n", "import copy  # later upstream work\n", 1))
    git(repo, "-c", "user.name=Upstream Dev", "-c", "user.email=dev@example.com", "commit", "-q", "-am", "Later upstream work")
    return git(repo, "rev-parse", "main").strip()


def _every_pin_still_applies(project, new_stem: str) -> None:
    """After the recipe, `nox -s apply` (every pin, as CI's users run it) passes with no other
    step: the new fix is locked on 0.5.23, where it applies, and on the seventeen other pins it is
    not applicable and needs no entry. Driven through the library the session calls, by text alone
    (--no-witnesses): the lock is what this proves, and the witnesses ran on 0.5.23 above."""
    lock = project.lock_file.read_text()
    report = apply_series(project, run_witnesses=False, jobs=2)
    failed = [f"{r.version}: {r.error}" for r in report.results if not r.ok]
    assert failed == [] and len(report.results) == len(REAL_PINS.pins), failed
    for result in report.results:
        new = next(o for o in result.patches if o.name == f"{new_stem}.patch")
        assert result.lock == "matches" and new.status == ("applied" if result.version == "0.5.23" else "not-applicable")
    assert project.lock_file.read_text() == lock


def test_your_own_fix_then_send_a_fix_upstream_as_the_readme_writes_them(project_copy, tmp_path):
    root, home = project_copy.root, tmp_path / "home"
    env = _shell_env(home)
    new_stem = None
    for line in recipe("Your own fix, with its witness."):
        if line.startswith("#"):
            # "its test: patches/tests/<the new patch>/test/registered/unit/...": the user writes it.
            assert "patches/tests/" in line and "test/registered/unit/" in line
            target = root / "patches" / "tests" / new_stem / "test/registered/unit/ci/test_ci_register_exports.py"
            target.parent.mkdir(parents=True)
            target.write_text(NEW_TEST)
            continue
        if " commit -a" in line:
            _the_fix(root / "build" / "trees" / "0.5.23")
        said = _run(line, root, env)
        if line.startswith("sglpatch patch refresh"):
            new = [name for name in (root / "patches" / "series").read_text().split() if name.startswith("0004-")]
            assert len(new) == 1 and len((root / "patches" / "series").read_text().split(".patch")) == 5, said
            new_stem = new[0].removesuffix(".patch")
        if line.startswith("sglpatch apply"):
            applied = said
    locked = json.loads((root / "series.lock").read_text())["pins"]["0.5.23"]
    entry = next(p for p in locked["patches"] if p["name"] == f"{new_stem}.patch")
    if "unavailable" in entry["witness"]["pristine"]:
        skip_unless_required(f"the new fix's test could not run here: {entry['witness']}")
    assert entry["witness"] == {"pristine": "bug [unittest gfx950]", "patched": "clean [unittest gfx950]"}, applied
    assert entry["status"] == "applied" and entry["commit"] == locked["commit"]
    _every_pin_still_applies(project_copy, new_stem)

    later = _clone_with_history(home)
    [line] = recipe("Send a fix upstream.")
    said = _run(line, root, env)
    stem = "0002-quark-keep-mtp-draft-excluded-modules-unquantized"
    branch = f"sglpatch-upstream/{stem}"
    assert git(home / "sglang", "rev-parse", f"{branch}^").strip() == later, said
    added = git(home / "sglang", "diff", "--name-status", later, branch).split("\n")
    assert "A\ttest/registered/unit/models/test_glm4_moe_nextn_quark_exclude.py" in added
    assert "pre-commit hooks: clean" in said
    body = (root / "build" / "upstream" / stem / "PR.md").read_text()
    for section in ("## Motivation", "## Modifications", "## Accuracy Tests", "## Checklist"):
        assert section in body
    assert not re.search(r"\b(witness|rendition|stand-in)\b", body, re.IGNORECASE)
