"""Applying the series to one pin: one commit per patch on the pristine commit, classified.

The commits are built with git plumbing in a private index (``git apply --cached``,
``write-tree``, ``commit-tree``), never in the work tree, so a patch that fails -- or a run that is
killed -- leaves the pin's tree and branch exactly as they were. Only when every patch is settled
and the lock agrees are the branch and the work tree moved, in one step that the next run finishes
if it was interrupted.

Commit messages and authors come from ``git mailinfo``, as ``git am`` takes them; the committer is
fixed and dated with the author date, so the hashes equal those of ``git am
--committer-date-is-author-date`` run with the same committer, and are the same on every machine.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import tempfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

import unidiff

from sglpatch import cache, diffs, progress
from sglpatch.check import patch_problems
from sglpatch.errors import SglpatchError
from sglpatch.gitcmd import IDENTITY_EMAIL, IDENTITY_NAME, git_out, run_git
from sglpatch.lock import check_entry, compare_entry
from sglpatch.pins import Pin
from sglpatch.series import RENDITIONS_DIR, PatchFile, Series
from sglpatch.sources import PRISTINE_REF, Pristine
from sglpatch import witnesses
from sglpatch.witnesses import BUG, CLEAN, UNAVAILABLE, WitnessResult

BRANCH = "sglpatch"
UPDATING_MARKER = "sglpatch-updating"
RESULTS_DIR = "sglpatch-results"

APPLIED = "applied"
APPLIED_WITH_OFFSET = "applied-with-offset"
ALREADY_UPSTREAM = "already-upstream"
CONFLICT = "conflict"
MISSING_FILE = "missing-file"
NOT_APPLICABLE = "not-applicable"
NOT_NEEDED = "not-needed"
WITNESS_FAILED = "witness-failed"
WITNESS_UNAVAILABLE = "witness-unavailable"
FAILURES = (CONFLICT, MISSING_FILE, WITNESS_FAILED, WITNESS_UNAVAILABLE)
# The line every outcome carries when the user ran with --allow-unavailable and a witness could
# not run: the patch was applied on text alone and nothing proved it needed or working.
UNPROVEN = "UNPROVEN (--allow-unavailable): witness could not run"

_OFFSET_RE = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_FAILED_AT_RE = re.compile(r"error: patch failed: (.+):(\d+)")


@dataclass
class PatchOutcome:
    name: str
    status: str
    rendition: str = ""
    commit: str = ""
    detail: str = ""
    needed: bool | None = None  # None: no witness could tell
    witness_before: str = ""
    witness_after: str = ""
    reverse_applies: bool = False  # the pin already holds exactly this change
    unproven: str = ""  # with --allow-unavailable: why the witness could not prove this outcome

    def witness_record(self) -> dict:
        """For the lock entry: what the witness answered, with the level it ran at, on the
        pristine and the patched tree (nothing where no witness ran). How a result was proved,
        not what it is: ``lock`` compares entries without it."""
        if not self.witness_before:
            return {}
        return {"witness": {"pristine": self.witness_before, "patched": self.witness_after or "-"}}


@dataclass
class PinResult:
    version: str
    tree_path: str
    ok: bool = False
    pristine: str = ""
    commit: str = ""
    tree: str = ""
    lock: str = ""
    error: str = ""
    patches: list[PatchOutcome] = field(default_factory=list)

    def lock_entry(self, artifact_sha256: str) -> dict:
        return {
            "artifact_sha256": artifact_sha256,
            "pristine": self.pristine,
            "patches": [
                {"name": outcome.name, "status": outcome.status, "commit": outcome.commit, **outcome.witness_record()}
                for outcome in self.patches
            ],
            "commit": self.commit,
            "tree": self.tree,
        }


def apply_pin(
    pin: Pin,
    series: Series,
    pristine: Pristine,
    out_dir: Path,
    lock_path: Path,
    *,
    update_lock: bool = False,
    run_witnesses: bool = True,
    allow_unavailable: bool = False,
    discard_local: bool = False,
    record: bool = True,
) -> PinResult:
    """Apply ``series`` to ``pin``; on any failure the pin's tree is left as it was.

    With ``run_witnesses``, each patch's witness runs on the pristine tree first: a patch whose bug
    is absent there is ``not-needed`` and is not applied; after the series, every witness of an
    applied patch must pass on the patched tree. A witness that cannot run fails the pin
    (``witness-unavailable``) unless ``allow_unavailable``, and then every such outcome says it is
    unproven. Commits on the pin's ``sglpatch`` branch that sglpatch did not make are never
    dropped unless ``discard_local``. Without ``record`` (``sglpatch witness``) the result is only
    compared with the lock: no lock entry is written and no branch moves.
    """
    tree_path = out_dir / pin.version
    result = PinResult(version=pin.version, tree_path=str(tree_path), pristine=pristine.commit)
    with cache.entry_lock(tree_path):
        try:
            ensure_tree_repo(tree_path, pristine)
            _clear_leftovers(tree_path)
            _check_clean(tree_path)
            _build(tree_path, pin, series, pristine, result, run_witnesses, allow_unavailable)
            if any(outcome.status in FAILURES for outcome in result.patches):
                result.error = "; ".join(
                    f"{o.name}: {o.status}" for o in result.patches if o.status in FAILURES
                )
                return result
            key = pin.version if pristine.source == "index" else f"{pin.version}@{pristine.source}"
            if not record:
                check = compare_entry(lock_path, key, result.lock_entry(pin.sha256))
                result.lock = check.state
                result.ok = check.state != "mismatch"
                if not result.ok:
                    result.error = f"{lock_path}: result for {key} differs from the lock ({check.difference})"
                return result
            at = _at(tree_path, result.commit)
            if not discard_local and not at:
                _refuse_to_lose_work(tree_path, result.commit)
            check = check_entry(lock_path, key, result.lock_entry(pin.sha256), update_lock)
            result.lock = check.state
            if check.state == "mismatch":
                result.error = (
                    f"{lock_path}: result for {key} differs from the lock ({check.difference}); "
                    "run with --update-lock to accept it"
                )
                return result
            _move_branch(tree_path, result.commit, at)
            result.ok = True
        except SglpatchError as exc:
            result.error = str(exc)
    return result


# -- the pin's repository -----------------------------------------------------------------------


def ensure_tree_repo(tree_path: Path, pristine: Pristine) -> None:
    """The pin's tree repository, cloned from the cached pristine commit if it is not there."""
    if not (tree_path / ".git").is_dir():
        if tree_path.exists() and any(tree_path.iterdir()):
            raise SglpatchError(f"{tree_path}: exists and is not a git repository; move it away")
        staging = Path(tempfile.mkdtemp(dir=tree_path.parent, prefix=f".{tree_path.name}-"))
        try:
            # --local hardlinks the cached objects: cheap, and the tree survives a cleared cache.
            run_git(["clone", "--quiet", "--local", "--no-checkout", str(pristine.repo), str(staging)], tree_path.parent)
            # Until the first checkout finishes, the tree is ours to overwrite.
            (staging / ".git" / UPDATING_MARKER).write_text("first checkout\n")
            if tree_path.exists():
                tree_path.rmdir()
            os.replace(staging, tree_path)
        finally:
            cache.remove(staging)
    local = run_git(["rev-parse", "--verify", "--quiet", PRISTINE_REF], tree_path, check=False)
    if local.stdout.decode().strip() == pristine.commit:
        return
    if run_git(["cat-file", "-e", f"{pristine.commit}^{{commit}}"], tree_path, check=False).returncode:
        run_git(["fetch", "--quiet", str(pristine.repo), PRISTINE_REF], tree_path)
    run_git(["update-ref", PRISTINE_REF, pristine.commit], tree_path)


