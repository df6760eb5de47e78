"""``sglpatch apply --into CHECKOUT``: the pin's series applied to an sglang checkout of the user's.

Users serve from the released ROCm image, whose sglang is a git checkout at
``/sgl-workspace/sglang``, or work in their own clone. The checkout's sglang version picks the pin
(setuptools-scm's ``python/sglang/_version.py``, else an exact ``v<version>`` tag, else the
egg-info of an editable install; else the pin named after the checkout). Before anything changes,
every file the pin's applied series touches must be byte for byte the pin's pristine file there;
otherwise the run is refused naming the file.

By default the series goes in exactly as ``series.lock`` pins it, and nothing is proven again
here (``locked_series``): the pin's artifact, refused unless its sha256 is the pin's, gives the
pristine commit, which must be the lock's; the renditions the lock applies are committed on it in a
scratch repository, and each commit and the final tree must be the lock's, all before the checkout
is touched. No witness environment is built and no witness runs; the answer says "as locked" and
what the lock records of the proof. A series that gives another tree (a patch edited here) is
refused, naming the patch, unless ``witness``: then the witnesses prove the series here first, as
``sglpatch witness`` does (in a scratch folder: build/ and the lock are left alone). Either way:

- in a git checkout (a clone, a linked worktree or a submodule: its git directory is asked of
  git), one commit per patch on the current branch or the detached HEAD (the patch's author and
  message, the user as committer: git's own identity, or git's own request for one), the work
  tree moved by git itself, which refuses to overwrite local changes; refused, as git refuses,
  while a rebase, merge, am, cherry-pick, revert or bisect is in progress;
- in a plain folder, the files are rewritten in place, each atomically, after all are computed.

A checkout whose files the series touches are already the series' result is left alone and said
to be so ("already applied").
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.apply.apply_pins import apply_series
from sglpatch.apply.index_apply import commit_patch, display_name, made_on, three_way_to_index
from sglpatch.apply.outcomes import APPLIED_STATES, FAILURES, Outcome
from sglpatch.apply.user_git import (discard, git_path, has_branch, is_git, refuse_during_an_operation,
                                      refuse_unless_writable, require_committer, user_git)
from sglpatch.plumbing import cache, interrupts
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import borrow_objects, git_out, run_git
from sglpatch.series import diffs
from sglpatch.series.authoring import applied_renditions
from sglpatch.series.lock import locked_form, read_lock
from sglpatch.series.patches import PatchFile
from sglpatch.sources import pristine_tree

_LEVEL = re.compile(r"\[[^\]]+\]")  # the level a witness answer ran at, as WitnessResult.summary shows it
_SCM_VERSION = re.compile(r"""^(?:__version__\s*=\s*)?version\s*=\s*['"]([^'"]+)['"]""", re.MULTILINE)


@dataclass
class IntoResult:
    checkout: Path
    version: str
    how: str  # "git commits", "files rewritten" or "already applied"
    commits: list[str] = field(default_factory=list)
    files: list[str] = field(default_factory=list)
    proof: str = ""  # "as locked (...)" or "witnessed here (...)": in full
    summary: str = ""  # the proof in one short line, for a person
    details: list[str] = field(default_factory=list)  # the proof of each patch, one line each
    branch: str = ""  # the branch the commits are on; "" on a detached HEAD or a plain folder
    head_before: str = ""  # HEAD before the commits (what undoes them)
    subjects: list[str] = field(default_factory=list)  # of the commits, in order
    outcomes: list[tuple[str, str]] = field(default_factory=list)  # (patch, status) of every patch claiming the pin

    @property
    def mode(self) -> str:
        return "as locked" if self.proof.startswith("as locked") else "as witnessed here"


@dataclass
class LockedSeries:
    """A pin's series as ``series.lock`` pins it, committed again and checked against the lock."""

    version: str
    repo: Path  # a scratch repository with the commits (the pristine objects borrowed from the cache)
    pristine: str
    commit: str
    tree: str
    renditions: list[tuple[str, PatchFile]]  # (series name, rendition) the lock applies, in order
    commits: list[str]
    proof: str  # what the lock records of the witnesses that proved the entry
    details: list[str] = field(default_factory=list)  # the same, one line per patch
    outcomes: list[tuple[str, str]] = field(default_factory=list)  # (patch, status), as the lock has them


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
        # Below commits of its own (the series applied before, a fix of the user's): the nearest
        # release tag. Every file the series touches is still compared with the release's.
        tag = run_git(["describe", "--tags", "--abbrev=0", "--match", "v[0-9]*", "HEAD"], checkout, check=False)
        if tag.returncode == 0:
            name = tag.stdout.decode().strip()
            return name.removeprefix("v"), f"the nearest git tag below HEAD, {name}"
    for info in sorted((checkout / "python").glob("sglang*.egg-info/PKG-INFO")):
        match = re.search(r"^Version: (.+)$", info.read_text(errors="replace"), re.MULTILINE)
        if match:
            return match.group(1).strip(), str(info.relative_to(checkout))
    return None, "no _version.py, exact tag or egg-info"


