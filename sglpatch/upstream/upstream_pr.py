"""Preparing one patch as upstream pull requests: per pull request a commit on the base (the
patch's regression tests added), its branch, the mbox, and the title and body in sglang's template
(``upstream_body``); one pull request per ``PR-Split`` part (``upstream_split``); the pre-commit
hooks on what each adds: the clone's own ``.pre-commit-config.yaml`` with the real pre-commit
(``upstream_precommit``), else sglang's pinned formatters (``upstream_hooks``); the commit and
branch themselves in ``upstream_commit``.

The base is a pin (default: the newest; its files have no upstream history, so the mbox is meant
for ``git am`` on a clone) or a ref in the user's clone of sglang, onto which the patch is ported
with ``rebase``'s cascade and judge. Each pull request shows its own regression test's command and
what that command printed, run as shown in the release's CPU Python on the base and on its commit
(``upstream_plain_run``), and beside it the in-process run on the emulated box (the
``upstream-test`` witness bound to that part's files) that the export judges by: failing on the
base, passing on its commit. The export refuses, with the reason, a message without its
``Related:`` paragraph, a test that passes without the change or fails with it (in either run),
and any check that could not run; a patch that is already upstream there (it reverse-applies) or
not needed there (its check passes on the base) is nothing to send (``NothingToSend``). It leaves
no branch or file when it refuses.
"""

from __future__ import annotations

import json
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

from sglpatch.apply.checkouts import checkout_commit
from sglpatch.apply.index_apply import (
    add_tests_to_index,
    apply_to_index,
    check_exact,
    made_on,
    preimage_paths,
    reverse_applies,
    three_way_to_index,
)
from sglpatch.apply.outcomes import Outcome
from sglpatch.apply.tree_repo import ensure_tree_repo
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import git_out, run_git
from sglpatch.rebase.hand_port import prepare_hand_port
from sglpatch.rebase.patch import Writes, rebase_patch
from sglpatch.rebase.trial import Trial
from sglpatch.series.patches import PatchFile, SeriesPatch
from sglpatch.sources import pristine_tree
from sglpatch.upstream import upstream_body, upstream_hooks, upstream_plain_run, upstream_precommit, upstream_split
from sglpatch.upstream.upstream_commit import (
    BRANCH_PREFIX,
    branch_name,
    commit_tree,
    message_without_trailers,
    set_branch,
    upstream_commit,
)
from sglpatch.witnesses import answer_cache, registry
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult
from sglpatch.witnesses.upstream_test import UpstreamTestWitness


class NothingToSend(SglpatchError):
    """The base already has the change, or does not need it: no pull request to make (not a failure)."""


@dataclass(frozen=True)
class Export:
    branch: str
    repo: Path
    commit: str
    mbox: Path
    body: Path
    title: str
    part: str = ""
    tests: tuple[str, ...] = ()
    hooks: str = ""  # what the pre-commit hooks said, one line
    base_commit: str = ""
    notes: tuple[str, ...] = field(default=())  # for the person running the export, not the body