def _clear_leftovers(tree_path: Path) -> None:
    """Private indexes and checkouts of a run that was killed; we hold the tree's lock, so no live
    run owns them."""
    for pattern in ("sglpatch-index-*", "sglpatch-witness-*"):
        for leftover in (tree_path / ".git").glob(pattern):
            cache.remove(leftover)


def _untracked_in_the_way(tree_path: Path, commit: str) -> list[str]:
    listing = run_git(["ls-files", "-z", "--others", "--exclude-standard"], tree_path).stdout.decode()
    untracked = [path for path in listing.split("\0") if path]
    if not untracked:
        return []
    present = run_git(["ls-tree", "-r", "-z", "--name-only", commit, "--", *untracked], tree_path).stdout.decode()
    return [path for path in present.split("\0") if path]


def _check_clean(tree_path: Path) -> None:
    if (tree_path / ".git" / UPDATING_MARKER).exists():
        return  # an interrupted update of ours; _move_branch finishes it
    status = git_out(["status", "--porcelain", "--untracked-files=no"], tree_path)
    if status:
        first = status.splitlines()[0]
        raise SglpatchError(
            f"{tree_path}: the tree has local changes ({first} ...); commit or discard them first"
        )


def local_commits(tree_path: Path, commit: str) -> list[str]:
    """Commits that moving the tree to ``commit`` would leave unreachable and that sglpatch did
    not make ("<hash> <subject>", newest first): the user's work on the branch or a detached HEAD.

    A commit is ours when its committer is sglpatch's fixed identity; one still reachable from
    ``commit``, the pristine branch, any other branch or tag, or ``refs/sglpatch/*`` (where
    ``sglpatch patch refresh`` keeps the commits it wrote into patches/) is not lost."""
    heads = []
    for ref in ("HEAD", f"refs/heads/{BRANCH}"):
        found = run_git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], tree_path, check=False)
        if found.returncode == 0:
            heads.append(found.stdout.decode().strip())
    if not heads:
        return []
    others = [
        line.split()[0]
        for line in run_git(
            ["for-each-ref", "--format=%(objectname) %(refname)", "refs/heads", "refs/tags", "refs/sglpatch"], tree_path
        )
        .stdout.decode()
        .splitlines()
        if line.split()[1] != f"refs/heads/{BRANCH}"
    ]
    listing = run_git(
        ["rev-list", "--format=%H%x00%ce%x00%s", "--no-commit-header", *dict.fromkeys(heads), "--not", commit, *others],
        tree_path,
    ).stdout.decode()
    lost = []
    for line in listing.splitlines():
        sha, email, subject = (line.split("\0") + ["", ""])[:3]
        if email != IDENTITY_EMAIL:
            lost.append(f"{sha[:12]} {subject}")
    return lost