def apply_into(project, checkout: Path, pin_name: str | None = None, *, witness: bool = False,
               allow_unavailable: bool = False) -> IntoResult:
    """The pin's series into ``checkout``: as locked, or with ``witness`` proven here first."""
    checkout = checkout.resolve()
    if not (checkout / "python" / "sglang").is_dir():
        raise SglpatchError(f"{checkout}: not an sglang checkout (no python/sglang/ in it)")
    pin = _pin_of(project, checkout, pin_name)
    if witness:
        with tempfile.TemporaryDirectory(prefix="sglpatch-into-") as scratch:
            return _witnessed_into(project, checkout, pin, Path(scratch), allow_unavailable)
    with locked_series(project, pin) as locked:
        done = _into(checkout, locked.repo, pin.version, locked.pristine, locked.renditions, locked.commits,
                     locked.commit, f"as locked ({locked.proof})",
                     f"as locked: series.lock's tree {locked.tree[:12]}, remade here; no witness ran")
    done.details, done.outcomes = locked.details, locked.outcomes
    return done


def _pin_of(project, checkout: Path, pin_name: str | None):
    pins = project.pins()
    if pin_name is not None:
        return pins.select([pin_name])[0]
    found, how = checkout_version(checkout)
    pinned = {pin.version: pin for pin in pins.pins}
    if found is None:
        raise SglpatchError(
            f"{checkout}: cannot tell its sglang version ({how}); name the pin after the checkout: "
            f"sglpatch apply --into {checkout} VERSION (pinned: {', '.join(pinned)})"
        )
    if found not in pinned:
        raise SglpatchError(f"{checkout}: sglang {found} (from {how}) is not pinned; pinned: {', '.join(pinned)}")
    return pinned[found]


def _into(checkout: Path, repo: Path, version: str, pristine: str, renditions, commits: list[str], final: str,
          proof: str, summary: str) -> IntoResult:
    touched = sorted({path for _, rendition in renditions for path in _paths(rendition)})
    in_git = is_git(checkout)
    if in_git:
        refuse_during_an_operation(checkout)
    if touched and _already_applied(checkout, repo, final, touched):
        done = IntoResult(checkout, version, "already applied", [], touched)
    else:
        _refuse_unless_pristine(checkout, repo, pristine, touched, version)
        if in_git:
            done = _into_git(checkout, repo, version, renditions, commits, touched)
        else:
            done = _into_folder(checkout, repo, version, final, touched)
    done.proof, done.summary = proof, summary
    return done


# -- as locked ----------------------------------------------------------------------------------

_REPROVE = "--witness proves the series here instead"


