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
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from sglpatch.apply.checkouts import Checkouts, tree_modes
from sglpatch.plumbing import cache, progress
from sglpatch.plumbing import gitcmd
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import git_out, run_git
from sglpatch.series import diffs
from sglpatch.series.check import patch_problems, tests_problems
from sglpatch.apply.index_apply import (apply_to_index, check_exact, commit_patch, conflict_detail, display_name, made_on,
                                  reverse_applies, three_way_to_index)
from sglpatch.apply.outcomes import FAILURES, Outcome
from sglpatch.apply.tree_repo import check_clean, clear_leftovers, ensure_tree_repo, move_branch, on_branch_at, refuse_to_lose_work
from sglpatch.series.lock import check_entry, compare_entry, unchecked_verdicts
from sglpatch.series.patches import PatchFile, Series
from sglpatch.sources.pins import Pin
from sglpatch.sources.pristine_tree import Pristine
from sglpatch.witnesses import agreement, answer_cache, registry
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult
from sglpatch.witnesses.upstream_test import UpstreamTestWitness, release_written_for

RESULTS_DIR = "sglpatch-results"

# The line every outcome carries when the user ran with --allow-unavailable and a witness could
# not run: the patch was applied on text alone and nothing proved it needed or working.
UNPROVEN = "UNPROVEN (--allow-unavailable): witness could not run"


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
    tests_before: str = ""  # the patch's regression tests (upstream-test), where they ran beside its witness
    tests_after: str = ""
    reverse_applies: bool = False  # the pin already holds exactly this change
    unproven: str = ""  # with --allow-unavailable: why the witness could not prove this outcome
    # "<tree>: <witness>" -> where its answer was replayed from (a kept answer, not a run), for
    # every printer to say so; empty where every answer ran for this result.
    replayed: dict = field(default_factory=dict)

    def witness_record(self) -> dict:
        """For the lock entry: what the witness answered, with the level it ran at, on the
        pristine and the patched tree (nothing where no witness ran). How a result was proved,
        not what it is: ``lock`` compares entries without it."""
        if not self.witness_before:
            return {}
        record = {"witness": {"pristine": self.witness_before, "patched": self.witness_after or "-"}}
        if self.tests_before:
            record["tests"] = {"pristine": self.tests_before, "patched": self.tests_after or "-"}
        return record


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
    # Classified by text alone: the lock's verdicts that only a witness gives, left unchecked
    # (the trees and commits being the lock's), one per patch whose status differs.
    unchecked: list[str] = field(default_factory=list)
    # Where the whole result was replayed from (apply's own kept result of the same inputs); empty
    # where it was made now.
    replayed: str = ""

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
    pins: tuple[Pin, ...] = (),
) -> PinResult:
    """Apply ``series`` to ``pin``; on any failure the pin's tree is left as it was.

    A rendition that does not apply exactly gets git's three-way apply, its pre-image blobs read
    from the pristine tree of another of ``pins`` it covers (``applied-three-way``).

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
            clear_leftovers(tree_path)
            check_clean(tree_path)
            _build(tree_path, pin, series, pristine, result, run_witnesses, allow_unavailable, pins)
            if any(outcome.status in FAILURES for outcome in result.patches):
                result.error = "; ".join(
                    f"{o.name}: {o.status}" for o in result.patches if o.status in FAILURES
                )
                return result
            key = pin.version if pristine.source == "index" else f"{pin.version}@{pristine.source}"
            unchecked = None if run_witnesses else unchecked_verdicts(lock_path, key, result.lock_entry(pin.sha256))
            if unchecked is not None:
                # What text alone decided is the lock's; the witnesses' verdicts (and their records)
                # stand as locked, even with --update-lock: text alone has nothing to add.
                result.lock, result.unchecked = "matches", unchecked
                if record:
                    at = on_branch_at(tree_path, result.commit)
                    if not discard_local and not at:
                        refuse_to_lose_work(tree_path, result.commit)
                    move_branch(tree_path, result.commit, at)
                result.ok = True
                return result
            if not record:
                check = compare_entry(lock_path, key, result.lock_entry(pin.sha256))
                result.lock = check.state
                result.ok = check.state != "mismatch"
                if not result.ok:
                    result.error = f"{lock_path}: result for {key} differs from the lock ({check.difference})"
                return result
            at = on_branch_at(tree_path, result.commit)
            if not discard_local and not at:
                refuse_to_lose_work(tree_path, result.commit)
            check = check_entry(lock_path, key, result.lock_entry(pin.sha256), update_lock)
            result.lock = check.state
            if check.state == "mismatch":
                result.error = (
                    f"{lock_path}: result for {key} differs from the lock ({check.difference}); "
                    "run with --update-lock to accept it"
                )
                return result
            move_branch(tree_path, result.commit, at)
            result.ok = True
        except SglpatchError as exc:
            result.error = str(exc)
    return result


# -- building the commits -----------------------------------------------------------------------


def _inputs_key(
    pin: Pin, pristine: Pristine, renditions: list[tuple[str, PatchFile | None]], run_witnesses: bool,
    pins: tuple[Pin, ...], checks: dict[str, list] | None = None, case_maps: bytes = b"",
) -> str:
    """What an apply result depends on: the pristine commit, every rendition's bytes and the pins
    whose trees its three-way apply could read, git's version, and with witnesses each witness's
    fingerprint for the pin (its code, environment and toolchain; a patch's tests' bytes)."""
    witnesses = {w.name: w for w in registry.registry().values()}
    witnesses.update({w.name: w for ws in (checks or {}).values() for w in ws})
    prints = sorted(f"{w.name}-{answer_cache.fingerprint(w, pin)}" for w in witnesses.values()) if run_witnesses else []
    # 7: refusals of tests that do not find the bug where the fix was written or disagree with the
    # patch's witness (their cases.toml in the key); replay marks in the outcomes.
    digest = hashlib.sha256(f"sglpatch-apply-7\0{pristine.commit}\0{gitcmd.version()}\0{prints}\0".encode())
    digest.update(case_maps + b"\0")
    for name, rendition in renditions:
        digest.update(name.encode() + b"\0" + (rendition.raw if rendition else b"-") + b"\0")
        if rendition is not None:
            bases = sorted(f"{p.version}={p.sha256}" for p in pins if p.version != pin.version and rendition.covers(p.version))
            digest.update(" ".join(bases).encode() + b"\0")
    return digest.hexdigest()


def _build(
    tree_path: Path,
    pin: Pin,
    series: Series,
    pristine: Pristine,
    result: PinResult,
    run_witnesses: bool,
    allow_unavailable: bool,
    pins: tuple[Pin, ...] = (),
) -> None:
    selected = [(patch.name, patch.for_version(pin.version)) for patch in series.patches]
    checks = {
        patch.name: registry.witnesses_for(patch, rendition)
        for patch, (_, rendition) in zip(series.patches, selected)
        if rendition is not None and run_witnesses
    }
    rules = {patch.name: (release_written_for(rendition, pins or (pin,)), agreement.read_case_map(series.directory, patch.stem))
             for patch, (_, rendition) in zip(series.patches, selected) if patch.name in checks}
    case_maps = b"".join(rule[1].path.read_bytes() for rule in rules.values() if rule[1] is not None)
    key = _inputs_key(pin, pristine, selected, run_witnesses, pins, checks, case_maps)
    memo = tree_path / ".git" / RESULTS_DIR / f"{key}.json"
    if memo.exists():
        saved = json.loads(memo.read_text())
        commit_ok = run_git(["cat-file", "-e", f"{saved['commit']}^{{commit}}"], tree_path, check=False)
        if commit_ok.returncode == 0:
            result.commit, result.tree = saved["commit"], saved["tree"]
            result.patches = [PatchOutcome(**outcome) for outcome in saved["patches"]]
            result.replayed = f"apply's result kept {saved.get('stored', '?')} ({memo.relative_to(tree_path)})"
            for outcome in result.patches:
                if outcome.witness_before:
                    outcome.replayed = {"every tree": result.replayed}
            return
    for name, rendition in selected:
        if rendition is not None:
            problems = patch_problems(rendition, series.directory.parent)
            if problems:
                raise SglpatchError("; ".join(str(problem) for problem in problems))
    for patch in series.patches:
        tests = [w for w in checks.get(patch.name, ()) if isinstance(w, UpstreamTestWitness)]
        problems = tests_problems(series.directory, patch.stem, tests[0].tests, len(checks[patch.name]) > 1) if tests else []
        if problems:
            raise SglpatchError("; ".join(str(problem) for problem in problems))
    _apply_all(tree_path, pin, pristine, selected, result, checks, allow_unavailable, pins, rules)
    # An unavailable witness may be available next time; only settled answers are remembered.
    settled = not any(o.unproven for o in result.patches)
    if settled and not any(outcome.status in FAILURES for outcome in result.patches):
        kept = [{**asdict(o), "replayed": {}} for o in result.patches]
        cache.write_atomically(memo, json.dumps({"commit": result.commit, "tree": result.tree, "patches": kept,
                                                 "stored": time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime())}))


def _apply_all(
    tree_path: Path,
    pin: Pin,
    pristine: Pristine,
    selected: list[tuple[str, PatchFile | None]],
    result: PinResult,
    checks: dict[str, list],
    allow_unavailable: bool = False,
    pins: tuple[Pin, ...] = (),
    rules: dict[str, tuple] | None = None,
) -> None:
    """``checks``: each patch's witnesses (``registry.witnesses_for``), its own first; every one
    must find the bug on the pristine tree or the patch is not needed, and pass on the patched.
    ``rules``: each patch's (release its fix was written for, ``cases.toml``): a patch whose tests
    pass on the pristine release they were written for, or disagree with its witness on a tree, is
    refused (``agreement.refusals``)."""
    checks = {name: witnesses for name, witnesses in checks.items() if witnesses}
    rules = rules or {}
    with Checkouts(tree_path) as checkouts:
        pristine_tree = _tree_of(tree_path, pristine.commit)
        answers = _witnessed(
            [w for ws in checks.values() for w in ws], pristine_tree, pin, "pristine",
            lambda: checkouts.get(pristine.commit),
        )
        before = {name: agreement.together([answers[w.name] for w in ws]) for name, ws in checks.items()}
        refused = {name: agreement.refusals(ws, answers, "pristine", pin.version, *rules.get(name, (None, None)))
                   for name, ws in checks.items()}
        _apply_commits(tree_path, pin, pristine, selected, result, before, allow_unavailable, pins,
                       {name: "; ".join(reasons) for name, reasons in refused.items() if reasons})
        for outcome in result.patches:
            _mark_replays(outcome, checks.get(outcome.name, ()), answers, "pristine")
            if outcome.witness_before and len(checks.get(outcome.name, ())) > 1:
                first, tests = checks[outcome.name][0], checks[outcome.name][1]
                outcome.witness_before = answers[first.name].summary()
                outcome.tests_before = answers[tests.name].summary()
        to_confirm = [
            outcome for outcome in result.patches
            if outcome.name in checks and outcome.status not in (Outcome.NOT_NEEDED, Outcome.NOT_APPLICABLE, *FAILURES)
        ]
        answers = _witnessed(
            [w for o in to_confirm for w in checks[o.name]], result.tree, pin, "patched",
            lambda: checkouts.get(result.commit),
        )
        for outcome in to_confirm:
            witnesses = checks[outcome.name]
            _mark_replays(outcome, witnesses, answers, "patched")
            outcome.witness_after = answers[witnesses[0].name].summary()
            if len(witnesses) > 1:
                outcome.tests_after = answers[witnesses[1].name].summary()
            reasons = agreement.refusals(witnesses, answers, "patched", pin.version, *rules.get(outcome.name, (None, None)))
            if reasons:
                outcome.status, outcome.detail = Outcome.WITNESS_REFUSED, "; ".join(reasons)
                continue
            for witness in witnesses:
                after = answers[witness.name]
                if after.state == BUG:
                    outcome.status = Outcome.WITNESS_FAILED
                    outcome.detail = f"witness {witness.name} still finds the bug after the series: {after.detail}"
                    break
                if after.state == UNAVAILABLE:
                    _unavailable(outcome, f"witness {witness.name} could not run on the patched tree: {after.detail}",
                                 allow_unavailable)
                    if not allow_unavailable:
                        break


def _mark_replays(outcome: PatchOutcome, witnesses, answers: dict[str, WitnessResult], tree: str) -> None:
    for witness in witnesses:
        answer = answers.get(witness.name)
        if answer is not None and answer.replayed:
            outcome.replayed[f"{tree}: {witness.name}"] = answer.replayed


def _apply_commits(
    tree_path: Path,
    pin: Pin,
    pristine: Pristine,
    selected: list[tuple[str, PatchFile | None]],
    result: PinResult,
    before: dict[str, WitnessResult],
    allow_unavailable: bool = False,
    pins: tuple[Pin, ...] = (),
    refused: dict[str, str] | None = None,
) -> None:
    """One commit per patch; ``refused``: the patches whose witnesses cannot stand on the pristine
    tree, with why: not applied, and failing the pin."""
    refused = refused or {}
    git_dir = tree_path / ".git"
    fd, index_name = tempfile.mkstemp(dir=git_dir, prefix="sglpatch-index-")
    os.close(fd)
    os.unlink(index_name)
    env = {"GIT_INDEX_FILE": index_name}
    try:
        run_git(["read-tree", pristine.commit], tree_path, env=env)
        modes = tree_modes(tree_path, pristine.commit)
        parent = pristine.commit
        for name, rendition in selected:
            if rendition is None:
                result.patches.append(PatchOutcome(name, Outcome.NOT_APPLICABLE, detail=f"no rendition for {pin.version}"))
                continue
            witnessed = before.get(name)
            if name in refused:
                result.patches.append(PatchOutcome(name, Outcome.WITNESS_REFUSED, rendition=str(rendition.path),
                                                   detail=refused[name], witness_before=witnessed.summary()))
                continue
            if witnessed is not None and witnessed.state == CLEAN:
                same = reverse_applies(tree_path, env, rendition.diff_text)
                # Whether upstream fixed it, or the bug is not in this release at all, one release
                # cannot tell: the Upstream-Status suggestions weigh the releases together.
                how = "the patch reverse-applies: upstream has this change" if same else "the patch does not reverse-apply"
                result.patches.append(
                    PatchOutcome(
                        name,
                        Outcome.NOT_NEEDED,
                        rendition=str(rendition.path),
                        detail=f"not needed here: witness {witnessed.witness} passes on the pristine tree; {how}",
                        needed=False,
                        witness_before=witnessed.summary(),
                        reverse_applies=same,
                    )
                )
                continue
            outcome = _apply_one(tree_path, env, modes, name, rendition, parent, made_on(rendition, pins, pin.version))
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
                modes = tree_modes(tree_path, parent)
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
        answers = answer_cache.run_cached_many(checks, tree_hash, pin, materialize)
        shown.outcome = "; ".join(f"{name} {result.summary()}" for name, result in answers.items())
    return answers


def _unavailable(outcome: PatchOutcome, reason: str, allowed: bool) -> None:
    """A witness that could not run: a failure of the pin, or with ``allowed`` an unproven outcome
    that says so on its line. Either way it is never remembered as settled."""
    if allowed:
        outcome.unproven = reason
        outcome.detail = (outcome.detail + "\n" if outcome.detail else "") + f"{UNPROVEN}: {reason}"
        return
    outcome.status = Outcome.WITNESS_UNAVAILABLE
    outcome.detail = reason + " (--allow-unavailable applies it unproven)"


def _tree_of(tree_path: Path, commit: str) -> str:
    return git_out(["rev-parse", f"{commit}^{{tree}}"], tree_path)


def _apply_one(
    tree_path: Path,
    env: dict[str, str],
    modes: dict[str, str],
    name: str,
    rendition: PatchFile,
    parent: str,
    bases=(),
) -> PatchOutcome:
    """Exactly (at an offset where git finds one), else -- unless the tree already holds it or lacks
    a file it changes -- by git's three-way apply from ``bases`` (see ``three_way_to_index``)."""
    where = display_name(rendition)
    outcome = PatchOutcome(name=name, status="", rendition=str(rendition.path))
    patch_set = diffs.parse_diff(rendition)
    existing, created = diffs.touched_paths(patch_set)
    for path in existing + created:
        link = _through_link(path, modes)
        if link:
            raise SglpatchError(f"{where}: {path} goes through the symbolic link {link} in the tree; refused")
    missing = [path for path in existing if path not in modes]
    exact = check_exact(tree_path, env, rendition.diff_text)
    if exact.applies and not missing:
        tree = apply_to_index(tree_path, env, rendition.diff_text)
        outcome.commit = commit_patch(tree_path, rendition, tree, parent)
        outcome.status = Outcome.APPLIED_WITH_OFFSET if exact.offsets else Outcome.APPLIED
        outcome.detail = exact.offsets
        return outcome
    if reverse_applies(tree_path, env, rendition.diff_text):
        outcome.status = Outcome.ALREADY_UPSTREAM
        outcome.reverse_applies = True
        outcome.detail = "the patch reverse-applies: upstream already has it"
        return outcome
    if missing:
        outcome.status = Outcome.MISSING_FILE
        outcome.detail = f"{where}: not in the tree: {', '.join(missing)}"
        return outcome
    merged = three_way_to_index(tree_path, env, rendition.diff_text, bases)
    if merged.tree:
        outcome.commit = commit_patch(tree_path, rendition, merged.tree, parent)
        outcome.status = Outcome.APPLIED_THREE_WAY
        outcome.detail = f"three-way from the blobs it was made on (lent by {merged.lent_by}'s pristine tree)"
        return outcome
    outcome.status = Outcome.CONFLICT
    outcome.detail = conflict_detail(where, patch_set, exact.stderr) + f"\n{where}: three-way: {merged.detail}"
    return outcome


def _through_link(path: str, modes: dict[str, str]) -> str | None:
    parts = path.split("/")
    for depth in range(1, len(parts)):
        prefix = "/".join(parts[:depth])
        if modes.get(prefix) == "120000":
            return prefix
    return None