def _at(tree_path: Path, commit: str) -> bool:
    """The tree has ``commit`` checked out on the sglpatch branch."""
    # One git for both: HEAD's commit, then the ref HEAD names ("HEAD" when detached); an unborn
    # HEAD fails the call.
    found = run_git(["rev-parse", "HEAD", "--symbolic-full-name", "HEAD", "--"], tree_path, check=False)
    return found.returncode == 0 and found.stdout.decode().split()[:2] == [commit, f"refs/heads/{BRANCH}"]


def _refuse_to_lose_work(tree_path: Path, commit: str) -> None:
    """Refuse before anything is written when moving the tree to ``commit`` would drop the user's
    commits or overwrite their untracked files."""
    lost = local_commits(tree_path, commit)
    if lost:
        newest, oldest = lost[0].split()[0], lost[-1].split()[0]
        raise SglpatchError(
            f"{tree_path}: the {BRANCH} branch holds {len(lost)} commit(s) sglpatch did not make "
            f"({'; '.join(lost[:3])}{' ...' if len(lost) > 3 else ''}); applying would drop them. "
            f"Export them first (git -C {tree_path} format-patch -o <folder> {oldest}^..{newest}) "
            "or run again with --discard-local"
        )
    untracked = _untracked_in_the_way(tree_path, commit)
    if untracked:
        raise SglpatchError(
            f"{tree_path}: untracked file {untracked[0]}{' and others' if len(untracked) > 1 else ''} would be "
            "overwritten by the applied tree; move it away or run again with --discard-local"
        )