def export(
    project,
    patch_name: str,
    base: str | None = None,
    base_repo: Path | None = None,
    out: Path | None = None,
    range_diff: str = "",
    signoff: bool = False,
    part: str | None = None,
    hooks: bool = True,
):
    """The patch as upstream will see it: one clean commit per pull request on ``base`` (one, or
    one per ``PR-Split`` trailer, ``part`` picking one), each on its own branch, with the patch's
    regression tests (``patches/tests/<stem>/``) added, its mbox and ``PR.md`` in sglang's template.

    On a pin the change applies as ``apply`` applies it; on a ref of the user's clone
    (``base_repo``) it is ported with ``rebase``'s cascade and judge, and where none is accepted
    the export is refused with the hand-port tree. The pre-commit hooks (``hooks``) run on what
    each commit adds; a finding refuses the export. Returns the exports, in part order; a refused
    export leaves no branch and no file."""
    series = project.series()
    patch = series.get(patch_name)
    pins = project.pins()
    with tempfile.TemporaryDirectory() as scratch:
        if base_repo is None:
            pin = pins.select([base])[0] if base else pins.newest
            pristine = pristine_tree.pristine_from_index(pin)
            repo = project.build_dir / "trees" / pin.version
            repo.parent.mkdir(parents=True, exist_ok=True)
            ensure_tree_repo(repo, pristine)
            base_commit, label = pristine.commit, f"sglang {pin.version}"
            rendition = _rendition(patch, pin.version, repo, base_commit)
        else:
            repo = Path(base_repo)
            base_commit = git_out(["rev-parse", "--verify", f"{base or 'HEAD'}^{{commit}}"], repo)
            # A git base has no pin; the newest pin's metadata (e.g. the tvm-ffi version a witness
            # compiles against) is the closest description of a current checkout.
            pin, label = pins.newest, f"{base or 'HEAD'} ({base_commit[:12]}) of {repo}"
            rendition = _rendition(patch, None, repo, base_commit)
        message = message_without_trailers(rendition)
        parts = upstream_split.pr_parts(patch.name, rendition.subject, message, rendition.trailers,
                                        preimage_or_new_paths(rendition.diff_text), [t.path for t in patch.tests])
        chosen = upstream_split.select_parts(patch.name, parts, part)
        checks = registry.witnesses_for(patch, rendition)
        if base_repo is None:
            tree = _apply_on_pin(patch, rendition, repo, base_commit, pins, pin.version, label)
        else:
            tree = port_onto_ref(project, patch, repo, base_commit, pin, label, Path(scratch))
        for one in chosen:
            upstream_body.require_related(patch.name + (f" ({one.name})" if one.name else ""), one.text)
        tested = _Checks(patch.name, label, repo, base_commit, pin, Path(scratch))
        # The patch's own witness (where it has one besides its tests) is a further check on the
        # whole change: needed on the base, gone with the change.
        own = next((w for w in checks if not isinstance(w, UpstreamTestWitness)), None)
        own_run = tested.fails_then_passes(own, commit_tree(repo, tree, base_commit, "whole change")) if own else None
        regression = next((w for w in checks if isinstance(w, UpstreamTestWitness)), None)
        matrix, matrix_note = _matrix_results(project, patch.name)
        planned = []
        for one in chosen:
            files = [p for p in changed_paths(repo, base_commit, tree) if one.carries(p)]
            own_tests = [t for t in patch.tests if one.carries(t.path)]
            part_tree = _part_tree(repo, base_commit, tree, files, own_tests, Path(scratch) / f"index-{one.name or 'all'}")
            text = one.text if one.name else message
            commit = upstream_commit(repo, rendition, part_tree, base_commit, signoff=signoff, title=one.title, text=text)
            branch = branch_name(patch.stem, one.name)
            findings, said, hooks_line = _hooks(repo, base_commit, commit, branch, base_repo is not None) if hooks else (
                [], None, "not run")
            if findings:
                raise SglpatchError(
                    f"{patch.name}{' ' + one.name if one.name else ''}: the pre-commit hooks refuse it "
                    f"({len(findings)} finding(s)):\n" + "\n".join(str(f) for f in findings)
                )
            others = [p.title for p in parts if p is not one]
            run = _shown_run(tested, regression, own_tests, own, own_run, commit, others)
            # The releases' table comes from ``apply``, which runs the whole patch: say so for a part.
            title = (f"The check on released sglang versions, run on the whole change (this pull request together "
                     f"with {'; '.join(others)}), without / with it:") if others else upstream_body.MATRIX_TITLE
            body = upstream_body.render_body(text, files=[f for f in files if f not in {t.path for t in own_tests}],
                                             tests=[t.path for t in own_tests], run=run, matrix=matrix, hooks=said,
                                             matrix_title=title)
            if range_diff:
                body += f"\n## Changes since the previous version of this series\n\n```\n{range_diff.rstrip()}\n```\n"
            notes = tuple(n for n in (matrix_note, _replays(run)) if n)
            planned.append((one, branch, [t.path for t in own_tests], commit, body, hooks_line, notes))
    exports = []
    for one, branch, own_tests, commit, body, hooks_line, notes in planned:
        set_branch(repo, branch, commit)
        folder = (out or project.build_dir / "upstream") / branch.removeprefix(BRANCH_PREFIX)
        folder.mkdir(parents=True, exist_ok=True)
        mbox = folder / f"{folder.name}.mbox"
        mbox.write_bytes(run_git(["format-patch", "-1", "--stdout", commit], repo).stdout)
        body_path = folder / "PR.md"
        body_path.write_text(body)
        (folder / "TITLE").write_text(one.title + "\n")
        exports.append(Export(branch=branch, repo=repo, commit=commit, mbox=mbox, body=body_path, title=one.title,
                              part=one.name, tests=tuple(own_tests), hooks=hooks_line, base_commit=base_commit,
                              notes=notes))
    return exports