@contextmanager
def locked_series(project, pin) -> Iterator[LockedSeries]:
    """The pin's series exactly as the lock pins it, in a scratch repository removed afterwards;
    refused (one line, naming what differs) where the pristine artifact, a rendition's commit or
    the final tree is not the lock's. Runs no witness and builds no witness environment."""
    version = pin.version
    entry = read_lock(project.lock_file)["pins"].get(version)
    if entry is None:
        raise SglpatchError(f"{project.lock_file}: no entry for sglang {version}, so nothing is locked to apply; {_REPROVE}")
    if entry.get("artifact_sha256") != pin.sha256:
        raise SglpatchError(
            f"{project.lock_file}: the entry for {version} is for the artifact with sha256 {entry.get('artifact_sha256')}, "
            f"upstream/pins.toml pins {pin.sha256}; refused"
        )
    # The lock holds the patches that claim the pin (series.lock's docstring), in the series' order.
    locked = [outcome.get("name") for outcome in locked_form(entry).get("patches", [])]
    ours = [patch.name for patch in project.series().patches if patch.for_version(version) is not None]
    if locked != ours:
        raise SglpatchError(
            f"{project.lock_file}: the entry for {version} locks the patches {', '.join(locked) or 'none'}, "
            f"the series has {', '.join(ours) or 'none'} for it; {_REPROVE}"
        )
    renditions = applied_renditions(project, version)
    locked = [(o.get("commit", ""), o.get("status")) for o in entry["patches"] if o.get("status") in APPLIED_STATES]
    pristine = pristine_tree.pristine_from_index(pin)  # the artifact is refused unless its sha256 is the pin's
    if pristine.commit != entry.get("pristine"):
        raise SglpatchError(
            f"sglang {version}: its artifact gives the pristine commit {pristine.commit}, "
            f"the lock has {entry.get('pristine')}; refused"
        )
    with tempfile.TemporaryDirectory(prefix="sglpatch-locked-") as scratch:
        repo = Path(scratch) / "series"
        run_git(["init", "--quiet", str(repo)], Path(scratch))
        # The pristine release's objects stay in the cache; only the patches' few are written here.
        borrow_objects(repo / ".git" / "objects", [pristine.repo])
        env = {"GIT_INDEX_FILE": str(repo / ".git" / "sglpatch-index")}
        run_git(["read-tree", pristine.commit], repo, env=env)
        parent, commits = pristine.commit, []
        for (_, rendition), (expected, status) in zip(renditions, locked):
            where = display_name(rendition)
            # What apply and check refuse in a diff's content (the trailers name witnesses, which
            # as locked do not run).
            problems = diffs.diff_problems(rendition)
            if problems:
                raise SglpatchError(f"{problems[0]}; refused")
            if status == Outcome.APPLIED_THREE_WAY:
                # As apply made it: git's three-way apply, from the blobs of a neighbouring pin's tree.
                merged = three_way_to_index(repo, env, rendition.diff_text, made_on(rendition, project.pins().pins, version))
                tree, why = merged.tree, merged.detail
            else:
                applied = run_git(["apply", "--cached", "--whitespace=nowarn", "-"], repo, env=env,
                                  input=rendition.diff_text.encode(), check=False)
                tree = git_out(["write-tree"], repo, env=env) if applied.returncode == 0 else ""
                why = (applied.stderr.decode(errors="replace").strip().splitlines() or ["git apply failed"])[0]
            if not tree:
                raise SglpatchError(
                    f"{where}: does not apply to sglang {version} as the lock says it does ({status}: {why}); {_REPROVE}"
                )
            parent = commit_patch(repo, rendition, tree, parent)
            if parent != expected:
                raise SglpatchError(
                    f"{where}: gives commit {parent[:12]} on sglang {version}, the lock has {expected[:12]} "
                    f"(the patch is not the one locked: a local edit?); refused: {_REPROVE}, "
                    f"`sglpatch apply {version} --update-lock` records it"
                )
            commits.append(parent)
        tree = git_out(["rev-parse", f"{parent}^{{tree}}"], repo)
        if parent != entry.get("commit") or tree != entry.get("tree"):
            raise SglpatchError(
                f"sglang {version}: the series gives tree {tree[:12]} (commit {parent[:12]}), the lock has "
                f"{str(entry.get('tree'))[:12]} (commit {str(entry.get('commit'))[:12]}); refused: {_REPROVE}"
            )
        yield LockedSeries(version, repo, pristine.commit, parent, tree, renditions, commits,
                           f"series.lock tree {tree[:12]}; {locked_proof(entry)}", _proof_parts(entry)[0],
                           [(str(o.get("name")), str(o.get("status"))) for o in locked_form(entry)["patches"]])