def _move_branch(tree_path: Path, commit: str, at: bool | None = None) -> None:
    """Check out ``commit`` on the sglpatch branch; ``at``, where given, is ``_at`` asked under
    the same hold of the tree's lock."""
    git_dir = tree_path / ".git"
    marker = git_dir / UPDATING_MARKER
    if (_at(tree_path, commit) if at is None else at) and not marker.exists():
        return
    marker.write_text(commit + "\n")
    run_git(["update-ref", f"refs/heads/{BRANCH}", commit], tree_path)
    run_git(["symbolic-ref", "HEAD", f"refs/heads/{BRANCH}"], tree_path)
    run_git(["reset", "--quiet", "--hard", commit], tree_path)
    marker.unlink()


# -- building the commits -----------------------------------------------------------------------


def _inputs_key(
    pin: Pin, pristine: Pristine, renditions: list[tuple[str, PatchFile | None]], run_witnesses: bool
) -> str:
    """What an apply result depends on: the pristine commit, every rendition's bytes, and with
    witnesses each witness's fingerprint for the pin (its code, environment and toolchain)."""
    prints = (
        sorted(f"{w.name}-{witnesses.fingerprint(w, pin)}" for w in witnesses.registry().values())
        if run_witnesses
        else []
    )
    digest = hashlib.sha256(f"sglpatch-apply-5\0{pristine.commit}\0{prints}\0".encode())
    for name, rendition in renditions:
        digest.update(name.encode() + b"\0" + (rendition.raw if rendition else b"-") + b"\0")
    return digest.hexdigest()


def _build(
    tree_path: Path,
    pin: Pin,
    series: Series,
    pristine: Pristine,
    result: PinResult,
    run_witnesses: bool,
    allow_unavailable: bool,
) -> None:
    selected = [(patch.name, patch.for_version(pin.version)) for patch in series.patches]
    key = _inputs_key(pin, pristine, selected, run_witnesses)
    memo = tree_path / ".git" / RESULTS_DIR / f"{key}.json"
    if memo.exists():
        saved = json.loads(memo.read_text())
        commit_ok = run_git(["cat-file", "-e", f"{saved['commit']}^{{commit}}"], tree_path, check=False)
        if commit_ok.returncode == 0:
            result.commit, result.tree = saved["commit"], saved["tree"]
            result.patches = [PatchOutcome(**outcome) for outcome in saved["patches"]]
            return
    for name, rendition in selected:
        if rendition is not None:
            problems = patch_problems(rendition, series.directory.parent)
            if problems:
                raise SglpatchError("; ".join(str(problem) for problem in problems))
    _apply_all(tree_path, pin, pristine, selected, result, run_witnesses, allow_unavailable)
    # An unavailable witness may be available next time; only settled answers are remembered.
    settled = not any(o.unproven for o in result.patches)
    if settled and not any(outcome.status in FAILURES for outcome in result.patches):
        cache.write_atomically(
            memo, json.dumps({"commit": result.commit, "tree": result.tree, "patches": [asdict(o) for o in result.patches]})
        )


def _apply_all(
    tree_path: Path,
    pin: Pin,
    pristine: Pristine,
    selected: list[tuple[str, PatchFile | None]],
    result: PinResult,
    run_witnesses: bool,
    allow_unavailable: bool = False,
) -> None:
    checks = {
        name: witnesses.witness_for(rendition.trailer("Witness"), str(rendition.path))
        for name, rendition in selected
        if rendition is not None and run_witnesses
    }
    with _Checkouts(tree_path) as checkouts:
        pristine_tree = _tree_of(tree_path, pristine.commit)
        answers = _witnessed(
            [w for w in checks.values() if w is not None], pristine_tree, pin, "pristine",
            lambda: checkouts.get(pristine.commit),
        )
        before = {name: answers[witness.name] for name, witness in checks.items() if witness is not None}
        _apply_commits(tree_path, pin, pristine, selected, result, before, allow_unavailable)
        to_confirm = [
            outcome for outcome in result.patches
            if checks.get(outcome.name) is not None and outcome.status not in (NOT_NEEDED, NOT_APPLICABLE, *FAILURES)
        ]
        answers = _witnessed(
            [checks[o.name] for o in to_confirm], result.tree, pin, "patched", lambda: checkouts.get(result.commit)
        )
        for outcome in to_confirm:
            witness = checks[outcome.name]
            after = answers[witness.name]
            outcome.witness_after = after.summary()
            if after.state == BUG:
                outcome.status = WITNESS_FAILED
                outcome.detail = f"witness {witness.name} still finds the bug after the series: {after.detail}"
            elif after.state == UNAVAILABLE:
                _unavailable(outcome, f"witness {witness.name} could not run on the patched tree: {after.detail}",
                             allow_unavailable)