def _hooks(repo: Path, base_commit: str, commit: str, branch: str, clone: bool):
    """The findings on what ``commit`` adds, what the body says of the hooks, and the console's
    line: the clone's own config with pre-commit where the base is a clone that has one, else
    the formatters at the versions sglang's config pins (the body says which)."""
    targets = upstream_hooks.changed_lines(repo, base_commit, commit)
    has_config = clone and not run_git(["cat-file", "-e", f"{commit}:{upstream_precommit.CONFIG_NAME}"], repo,
                                       check=False).returncode
    if has_config:
        ran = upstream_precommit.run_clone_hooks(repo, base_commit, commit, branch, targets)
        return ran.findings, upstream_body.HooksSaid(ran.said, ran.complete), ran.console
    findings = upstream_hooks.run_hooks(repo, base_commit, commit)
    why = f"the base has no `{upstream_precommit.CONFIG_NAME}`" if clone else "no clone of the repository was given"
    said = (f"isort, black, codespell and clang-format at the versions sglang's `{upstream_precommit.CONFIG_NAME}` "
            f"names, on the lines this PR changes; its other hooks not run: {why}")
    return findings, upstream_body.HooksSaid(said, complete=False), "clean (isort, black, codespell, clang-format " \
        f"at sglang's pinned versions; the config's other hooks not run: {why.replace('`', '')})"


def _replays(run) -> str:
    """A line for the console where the body shows results that were not run again."""
    if run is None:
        return ""
    stored = [r for r in (run.before, run.after, *run.plain_before, *run.plain_after) if r is not None and r.replayed]
    return f"{len(stored)} of the results shown were replayed from stored runs (marked so in the body)" if stored else ""


@dataclass
class _Checks:
    """Runs a check on the base and on a commit of the export, and refuses what cannot go upstream:
    a change its check says is not needed on the base, one its check still finds with the change,
    and one whose check could not run (a pull request must say how it was tested)."""

    patch: str
    label: str
    repo: Path
    base_commit: str
    pin: object
    scratch: Path

    def on(self, check, commit: str) -> WitnessResult:
        """``check``'s answer on ``commit`` (remembered by tree, as ``rebase`` remembers it)."""
        tree = git_out(["rev-parse", f"{commit}^{{tree}}"], self.repo)
        dest = Path(tempfile.mkdtemp(dir=self.scratch, prefix="checkout-"))
        return answer_cache.run_cached(check, tree, self.pin, lambda: checkout_commit(self.repo, commit, dest))

    def fails_then_passes(self, check, commit: str, what: str = "") -> tuple[WitnessResult, WitnessResult]:
        """``check`` on the base (must find the bug) and on ``commit`` (must pass)."""
        name = what or f"witness {check.name}"
        before = self.on(check, self.base_commit)
        if before.state == CLEAN and what:
            raise SglpatchError(f"{self.patch}: {name} passes without the change at {self.label} ({before.detail}), "
                                "so it shows no bug there; a pull request's test must fail before it")
        if before.state == CLEAN:
            raise NothingToSend(f"{self.patch}: not needed at {self.label}: {name} already passes there ({before.detail}); "
                                "nothing to send")
        self._ran(name, before)
        after = self.on(check, commit)
        if after.state == BUG:
            raise SglpatchError(f"{self.patch}: {name} still fails with the change at {self.label}: {after.detail}")
        self._ran(name, after)
        return before, after

    def plain_runs(self, tests, commit: str) -> tuple[tuple, tuple]:
        """Each test file's command, ``python3 PATH``, run as shown in the release's CPU Python on
        the base with the test files added and on ``commit``; refused where the command ran the
        tests and they passed without the change or failed with it."""
        try:
            interpreter = upstream_plain_run.release_interpreter(self.pin)
        except SglpatchError as exc:
            raise SglpatchError(f"{self.patch}: the release's CPU Python cannot be had ({exc}); a pull request must "
                                "say how it was tested, so nothing was exported") from None
        index = Path(tempfile.mkdtemp(dir=self.scratch, prefix="index-")) / "index"
        with_tests = _part_tree(self.repo, self.base_commit, commit, [], tests, index)
        base = commit_tree(self.repo, with_tests, self.base_commit, "the tests alone")
        paths = [t.path for t in tests if t.path.endswith(".py")]
        before = tuple(upstream_plain_run.run_tests(self.repo, base, paths, interpreter, self.scratch))
        after = tuple(upstream_plain_run.run_tests(self.repo, commit, paths, interpreter, self.scratch))
        for run in before:
            if run.passed:
                raise SglpatchError(f"{self.patch}: its regression test, run as `{run.command}`, passes without the "
                                    f"change at {self.label}; a pull request's test must fail before it")
        for run in after:
            if run.ran_tests and not run.passed:
                last = (run.last_lines(1)[0] or [""])[-1]
                raise SglpatchError(f"{self.patch}: its regression test, run as `{run.command}`, fails with the change "
                                    f"at {self.label}: {last}")
        return before, after

    def _ran(self, name: str, result: WitnessResult) -> None:
        if result.state == UNAVAILABLE:
            raise SglpatchError(
                f"{self.patch}: {name} could not run at {self.label} ({result.detail}); "
                "a pull request must say how it was tested, so nothing was exported"
            )


