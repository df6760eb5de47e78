"""``sglpatch apply --into CHECKOUT``: the pin's series applied to an sglang checkout of the user's.

Users serve from the released ROCm image, whose sglang is a git checkout at
``/sgl-workspace/sglang``, or work in their own clone. The checkout's sglang version picks the pin
(setuptools-scm's ``python/sglang/_version.py``, else an exact ``v<version>`` tag, else the
egg-info of an editable install; ``--pin`` to say it). Before anything changes, every file the
pin's applied series touches must be byte for byte the pin's pristine file there; otherwise the
run is refused naming the file. The result is exactly the pin's patched tree for those files,
taken from the commits ``sglpatch apply`` made (build/trees/<pin>):

- in a git checkout, one commit per patch on the current branch (the patch's author and message,
  the user as committer), the work tree moved by git itself, which refuses to overwrite local
  changes;
- in a plain folder, the files are rewritten in place, each atomically, after all are computed.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch import cache, diffs
from sglpatch.errors import SglpatchError
from sglpatch.gitcmd import IDENTITY_EMAIL, IDENTITY_NAME, git_out, run_git
from sglpatch.processes import run_tool

USER_GIT_TIMEOUT_S = 300
_SCM_VERSION = re.compile(r"""^(?:__version__\s*=\s*)?version\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


@dataclass
class IntoResult:
    checkout: Path
    version: str
    how: str  # "git commits" or "files rewritten"
    commits: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)


def checkout_version(checkout: Path) -> tuple[str | None, str]:
    """(the checkout's sglang version or None, how it was found)."""
    scm = checkout / "python" / "sglang" / "_version.py"
    if scm.is_file():
        match = _SCM_VERSION.search(scm.read_text(errors="replace"))
        if match:
            return match.group(1), str(scm.relative_to(checkout))
    if (checkout / ".git").exists():
        tag = run_git(["describe", "--tags", "--exact-match", "HEAD"], checkout, check=False)
        if tag.returncode == 0:
            return tag.stdout.decode().strip().removeprefix("v"), "the git tag at HEAD"
    for info in sorted((checkout / "python").glob("sglang*.egg-info/PKG-INFO")):
        match = re.search(r"^Version: (.+)$", info.read_text(errors="replace"), re.MULTILINE)
        if match:
            return match.group(1).strip(), str(info.relative_to(checkout))
    return None, "no _version.py, exact tag or egg-info"


def apply_into(project, checkout: Path, pin_name: str | None = None, *, allow_unavailable: bool = False) -> IntoResult:
    from sglpatch.authoring import applied_renditions
    from sglpatch.project import apply_series

    checkout = checkout.resolve()
    if not (checkout / "python" / "sglang").is_dir():
        raise SglpatchError(f"{checkout}: not an sglang checkout (no python/sglang/ in it)")
    pins = project.pins()
    if pin_name is None:
        found, how = checkout_version(checkout)
        if found is None:
            raise SglpatchError(f"{checkout}: cannot tell its sglang version ({how}); name the pin with --pin")
        pinned = {pin.version: pin for pin in pins.pins}
        if found not in pinned:
            raise SglpatchError(
                f"{checkout}: sglang {found} (from {how}) is not pinned; pinned: {', '.join(pinned)}"
            )
        pin = pinned[found]
    else:
        pin = pins.select([pin_name])[0]
    report = apply_series(project, [pin.version], allow_unavailable=allow_unavailable)
    result = report.results[0]
    if not result.ok:
        raise SglpatchError(f"sglang {pin.version}: the series does not apply: {result.error}")
    tree = Path(result.tree_path)
    renditions = applied_renditions(project, pin.version)
    commits = git_out(["rev-list", "--reverse", f"{result.pristine}..{result.commit}"], tree).split()
    if len(commits) != len(renditions):
        raise SglpatchError(f"{tree}: {len(commits)} commits for {len(renditions)} applied patches; run apply again")
    touched = sorted({path for _, rendition in renditions for path in _paths(rendition)})
    _refuse_unless_pristine(checkout, tree, result.pristine, touched, pin.version)
    if _is_git(checkout):
        return _into_git(checkout, tree, pin.version, renditions, commits, touched)
    return _into_folder(checkout, tree, pin.version, result.commit, touched)


def _paths(rendition) -> list[str]:
    existing, created = diffs.touched_paths(diffs.parse_diff(rendition))
    return existing + created


def _blob(tree: Path, commit: str, path: str) -> bytes | None:
    shown = run_git(["cat-file", "blob", f"{commit}:{path}"], tree, check=False)
    return shown.stdout if shown.returncode == 0 else None