def _apply_commits(
    tree_path: Path,
    pin: Pin,
    pristine: Pristine,
    selected: list[tuple[str, PatchFile | None]],
    result: PinResult,
    before: dict[str, WitnessResult],
    allow_unavailable: bool = False,
) -> None:
    git_dir = tree_path / ".git"
    fd, index_name = tempfile.mkstemp(dir=git_dir, prefix="sglpatch-index-")
    os.close(fd)
    os.unlink(index_name)
    env = {"GIT_INDEX_FILE": index_name}
    try:
        run_git(["read-tree", pristine.commit], tree_path, env=env)
        modes = _tree_modes(tree_path, pristine.commit)
        parent = pristine.commit
        for name, rendition in selected:
            if rendition is None:
                result.patches.append(PatchOutcome(name, NOT_APPLICABLE, detail=f"no rendition for {pin.version}"))
                continue
            witnessed = before.get(name)
            if witnessed is not None and witnessed.state == CLEAN:
                same = reverse_applies(tree_path, env, rendition.diff_text)
                how = "the patch reverse-applies: upstream has this change" if same else "upstream fixed it differently"
                result.patches.append(
                    PatchOutcome(
                        name,
                        NOT_NEEDED,
                        rendition=str(rendition.path),
                        detail=f"fixed upstream: witness {witnessed.witness} passes on the pristine tree; {how}",
                        needed=False,
                        witness_before=witnessed.summary(),
                        reverse_applies=same,
                    )
                )
                continue
            outcome = _apply_one(tree_path, env, modes, name, rendition, parent)
            if witnessed is not None:
                outcome.witness_before = witnessed.summary()
                outcome.needed = True if witnessed.state == BUG else None
                if witnessed.state == UNAVAILABLE and outcome.status not in FAILURES:
                    _unavailable(
                        outcome,
                        f"witness {witnessed.witness} could not run on the pristine tree, so nothing says the "
                        f"patch is needed: {witnessed.detail}",
                        allow_unavailable,
                    )
            result.patches.append(outcome)
            if outcome.commit:
                parent = outcome.commit
                modes = _tree_modes(tree_path, parent)
        result.commit = parent
        result.tree = git_out(["rev-parse", f"{parent}^{{tree}}"], tree_path)
    finally:
        Path(index_name).unlink(missing_ok=True)


def _witnessed(checks: list, tree_hash: str, pin: Pin, which: str, materialize) -> dict[str, WitnessResult]:
    """Every witness's answer on one tree (the CPU ones in one child process), as a progress step."""
    if not checks:
        return {}
    names = ", ".join(witness.name for witness in checks)
    with progress.step(f"  {pin.version}: witnesses on the {which} tree ({names})") as shown:
        answers = witnesses.run_cached_many(checks, tree_hash, pin, materialize)
        shown.outcome = "; ".join(f"{name} {result.summary()}" for name, result in answers.items())
    return answers


def _unavailable(outcome: PatchOutcome, reason: str, allowed: bool) -> None:
    """A witness that could not run: a failure of the pin, or with ``allowed`` an unproven outcome
    that says so on its line. Either way it is never remembered as settled."""
    if allowed:
        outcome.unproven = reason
        outcome.detail = (outcome.detail + "\n" if outcome.detail else "") + f"{UNPROVEN}: {reason}"
        return
    outcome.status = WITNESS_UNAVAILABLE
    outcome.detail = reason + " (--allow-unavailable applies it unproven)"