def _shown_run(tested: _Checks, regression, tests, own, own_run, commit: str, others: list[str]):
    """What the pull request shows as its test: its own regression test files run without the
    change and with this pull request's commit (the ``upstream-test`` check bound to just those
    files); without a test file, the patch's own check on the whole change, said so."""
    if regression is not None and tests:
        check = type(regression)(regression.stem, tuple(tests))
        names = ", ".join(Path(t.path).name for t in tests)
        before, after = tested.fails_then_passes(check, commit, f"its regression test ({names})")
        plain_before, plain_after = tested.plain_runs(tests, commit)
        return upstream_body.TestRun("\n".join(f"python3 {t.path}" for t in tests if t.path.endswith(".py")),
                                     before, after, plain_before=plain_before, plain_after=plain_after)
    if own_run is None:
        return None
    before, after = own_run
    scope = ("The test ran with the whole change applied, this pull request and: " + "; ".join(others)) if others else ""
    return upstream_body.TestRun(f"# no unit test in this pull request yet; the check that ran: {before.summary()}",
                                 before, after, scope)


def _apply_on_pin(patch, rendition: PatchFile, repo: Path, base_commit: str, pins, version: str, label: str) -> str:
    """The tree of the rendition on a pin, exactly or by git's three-way apply as ``apply`` does."""
    with tempfile.TemporaryDirectory() as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        run_git(["read-tree", base_commit], repo, env=env)
        exact = check_exact(repo, env, rendition.diff_text)
        if not exact.applies and reverse_applies(repo, env, rendition.diff_text):
            raise NothingToSend(f"{patch.name}: already upstream at {label} (the patch reverse-applies); nothing to send")
        if exact.applies:
            return apply_to_index(repo, env, rendition.diff_text)
        merged = three_way_to_index(repo, env, rendition.diff_text, made_on(rendition, pins.pins, version))
        if not merged.tree:
            raise SglpatchError(f"{patch.name}: does not apply to {label}, exactly or three-way ({merged.detail}); "
                                "rebase it first (nox -s rebase)")
        return merged.tree


