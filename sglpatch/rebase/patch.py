"""One patch of the series on the release, through the cascade (see ``sglpatch.rebase``): the
witness on the pristine release, then every rendition as it is, then the merge tools on the nearest
renditions with a pinned tree, each proposal judged; the first accepted is taken, and what the
verdict asks to be written (renditions, grown or narrowed ``Applies-To``) is recorded."""

from __future__ import annotations

import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from sglpatch.apply.checkouts import checkout_commit
from sglpatch.apply.outcomes import Outcome
from sglpatch.plumbing.gitcmd import git_out
from sglpatch.rebase import merge_tools, moved_definitions
from sglpatch.rebase.report import Attempt, RebaseOutcome
from sglpatch.rebase.trial import Trial, candidates
from sglpatch.series.patches import RENDITIONS_DIR, PatchFile, SeriesPatch, set_trailers, spec_for
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import answer_cache, registry
from sglpatch.witnesses.results import CLEAN, UNAVAILABLE

# The renditions (nearest first) the merge tools are tried with; farther ones rarely merge better.
MERGE_CANDIDATES = 3


@dataclass
class Writes:
    """What a classified patch asks to be written: rendition files and their new text (None: the
    file goes, its text having moved to the main file)."""

    files: dict[Path, str | None] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _newest(version: str, pins: tuple[Pin, ...]) -> bool:
    return all(Version(version) > Version(pin.version) for pin in pins if pin.version != version)