def _tree_of(tree_path: Path, commit: str) -> str:
    return git_out(["rev-parse", f"{commit}^{{tree}}"], tree_path)


def checkout_commit(repo: Path, commit: str, dest: Path, paths: list[str] | None = None) -> Path:
    """The files of ``commit`` (only ``paths`` where given) written to ``dest`` (no .git), for a
    witness to look at: by git itself (a private index and ``checkout-index``, which refuses
    paths outside ``dest``)."""
    dest.mkdir(parents=True, exist_ok=True)
    if paths is not None and not paths:
        return dest
    which = ["--all"] if paths is None else ["-z", "--stdin"]
    names = None if paths is None else "\0".join(paths).encode(errors="surrogateescape") + b"\0"
    with tempfile.TemporaryDirectory(prefix="sglpatch-checkout-") as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        run_git(["read-tree", commit], repo, env=env)
        run_git(["--work-tree", str(dest), "checkout-index", "--force", *which], repo, env=env, input=names)
    return dest


def advance_checkout(repo: Path, folder: Path, old: str, new: str) -> Path:
    """Turn ``folder``, a checkout of ``old``, into one of ``new`` by writing only the paths that
    differ: a series touches a handful of a release's thousands of files. Where the folder no
    longer holds exactly ``old``'s paths (something wrote into it), it is checked out afresh."""
    if _checked_out_paths(folder) != set(_tree_modes(repo, old)):
        cache.remove(folder)
        return checkout_commit(repo, new, folder)
    changed = run_git(["diff-tree", "-r", "-z", "--no-renames", "--name-status", old, new], repo).stdout
    fields = changed.decode(errors="surrogateescape").split("\0")
    written = []
    for status, path in zip(fields[0::2], fields[1::2]):
        target = folder / path
        if status == "D" or target.is_symlink() or target.exists():
            target.unlink(missing_ok=True)
        if status == "D":
            parent = target.parent
            while parent != folder and not any(parent.iterdir()):
                parent.rmdir()
                parent = parent.parent
        else:
            written.append(path)
    if written:
        checkout_commit(repo, new, folder, written)
    return folder


def _checked_out_paths(folder: Path) -> set[str]:
    found = set()
    for root, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            found.add(os.path.relpath(os.path.join(root, name), folder))
    return found


class _Checkouts:
    """The commits witnesses look at, in one private folder removed afterwards: the first checked
    out, each next one made from the one before (the folder holds one commit at a time)."""

    def __init__(self, tree_path: Path):
        self.tree_path = tree_path
        self.folder: Path | None = None
        self.commit: str | None = None

    def __enter__(self) -> "_Checkouts":
        return self

    def get(self, commit: str) -> Path:
        if self.folder is None:
            self.folder = Path(tempfile.mkdtemp(dir=self.tree_path / ".git", prefix="sglpatch-witness-"))
            checkout_commit(self.tree_path, commit, self.folder)
        elif commit != self.commit:
            advance_checkout(self.tree_path, self.folder, self.commit, commit)
        self.commit = commit
        return self.folder

    def __exit__(self, *exc) -> None:
        if self.folder is not None:
            cache.remove(self.folder)


def _tree_modes(tree_path: Path, commit: str) -> dict[str, str]:
    listing = run_git(["ls-tree", "-r", "-z", "--full-tree", commit], tree_path).stdout.decode()
    modes = {}
    for entry in filter(None, listing.split("\0")):
        meta, path = entry.split("\t", 1)
        modes[path] = meta.split()[0]
    return modes