def port_onto_ref(project, patch: SeriesPatch, repo: Path, base_commit: str, pin, label: str, scratch: Path) -> str:
    """The patch's tree on a ref of the user's clone, by ``rebase``'s cascade and judge (every
    rendition as it is, then the merge tools, each proposal judged: names, the witness, imports);
    refused with the reason where upstream already has it, and with the hand-port tree where no
    proposal is accepted."""
    ref = SimpleNamespace(repo=repo, commit=base_commit)
    trial = Trial(scratch, pin, ref)
    outcome = rebase_patch(project, trial, patch, project.pins().pins, pin.version, Writes())
    if outcome.verdict in (Outcome.CARRIES_OVER, Outcome.NEW_RENDITION):
        tree = git_out(["rev-parse", f"{trial.parent}^{{tree}}"], trial.repo)
        # The trial's objects live in its scratch clone; the user's clone needs them for the branch.
        run_git(["update-ref", "refs/heads/sglpatch-port", trial.parent], trial.repo)
        run_git(["fetch", "--quiet", "--no-tags", "--no-write-fetch-head", str(trial.repo), "refs/heads/sglpatch-port"], repo)
        return tree
    if outcome.verdict == Outcome.ALREADY_UPSTREAM:
        raise NothingToSend(f"{patch.name}: already upstream at {label} ({outcome.detail}); nothing to send")
    if outcome.verdict == Outcome.FIXED_UPSTREAM:
        raise NothingToSend(f"{patch.name}: not needed at {label}: witness {outcome.witness} already passes there "
                            f"({outcome.witness_before}); {outcome.detail}; nothing to send")
    if outcome.verdict == Outcome.WITNESS_UNAVAILABLE:
        raise SglpatchError(f"{patch.name}: the witness could not run at {label} ({outcome.detail}); "
                            "a pull request must say how it was tested, so nothing was exported")
    if outcome.verdict == Outcome.NEEDS_HAND_PORT and outcome.conflict:
        prepared = prepare_hand_port(project, trial, f"upstream-{patch.stem}", [outcome])
        raise SglpatchError(f"{patch.name}: no port onto {label} is accepted ({outcome.detail}); "
                            f"finish it by hand in {prepared}")
    raise SglpatchError(f"{patch.name}: cannot be ported onto {label}: {outcome.verdict}: {outcome.detail}")


def changed_paths(repo: Path, base: str, tree: str) -> list[str]:
    return [p for p in git_out(["diff", "--name-only", "--no-renames", base, tree], repo).splitlines() if p]


def preimage_or_new_paths(diff_text: str) -> list[str]:
    return re.findall(r"(?m)^diff --git a/\S+ b/(\S+)$", diff_text)


def _part_tree(repo: Path, base: str, whole: str, files: list[str], tests, index: Path) -> str:
    """``base`` with ``files`` as the whole change has them and ``tests`` (``series.RegressionTest``)
    added at their upstream paths."""
    env = {"GIT_INDEX_FILE": str(index)}
    run_git(["read-tree", base], repo, env=env)
    for path in files:
        entry = git_out(["ls-tree", whole, "--", path], repo)
        if entry:
            mode, _, rest = entry.partition(" ")
            sha = rest.split("\t", 1)[0].split()[-1]
            run_git(["update-index", "--add", "--cacheinfo", f"{mode},{sha},{path}"], repo, env=env)
        else:
            run_git(["update-index", "--force-remove", "--", path], repo, env=env)
    return add_tests_to_index(repo, env, tests)


def _rendition(patch: SeriesPatch, version: str | None, repo: Path, base_commit: str) -> PatchFile:
    """The pin's rendition; on a git base, the first rendition whose files exist there."""
    if version is not None:
        rendition = patch.for_version(version)
        if rendition is None:
            raise SglpatchError(f"{patch.name}: no rendition applies to {version}")
        return rendition
    files = set(git_out(["ls-tree", "-r", "--name-only", base_commit], repo).splitlines())
    for rendition in patch.renditions:
        paths = preimage_paths(rendition.diff_text)
        if paths and all(path in files for path in paths):
            return rendition
    return patch.main


def _matrix_results(project, name: str) -> tuple[list[str], str]:
    """The releases' table rows from the last ``apply`` (``build/apply-report.json``) where it
    applied this very series (its digest), and a note for the console where it is left out."""
    report = project.build_dir / "apply-report.json"
    if not report.exists():
        return [], "the table of released versions is left out: no build/apply-report.json (run sglpatch apply)"
    try:
        recorded = json.loads(report.read_text())
        digest, pins = recorded["series"]["digest"], recorded["pins"]
    except (ValueError, KeyError, TypeError):
        return [], "the table of released versions is left out: build/apply-report.json cannot be read"
    if digest != project.series().digest():
        return [], ("the table of released versions is left out: build/apply-report.json is from another state of "
                    "the series (run sglpatch apply to make one of this state)")
    found = [(pin["version"], outcome) for pin in pins for outcome in pin["patches"] if outcome["name"] == name]
    # The same check as the body shows: the regression test where the last apply ran it.
    key = "tests" if any(outcome.get("tests_before") for _, outcome in found) else "witness"
    lines = []
    for version, outcome in found:
        before, after = outcome.get(f"{key}_before"), outcome.get(f"{key}_after")
        if before or after:
            lines.append(f"| {version} | {before or '-'} | {after or '-'} |")
    return lines, ""