def rebase_patch(project, trial: Trial, patch: SeriesPatch, pins: tuple[Pin, ...], version: str, writes: Writes) -> RebaseOutcome:
    """``patch`` on the release in ``trial``: its verdict and every try; an accepted port becomes the
    trial's new parent, and what it asks to be written goes into ``writes``."""
    outcome = RebaseOutcome(patch.name, Outcome.CONFLICT)
    relative = lambda path: str(Path(path).relative_to(project.root))  # noqa: E731
    witness = registry.witness_for(patch.main.trailer("Witness"), str(patch.main.path))
    if witness is None:
        outcome.verdict = Outcome.WITNESS_UNAVAILABLE
        outcome.detail = f"{patch.name} names no witness, so nothing can confirm a port"
        return outcome
    # The witness, and the patch's regression tests: a port is accepted only when both pass on it.
    # The tests are written against the code that goes upstream, so they judge a port onto a
    # release newer than every pin (its rendition becomes the main file); a release between pins
    # (one left out, or one added late) is judged as apply judges older renditions, by the patch's
    # own witness (by its tests where they are its witness).
    judged_by = registry.witnesses_for(patch, patch.main)
    if not _newest(version, pins):
        judged_by = judged_by[:1]
    witness = judged_by[0] if judged_by else witness
    outcome.witness = witness.name
    tree = git_out(["rev-parse", f"{trial.pristine.commit}^{{tree}}"], trial.repo)
    before = answer_cache.run_cached(
        witness, tree, trial.pin,
        lambda: checkout_commit(trial.repo, trial.pristine.commit, Path(tempfile.mkdtemp(dir=trial.scratch, prefix="witness-"))),
    )
    outcome.witness_before = before.summary()
    tried = candidates(patch, pins, version)
    if before.state == UNAVAILABLE:
        outcome.verdict = Outcome.WITNESS_UNAVAILABLE
        outcome.detail = f"witness {witness.name} could not run on the pristine release: {before.detail}"
        return outcome
    if before.state == CLEAN:
        for candidate in tried:
            same = trial.reverse_applies(candidate.rendition)
            made_for = candidate.made_for.version if candidate.made_for else ""
            outcome.attempts.append(Attempt(relative(candidate.rendition.path), made_for, "reverse", "reverse-applies" if same else "does not reverse-apply"))
            if same:
                outcome.verdict = Outcome.ALREADY_UPSTREAM
                outcome.rendition = relative(candidate.rendition.path)
                outcome.detail = f"the release holds this change ({outcome.rendition} reverse-applies); witness {witness.name} passes on it"
                claim(writes, patch, candidate.rendition, pins, version)
                return outcome
        outcome.verdict = Outcome.FIXED_UPSTREAM
        outcome.detail = f"witness {witness.name} passes on the pristine release and no rendition reverse-applies: fixed upstream its own way"
        claim(writes, patch, None, pins, version)
        return outcome

    def judged(attempt: Attempt, commit: str) -> bool:
        verdict, after = trial.judge(judged_by or [witness], commit)
        attempt.judge = verdict.summary()
        attempt.findings = verdict.findings()[:20]
        attempt.witness_after = after.summary() if after else ""
        return verdict.accepted

    # (rendition, step, tree, parent) of the nearest candidate left for a person: a conflicted
    # merge (zdiff3 markers) or a tree the judge refused.
    nearest_conflict: tuple[str, str, str, str] | None = None
    # 1. Every rendition as it is, nearest first: one that applies unchanged is better than a new one.
    for candidate in tried:
        made_for = candidate.made_for.version if candidate.made_for else ""
        path = relative(candidate.rendition.path)
        result, commit, detail = trial.exact(candidate.rendition)
        attempt = Attempt(path, made_for, "exact", result, detail=detail)
        outcome.attempts.append(attempt)
        if commit and judged(attempt, commit):
            outcome.witness_after = attempt.witness_after
            trial.parent = commit
            outcome.verdict = Outcome.CARRIES_OVER
            outcome.step = "exact"
            outcome.rendition = relative(claim(writes, patch, candidate.rendition, pins, version))
            outcome.detail = f"applies as it is ({result}); the judge accepts it ({attempt.judge})"
            return outcome
    # 2. The merge tools, nearest rendition first, on the renditions that have a pinned tree; then
    # the same with the hunks the release holds or whose file it removed left out.
    merging = [candidate for candidate in tried if candidate.bases][:MERGE_CANDIDATES]
    for candidate in [c for c in tried if not c.bases]:
        outcome.attempts.append(Attempt(relative(candidate.rendition.path), "", "merge", "no pinned tree it was made for"))
    seen_trees: dict[str, Attempt] = {}
    for candidate in merging:
        made_for = candidate.made_for.version if candidate.made_for else ""
        path = relative(candidate.rendition.path)
        base = pristine_tree.pristine_from_index(candidate.made_for or candidate.bases[0])
        trial.borrow([base])
        diff = candidate.rendition.diff_text
        steps = [("three-way", None), ("merge-ort", diff), ("wiggle", diff), (moved_definitions.STEP, diff)]
        reduced = merge_tools.reduce(trial.repo, diff, trial.parent, trial.scratch)
        if reduced.dropped and reduced.diff:
            steps += [("reduced exact", reduced.diff), ("reduced merge-ort", reduced.diff), ("reduced wiggle", reduced.diff)]
        while steps:
            how, text = steps.pop(0)
            if how.endswith(("+ renames", "+ both insertions", "+ sibling lines")):
                if how.endswith("+ renames"):
                    proposal = merge_tools.follow_renames(trial.repo, base.commit, text, trial.parent, trial.scratch)
                elif how.endswith("+ sibling lines"):
                    refused_tree, findings = text
                    others = [(r.path.name, r.diff_text) for r in patch.renditions if r is not candidate.rendition]
                    proposal = merge_tools.sibling_lines(trial.repo, refused_tree, trial.parent, findings, others, trial.scratch)
                else:
                    proposal = merge_tools.keep_both_insertions(trial.repo, text, trial.parent, trial.scratch)
                tree_hash = proposal.tree
                result = ("proposes a tree changing " + ", ".join(proposal.changed)) if proposal.tree else "no tree"
                detail = proposal.detail
                commit = trial.commit_tree(candidate.rendition, tree_hash) if tree_hash else ""
            elif how == "three-way":
                result, commit, detail = trial.three_way(candidate.rendition, [base])
                tree_hash = git_out(["rev-parse", f"{commit}^{{tree}}"], trial.repo) if commit else ""
            else:
                tool = how.split()[-1]
                if tool == "wiggle" and not trial.wiggle:
                    outcome.attempts.append(Attempt(path, made_for, how, "wiggle is not installed here (apt-get install wiggle)"))
                    continue
                if tool == "exact":
                    proposal = trial.apply_text(text)
                elif tool == moved_definitions.STEP:
                    proposal = moved_definitions.retarget(trial.repo, base.commit, text, trial.parent, trial.scratch,
                                                          use_wiggle=trial.wiggle)
                else:
                    proposal = (merge_tools.merge_ort if tool == "merge-ort" else merge_tools.wiggle)(trial.repo, base.commit, text, trial.parent, trial.scratch)
                if proposal.conflict_tree and nearest_conflict is None:
                    nearest_conflict = (path, how, proposal.conflict_tree, trial.parent)
                if proposal.conflict_tree and proposal.content_only:
                    # Where both sides only inserted at one place, git's conflict keeps both.
                    steps.insert(0, (f"{how} + both insertions", proposal.conflict_tree))
                tree_hash = proposal.tree
                result = ("proposes a tree changing " + ", ".join(proposal.changed)) if proposal.tree else "no tree"
                detail = proposal.detail
                if how.startswith("reduced"):
                    detail = "\n".join(["dropped " + line for line in reduced.dropped] + ([detail] if detail else []))
                commit = trial.commit_tree(candidate.rendition, tree_hash) if tree_hash else ""
            attempt = Attempt(path, made_for, how, result, detail=detail)
            outcome.attempts.append(attempt)
            if not commit:
                continue
            if tree_hash == git_out(["rev-parse", f"{trial.parent}^{{tree}}"], trial.repo):
                attempt.judge = "refused: the proposal changes nothing"
                continue
            if tree_hash in seen_trees:
                earlier = seen_trees[tree_hash]
                attempt.result += f" (the same tree as {earlier.how} of {earlier.rendition.split('/')[-1]})"
                attempt.judge, attempt.findings, attempt.witness_after = earlier.judge, earlier.findings, earlier.witness_after
                continue
            seen_trees[tree_hash] = attempt
            if not judged(attempt, commit):
                if nearest_conflict is None:
                    nearest_conflict = (path, how, tree_hash, trial.parent)
                if attempt.findings and attempt.findings[0].startswith("names:") and "+ sibling lines" not in how:
                    # A name the release lacks where the patch's lines use it: that line as another
                    # rendition writes it, and before that, where the release renamed the name, the
                    # release's name.
                    steps.insert(0, (f"{how} + sibling lines", (tree_hash, list(attempt.findings))))
                    if not how.endswith("+ renames"):
                        steps.insert(0, (f"{how} + renames", tree_hash))
                continue
            outcome.witness_after = attempt.witness_after
            trial.parent = commit
            if how == "three-way" and grows_to(candidate.rendition, pins, version):
                # apply makes this very tree from the rendition by the same three-way step, so the
                # rendition serves the release too: no new file to keep (one a neighbour reproduces).
                outcome.verdict = Outcome.CARRIES_OVER
                outcome.step = how
                outcome.rendition = relative(claim(writes, patch, candidate.rendition, pins, version))
                outcome.detail = (f"three-way of {path} (made for {made_for}); the judge accepts it ({attempt.judge}); "
                                  "apply makes the same tree, so its Applies-To grows")
                return outcome
            outcome.verdict = Outcome.NEW_RENDITION
            new = project.patches_dir / RENDITIONS_DIR / patch.stem / f"{version}.patch"
            merged = with_message_of(candidate.rendition, trial.format_patch(commit))
            writes.files[new] = set_trailers(merged, {"Applies-To": f"=={version}"})
            claim(writes, patch, None, pins, version)
            outcome.rendition = relative(new)
            outcome.step = how
            outcome.detail = f"{how} of {path} (made for {made_for}); the judge accepts it ({attempt.judge}): review it"
            if how.startswith("reduced"):
                outcome.detail += "\n" + "\n".join("dropped " + line for line in reduced.dropped)
            return outcome
    outcome.verdict = Outcome.NEEDS_HAND_PORT
    refused = [a for a in outcome.attempts if a.judge]
    if refused:
        first = refused[0]
        outcome.detail = (f"no candidate the judge accepts; the nearest it saw: {first.how} of {first.rendition}: {first.judge}"
                          + "".join(f"\n  {finding}" for finding in first.findings[:8]))
    else:
        outcome.detail = "no rendition applies or merges, exactly, three-way, by git's merge or by wiggle: port it by hand"
    if nearest_conflict is not None:
        outcome.conflict = nearest_conflict
    return outcome