def _apply_one(
    tree_path: Path,
    env: dict[str, str],
    modes: dict[str, str],
    name: str,
    rendition: PatchFile,
    parent: str,
) -> PatchOutcome:
    where = display_name(rendition)
    outcome = PatchOutcome(name=name, status="", rendition=str(rendition.path))
    patch_set = diffs.parse_diff(rendition)
    existing, created = diffs.touched_paths(patch_set)
    for path in existing + created:
        link = _through_link(path, modes)
        if link:
            raise SglpatchError(f"{where}: {path} goes through the symbolic link {link} in the tree; refused")
    missing = [path for path in existing if path not in modes]
    diff = rendition.diff_text.encode()
    forward = run_git(
        ["apply", "--cached", "--check", "-v", "--whitespace=nowarn", "-"], tree_path, env=env, input=diff, check=False
    )
    if forward.returncode == 0 and not missing:
        offsets = _OFFSET_RE.findall(forward.stderr.decode())
        run_git(["apply", "--cached", "--whitespace=nowarn", "-"], tree_path, env=env, input=diff)
        tree = git_out(["write-tree"], tree_path, env=env)
        outcome.commit = commit_patch(tree_path, rendition, tree, parent)
        if offsets:
            outcome.status = APPLIED_WITH_OFFSET
            outcome.detail = ", ".join(f"hunk {h} at line {line} (offset {off})" for h, line, off in offsets)
        else:
            outcome.status = APPLIED
        return outcome
    if reverse_applies(tree_path, env, rendition.diff_text):
        outcome.status = ALREADY_UPSTREAM
        outcome.reverse_applies = True
        outcome.detail = "the patch reverse-applies: upstream already has it"
        return outcome
    if missing:
        outcome.status = MISSING_FILE
        outcome.detail = f"{where}: not in the tree: {', '.join(missing)}"
        return outcome
    outcome.status = CONFLICT
    outcome.detail = conflict_detail(where, patch_set, forward.stderr.decode())
    return outcome


def reverse_applies(repo: Path, env: dict[str, str], diff: str) -> bool:
    """Whether ``diff`` reverse-applies on the index ``env`` names: the tree already holds it."""
    reverse = run_git(["apply", "--cached", "--check", "--reverse", "--whitespace=nowarn", "-"], repo, env=env,
                      input=diff.encode(), check=False)
    return reverse.returncode == 0


def display_name(rendition: PatchFile) -> str:
    parts = rendition.path.parts
    return "/".join(parts[-3:]) if len(parts) >= 3 and parts[-3] == RENDITIONS_DIR else parts[-1]


def _through_link(path: str, modes: dict[str, str]) -> str | None:
    parts = path.split("/")
    for depth in range(1, len(parts)):
        prefix = "/".join(parts[:depth])
        if modes.get(prefix) == "120000":
            return prefix
    return None


def conflict_detail(where: str, patch_set: unidiff.PatchSet, stderr: str) -> str:
    match = _FAILED_AT_RE.search(stderr)
    if not match:
        return f"{where}: {stderr.strip()}"
    path, line = match.group(1), int(match.group(2))
    hunk = diffs.hunk_at(patch_set, path, line)
    if hunk is None:
        return f"{where}: {path}:{line} does not match"
    number, text = hunk
    return f"{where}: hunk {number} of {path} (at line {line}) does not match:\n{text.rstrip()}"


def commit_patch(tree_path: Path, rendition: PatchFile, tree: str, parent: str) -> str:
    """Commit ``tree`` on ``parent`` with the patch's author, date and message, as git am would."""
    with tempfile.TemporaryDirectory(prefix="sglpatch-mail-") as scratch:
        msg, patch = Path(scratch) / "msg", Path(scratch) / "patch"
        info = run_git(["mailinfo", str(msg), str(patch)], tree_path, input=rendition.raw).stdout.decode()
        fields = dict(line.split(": ", 1) for line in info.splitlines() if ": " in line)
        body = msg.read_text()
    message = fields.get("Subject", "") + ("\n\n" + body if body.strip() else "\n")
    date = fields.get("Date", "")
    env = {
        "GIT_AUTHOR_NAME": fields.get("Author", ""),
        "GIT_AUTHOR_EMAIL": fields.get("Email", ""),
        "GIT_AUTHOR_DATE": date,
        "GIT_COMMITTER_NAME": IDENTITY_NAME,
        "GIT_COMMITTER_EMAIL": IDENTITY_EMAIL,
        "GIT_COMMITTER_DATE": date,
    }
    return git_out(["commit-tree", tree, "-p", parent], tree_path, env=env, input=message.encode())