def _refuse_unless_pristine(checkout: Path, tree: Path, pristine: str, touched: list[str], version: str) -> None:
    for path in touched:
        expected = _blob(tree, pristine, path)
        local = checkout / path
        if expected is None:
            if local.exists():
                raise SglpatchError(f"{local}: the series creates it, but the checkout already has it; refused")
            continue
        if not local.is_file() or local.is_symlink():
            raise SglpatchError(f"{local}: missing (or not a plain file); the checkout is not sglang {version}")
        if local.read_bytes() != expected:
            raise SglpatchError(
                f"{local}: differs from sglang {version}'s pristine file (sha256 "
                f"{hashlib.sha256(local.read_bytes()).hexdigest()[:12]} vs {hashlib.sha256(expected).hexdigest()[:12]}); "
                "the series is made for the release as published, so nothing was changed"
            )


def _is_git(checkout: Path) -> bool:
    inside = run_git(["rev-parse", "--show-toplevel"], checkout, check=False)
    return inside.returncode == 0 and Path(inside.stdout.decode().strip()).resolve() == checkout


def _user_git(args: list[str], checkout: Path, env: dict[str, str] | None = None, input: bytes | None = None) -> str:
    """git in the user's checkout with the user's own configuration (identity, hooks stay theirs)."""
    done = run_tool(["git", *args], f"git {' '.join(args[:2])} in {checkout}", USER_GIT_TIMEOUT_S, cwd=checkout,
                    env={**os.environ, **(env or {})}, input=input or b"")
    if done.returncode != 0:
        raise SglpatchError(f"git {' '.join(args[:2])} failed in {checkout}: {done.stderr.decode(errors='replace').strip()}")
    return done.stdout.decode().strip()


def _into_git(checkout: Path, tree: Path, version: str, renditions, commits: list[str], touched: list[str]) -> IntoResult:
    dirty = _user_git(["status", "--porcelain", "--", *touched], checkout)
    if dirty:
        raise SglpatchError(f"{checkout}: local changes in files the series changes ({dirty.splitlines()[0]} ...); commit or stash them")
    head = _user_git(["rev-parse", "HEAD"], checkout)
    branch = _user_git(["symbolic-ref", "--quiet", "HEAD"], checkout) if _has_branch(checkout) else ""
    identity = _identity(checkout)
    index = checkout / ".git" / f"sglpatch-into-index-{os.getpid()}"
    env = {"GIT_INDEX_FILE": str(index)}
    made = []
    try:
        _user_git(["read-tree", head], checkout, env=env)
        parent = head
        for (name, rendition), ours in zip(renditions, commits):
            for path in _paths(rendition):
                data = _blob(tree, ours, path)
                if data is None:
                    _user_git(["update-index", "--force-remove", "--", path], checkout, env=env)
                    continue
                mode = git_out(["ls-tree", "--format=%(objectmode)", ours, "--", path], tree) or "100644"
                blob = _user_git(["hash-object", "-w", "--stdin"], checkout, input=data)
                _user_git(["update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}"], checkout, env=env)
            new_tree = _user_git(["write-tree"], checkout, env=env)
            message = run_git(["log", "-1", "--format=%B", ours], tree).stdout
            author = git_out(["log", "-1", "--format=%an%x00%ae%x00%aI", ours], tree).split("\0")
            commit_env = {"GIT_AUTHOR_NAME": author[0], "GIT_AUTHOR_EMAIL": author[1], "GIT_AUTHOR_DATE": author[2],
                          "GIT_COMMITTER_NAME": identity[0], "GIT_COMMITTER_EMAIL": identity[1]}
            parent = _user_git(["commit-tree", new_tree, "-p", parent], checkout, env=commit_env, input=message)
            made.append(parent)
    finally:
        index.unlink(missing_ok=True)
    # git moves the work tree and refuses to overwrite a local change; then the branch follows.
    _user_git(["read-tree", "-m", "-u", head, parent], checkout)
    _user_git(["update-ref", "-m", f"sglpatch apply --into: series for sglang {version}", branch or "HEAD", parent, head], checkout)
    return IntoResult(checkout, version, "git commits", made, touched)


def _has_branch(checkout: Path) -> bool:
    return run_tool(["git", "symbolic-ref", "--quiet", "HEAD"], f"git symbolic-ref in {checkout}", 60,
                    cwd=checkout).returncode == 0


def _identity(checkout: Path) -> tuple[str, str]:
    try:
        name = _user_git(["config", "user.name"], checkout)
        email = _user_git(["config", "user.email"], checkout)
        return name, email
    except SglpatchError:
        return IDENTITY_NAME, IDENTITY_EMAIL


def _into_folder(checkout: Path, tree: Path, version: str, commit: str, touched: list[str]) -> IntoResult:
    results = {path: _blob(tree, commit, path) for path in touched}
    unwritable = [path for path in touched if not os.access((checkout / path).parent, os.W_OK)]
    if unwritable:
        raise SglpatchError(f"{checkout / unwritable[0]}: its folder is not writable; nothing was changed")
    for path, data in results.items():
        target = checkout / path
        if data is None:
            target.unlink(missing_ok=True)
        else:
            cache.write_atomically(target, data)
    return IntoResult(checkout, version, "files rewritten", [], touched)