def locked_proof(entry: dict) -> str:
    """What the lock entry records of the witnesses that settled each patch: its outcome, and,
    where the entry records it (a patch's ``witness`` record), the witness's answers on the
    pristine and the patched tree with the level each ran at (``answer [level]``, or ``level``)."""
    parts, answered, levelled = _proof_parts(entry)
    recorded = "; ".join(parts) or "no patches"
    if levelled:
        return f"proven in the lock by: {recorded}"
    if answered:
        return f"the lock records the witnesses' answers but no level: {recorded}"
    return f"the lock records no witness level, only each patch's outcome: {recorded}"


def _proof_parts(entry: dict) -> tuple[list[str], bool, bool]:
    """(each patch's outcome and witness answers as the lock records them, whether any answer is
    recorded, whether any level is)."""
    parts, answered, levelled = [], False, False
    for outcome in entry.get("patches", []):
        number = str(outcome.get("name", "?")).split("-", 1)[0]
        record = outcome.get("witness")
        if isinstance(record, str):
            record = {"answer": record}
        said = []
        if isinstance(record, dict):
            for key, where in (("name", ""), ("pristine", "on the pristine tree "), ("patched", "on the patched tree "),
                               ("answer", ""), ("level", "at ")):
                value = str(record.get(key) or "")
                if value and value != "-":
                    said.append(f"{where}{value}")
                    levelled = levelled or key == "level" or bool(_LEVEL.search(value))
            answered = answered or bool(said)
        parts.append(f"{number} {outcome.get('status', '?')}" + (f" (witness {', '.join(said)})" if said else ""))
    return parts, answered, levelled


# -- witnessed here -----------------------------------------------------------------------------


def _witnessed_into(project, checkout: Path, pin, scratch: Path, allow_unavailable: bool) -> IntoResult:
    """The series proven by its witnesses here, as ``sglpatch witness`` does: in ``scratch``, the
    lock compared, not written."""
    series = project.series()
    report = apply_series(project, [pin.version], out_dir=scratch, record=False, allow_unavailable=allow_unavailable)
    result = report.results[0]
    failed = [o for o in result.patches if o.status in FAILURES]
    if failed or not result.commit:
        why = "; ".join(f"{o.name}: {o.status}: {(o.detail.splitlines() or [''])[0]}" for o in failed) or result.error
        raise SglpatchError(f"sglang {pin.version}: the series does not apply, so nothing was changed: {why}")
    tree = Path(result.tree_path)
    renditions = [(o.name, series.get(o.name).for_version(pin.version)) for o in result.patches if o.commit]
    commits = git_out(["rev-list", "--reverse", f"{result.pristine}..{result.commit}"], tree).split()
    if len(commits) != len(renditions):
        raise SglpatchError(f"{tree}: {len(commits)} commits for {len(renditions)} applied patches; run again")
    details = [
        f"{o.name.split('-', 1)[0]} {o.status}"
        + (f", witness {' -> '.join(filter(None, (o.witness_before, o.witness_after)))}"
           if o.witness_before or o.witness_after else "")
        + (" UNPROVEN" if o.unproven else "")
        for o in result.patches
    ]
    said = "; ".join(details)
    lock = {"not in the lock": "series.lock has no entry for it", "matches": "the same as series.lock"}.get(
        result.lock, "differs from series.lock, which is left as it was")
    unproven = sum(1 for o in result.patches if o.unproven)
    short = f"each patch's witness ran here ({', '.join(f'{o.name[:4]} {o.status}' for o in result.patches)})"
    done = _into(checkout, tree, pin.version, result.pristine, renditions, commits, result.commit,
                 f"witnessed here ({said}; {lock})",
                 short + (f"; {unproven} UNPROVEN (-v says why)" if unproven else ""))
    done.details = details + [f"{o.name.split('-', 1)[0]} UNPROVEN: {o.unproven}" for o in result.patches if o.unproven]
    done.details.append(f"series.lock: {lock}")
    done.outcomes = [(o.name, str(o.status)) for o in result.patches if o.status != Outcome.NOT_APPLICABLE]
    return done


