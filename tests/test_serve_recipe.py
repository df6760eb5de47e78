"""The serve recipe as a user walks it (docs/serving.md): `sglpatch apply --into CHECKOUT`, typed
in another folder than the sglpatch clone, on a checkout of a real release that stands as an
image's does (a detached HEAD at the release's tag), and on a linked worktree of one."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO_ROOT, git, pristine_subtree, shipped_trees

pytestmark = pytest.mark.network

VERSION = "0.5.10"  # the smallest release: the recipe is the same for every pin


def _sglpatch() -> list[str]:
    """The ``sglpatch`` command the install put beside this Python (else the module)."""
    script = Path(sys.executable).parent / "sglpatch"
    return [str(script)] if script.is_file() else [sys.executable, "-m", "sglpatch"]


def _serve(checkout: Path, cwd: Path) -> subprocess.CompletedProcess:
    cwd.mkdir(parents=True, exist_ok=True)
    return subprocess.run([*_sglpatch(), "-q", "apply", "--into", str(checkout)], capture_output=True, text=True,
                          cwd=cwd, timeout=600)


def _image_checkout(dest: Path, version: str = VERSION) -> Path:
    """sglang's checkout as in the released image: the release's files, one commit, its tag."""
    pristine_subtree(version, dest)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "config", "user.name", "Rocm User")
    git(dest, "config", "user.email", "user@example.com")
    git(dest, "add", "-A")
    git(dest, "commit", "-q", "-m", f"sglang {version}")
    git(dest, "tag", f"v{version}")
    return dest


def _locked():
    entry = json.loads((REPO_ROOT / "series.lock").read_text())["pins"][VERSION]
    applied = [p for p in entry["patches"] if p["commit"]]
    result = shipped_trees(VERSION)
    assert result.commit == entry["commit"]
    return applied, git(Path(result.tree_path), "rev-parse", f"{result.commit}:python/sglang").strip()


def _holds_the_locked_series(checkout: Path, applied) -> None:
    count, package = len(applied), _locked()[1]
    assert git(checkout, "rev-parse", "HEAD:python/sglang").strip() == package
    assert git(checkout, "rev-list", "--count", f"v{VERSION}..HEAD").strip() == str(count)
    assert git(checkout, "status", "--porcelain").strip() == ""


def test_the_serve_recipe_from_another_folder_on_a_detached_head_checkout(tmp_path):
    checkout = _image_checkout(tmp_path / "sgl-workspace" / "sglang")
    git(checkout, "switch", "-q", "--detach", f"v{VERSION}")
    applied, _ = _locked()
    done = _serve(checkout, tmp_path / "home")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"{checkout}: {len(applied)} commits added on a detached HEAD")
    assert "detached HEAD: the commits are on no branch; `git switch -c NAME` keeps them" in done.stdout
    assert f"undo:  git -C {checkout} reset --keep " in done.stdout and "restart the sglang server" in done.stdout
    assert max(len(line) for line in done.stdout.splitlines() if str(checkout) not in line) <= 100
    _holds_the_locked_series(checkout, applied)
    again = _serve(checkout, tmp_path / "home")
    assert again.returncode == 0 and again.stdout.startswith(f"already applied: the series for sglang {VERSION} as locked")
    _holds_the_locked_series(checkout, applied)


def test_the_serve_recipe_from_another_folder_on_a_linked_worktree(tmp_path):
    checkout = _image_checkout(tmp_path / "sglang")
    worktree = tmp_path / "sglang-serving"
    git(checkout, "worktree", "add", "-q", "-b", "serving", str(worktree), f"v{VERSION}")
    applied, _ = _locked()
    done = _serve(worktree, tmp_path / "home")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"{worktree}: {len(applied)} commits added on branch serving")
    _holds_the_locked_series(worktree, applied)
    assert git(checkout, "rev-parse", "main").strip() == git(checkout, "rev-parse", f"v{VERSION}").strip()


def test_the_serve_recipe_names_every_fix_even_one_the_release_needs_no_commit_for(tmp_path):
    # README promises three fixes; on 0.5.23 the ROCm guard is upstream's own (0001 not needed),
    # so two commits are added, and the output still says what became of all three.
    checkout = _image_checkout(tmp_path / "sglang", "0.5.23")
    done = _serve(checkout, tmp_path / "home")
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.startswith(f"{checkout}: 2 commits added on branch main")
    assert "  patches: 0001 not needed: fixed in this release; 0002 applied; 0003 applied\n" in done.stdout, done.stdout