def with_message_of(rendition: PatchFile, merged: str) -> str:
    """The merged patch with the rendition's own mail header and message (git mailinfo, like git
    am, drops a subject's bracketed tags such as "[AMD]"; the rendition keeps them)."""
    head = rendition.raw.decode()
    return head[: re.search(r"^---$", head, re.MULTILINE).start()] + merged[re.search(r"^---$", merged, re.MULTILINE).start() :]


def grows_to(rendition: PatchFile, pins: tuple[Pin, ...], version: str) -> bool:
    """Whether ``rendition``'s ``Applies-To`` can take ``version`` as one range."""
    covered = [pin.version for pin in pins if rendition.covers(pin.version)]
    return spec_for(covered + [version], [pin.version for pin in pins] + [version]) is not None


def claim(writes: Writes, patch: SeriesPatch, chosen: PatchFile | None, pins: tuple[Pin, ...], version: str) -> Path | None:
    """Record that ``chosen`` (or no rendition) serves ``version``: its Applies-To grows to take the
    release, and any other rendition that claims it gives it up. Returns the file that serves it."""
    pinned = [pin.version for pin in pins] + [version]
    served = None
    for rendition in patch.renditions:
        covered = [pin.version for pin in pins if rendition.covers(pin.version)]
        if rendition is chosen:
            spec = spec_for(covered + [version], pinned)
            if spec is None:
                # Pins that another rendition serves lie in between: the release gets its own copy.
                served = patch.main.path.parent / RENDITIONS_DIR / patch.stem / f"{version}.patch"
                writes.files[served] = set_trailers(rendition.raw.decode(), {"Applies-To": f"=={version}"})
                continue
            served = rendition.path
        elif rendition.covers(version):
            spec = spec_for(covered, pinned)
            if spec is None:
                writes.problems.append(
                    f"{rendition.path}: its Applies-To claims {version}, and without it holds "
                    f"{', '.join(covered) or 'no pin'}, which no single range can say; fix it by hand"
                )
                continue
        else:
            continue
        if spec != rendition.trailer("Applies-To"):
            text = writes.files.get(rendition.path, rendition.raw.decode())
            writes.files[rendition.path] = set_trailers(text, {"Applies-To": spec})
    return served