# -- into the checkout --------------------------------------------------------------------------


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


def _already_applied(checkout: Path, tree: Path, final: str, touched: list[str]) -> bool:
    """Whether every file the series touches is already as the series leaves it."""
    for path in touched:
        expected, local = _blob(tree, final, path), checkout / path
        if expected is None:
            if local.exists() or local.is_symlink():
                return False
        elif not local.is_file() or local.is_symlink() or local.read_bytes() != expected:
            return False
    return True


def _into_git(checkout: Path, tree: Path, version: str, renditions, commits: list[str], touched: list[str]) -> IntoResult:
    dirty = user_git(["status", "--porcelain", "--", *touched], checkout)
    if dirty:
        raise SglpatchError(f"{checkout}: local changes in files the series changes ({dirty.splitlines()[0]} ...); commit or stash them")
    head = user_git(["rev-parse", "HEAD"], checkout)
    branch = user_git(["symbolic-ref", "--quiet", "HEAD"], checkout) if has_branch(checkout) else ""
    require_committer(checkout)
    index, objects = git_path(checkout, f"sglpatch-into-index-{os.getpid()}", "objects")
    refuse_unless_writable([index.parent, objects, *{(checkout / path).parent for path in touched}])
    env = {"GIT_INDEX_FILE": str(index)}
    made, subjects = [], []
    try:
        user_git(["read-tree", head], checkout, env=env)
        parent = head
        for (name, rendition), ours in zip(renditions, commits):
            for path in _paths(rendition):
                data = _blob(tree, ours, path)
                if data is None:
                    user_git(["update-index", "--force-remove", "--", path], checkout, env=env)
                    continue
                mode = git_out(["ls-tree", "--format=%(objectmode)", ours, "--", path], tree) or "100644"
                blob = user_git(["hash-object", "-w", "--stdin"], checkout, input=data)
                user_git(["update-index", "--add", "--cacheinfo", f"{mode},{blob},{path}"], checkout, env=env)
            new_tree = user_git(["write-tree"], checkout, env=env)
            message = run_git(["log", "-1", "--format=%B", ours], tree).stdout
            author = git_out(["log", "-1", "--format=%an%x00%ae%x00%aI", ours], tree).split("\0")
            # The committer is whoever git says commits here (require_committer).
            commit_env = {"GIT_AUTHOR_NAME": author[0], "GIT_AUTHOR_EMAIL": author[1], "GIT_AUTHOR_DATE": author[2]}
            parent = user_git(["commit-tree", new_tree, "-p", parent], checkout, env=commit_env, input=message)
            made.append(parent)
            subjects.append(message.decode(errors="replace").split("\n", 1)[0])
    except BaseException:
        discard(index)  # a failure to remove it must not hide why we stopped
        raise
    index.unlink(missing_ok=True)
    # git moves the work tree and refuses to overwrite a local change; then the branch follows,
    # the two not stopped halfway by Ctrl-C.
    where = f"{checkout}: {len(made)} commit{'s' if len(made) != 1 else ''} added on {branch.removeprefix('refs/heads/') or 'the detached HEAD'}"
    with interrupts.whole(where):
        user_git(["read-tree", "-m", "-u", head, parent], checkout)
        user_git(["update-ref", "-m", f"sglpatch apply --into: series for sglang {version}", branch or "HEAD", parent, head],
                  checkout)
    return IntoResult(checkout, version, "git commits", made, touched, branch=branch.removeprefix("refs/heads/"),
                      head_before=head, subjects=subjects)


def _into_folder(checkout: Path, tree: Path, version: str, commit: str, touched: list[str]) -> IntoResult:
    results = {path: _blob(tree, commit, path) for path in touched}
    refuse_unless_writable({(checkout / path).parent for path in touched})
    with interrupts.whole(f"{checkout}: {len(touched)} file{'s' if len(touched) != 1 else ''} rewritten in place"):
        for path, data in results.items():
            target = checkout / path
            if data is None:
                target.unlink(missing_ok=True)
            else:
                cache.write_atomically(target, data)
    return IntoResult(checkout, version, "files rewritten", [], touched)

