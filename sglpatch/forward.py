"""Porting the series to an sglang release that is not pinned (``sglpatch rebase <version>``).

The release -- newer than every pin, or between two -- is pinned from the package index. Each
patch's witness runs on the release's pristine tree first. Then a cascade of porters, each a
well-kept tool, proposes trees, nearest rendition first (``sglpatch.porters``):

1. every rendition exactly as it is (``git apply``);
2. per rendition with a pinned tree it was made for (the nearest ``MERGE_CANDIDATES``): git's
   three-way apply; git's own merge (merge-ort, rename detection: a cherry-pick of the rendition's
   commit from the tree it was made for); Debian's ``wiggle``; then the same with the hunks the
   release already holds (each reverse-applies) and the files it removed left out;
3. where a proposal uses a name the release renamed around it, the same proposal with the
   release's name (``porters.follow_renames``).

Every proposal is judged (``sglpatch.judge``) -- no name its added lines use missing from the
release, the witness bug on the pristine release and clean on the port, every touched module
importing in the pin's CPU Python on the emulated box -- and the first accepted is taken. Each
patch ends as:

- ``carries-over``: a rendition applies as it is and the judge accepts it; its ``Applies-To``
  grows to take the release;
- ``new-rendition``: a merge tool's tree the judge accepts; a new rendition for review,
  ``Applies-To: ==<release>``, the step that made it in the report;
- ``already-upstream``: the witness passes on the pristine release and a rendition (perhaps one made
  for a file's new path) reverse-applies: the release holds this very change;
- ``fixed-upstream``: the witness passes and no rendition reverse-applies: upstream fixed it its
  own way. No rendition claims the release (``apply`` says not-applicable there);
- ``needs-hand-port`` (the judge refused every proposal, or no tool made one) and
  ``witness-unavailable``: a person must look. ``build/port/<release>/`` then holds the nearest
  candidate (zdiff3 conflict markers where git's merge conflicted), and ``sglpatch patch refresh
  <release>`` writes the edited tree back as the rendition.

The report lists every try: the tool, what it changed, the judge's verdict and findings.

Nothing is written unless every patch is classified. Then the new pin, the renditions and the
changed ``Applies-To`` trailers are staged in a temporary copy of the project, linted, and the
series is applied there -- witnesses and all, lock updated -- to the release and to every pin whose
rendition changed. Only when that apply succeeds and agrees with the classification are the staged
files moved into the project (and put back as they were if a move fails).
"""

from __future__ import annotations

import ast
import datetime
import json
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import Version

from sglpatch import judge as judging
from sglpatch import porters, sources, witnesses
from sglpatch.apply import (
    ALREADY_UPSTREAM,
    APPLIED,
    APPLIED_WITH_OFFSET,
    NOT_APPLICABLE,
    NOT_NEEDED,
    conflict_detail,
    display_name,
    checkout_commit,
    commit_patch,
    reverse_applies,
)
from sglpatch.diffs import parse_diff
from sglpatch.errors import SglpatchError
from sglpatch.gitcmd import git_out, run_git
from sglpatch.lock import LOCK_FILE
from sglpatch.pins import Pin
from sglpatch.series import RENDITIONS_DIR, PatchFile, SeriesPatch
from sglpatch.witnesses import CLEAN, UNAVAILABLE, WitnessResult

CARRIES_OVER = "carries-over"
NEW_RENDITION = "new-rendition"
FIXED_UPSTREAM = "fixed-upstream"
CONFLICT = "conflict"
WITNESS_FAILED = "witness-failed"
WITNESS_UNAVAILABLE = "witness-unavailable"
NEEDS_HAND_PORT = "needs-hand-port"
# The renditions (nearest first) the merge tools are tried with; farther ones rarely merge better.
MERGE_CANDIDATES = 3
IMPORT_SMOKE_LIMIT_S = 300
CLASSIFIED = (CARRIES_OVER, NEW_RENDITION, ALREADY_UPSTREAM, FIXED_UPSTREAM)

# What ``apply`` must then say on the release for each verdict, or nothing is written.
_APPLY_AGREES = {
    CARRIES_OVER: (APPLIED, APPLIED_WITH_OFFSET),
    NEW_RENDITION: (APPLIED, APPLIED_WITH_OFFSET),
    ALREADY_UPSTREAM: (NOT_NEEDED,),
    FIXED_UPSTREAM: (NOT_APPLICABLE,),
}
_OFFSET_RE = re.compile(r"Hunk #(\d+) succeeded at (\d+) \(offset (-?\d+) lines?\)")
_PIN_BLOCK_RE = re.compile(r'^\[\[pin\]\]\s*\nversion\s*=\s*"([^"]+)"', re.MULTILINE)


@dataclass
class Attempt:
    """One try of one rendition on the release."""

    rendition: str  # relative to the project
    made_for: str  # the pin whose tree it was made for ("" when no pin has it)
    how: str  # "exact", "three-way" or "reverse"
    result: str  # "applies", "applies-with-offset", "reverse-applies", "does not apply", ...
    witness_after: str = ""
    detail: str = ""
    judge: str = ""  # the judge's verdict on the tree it made ("" when it made none)
    findings: list[str] = field(default_factory=list)


@dataclass
class PortOutcome:
    name: str
    verdict: str
    detail: str = ""
    rendition: str = ""  # the rendition the release gets (relative to the project), if any
    witness: str = ""
    witness_before: str = ""
    witness_after: str = ""
    attempts: list[Attempt] = field(default_factory=list)
    step: str = ""  # the cascade step that ported it ("exact" for carries-over)
    conflict: tuple = ()  # (rendition, step, tree with zdiff3 markers) of the nearest conflicted merge
    prepared: str = ""  # where the tree left for a person is (build/port/V/)


@dataclass
class PortReport:
    version: str
    artifact: str
    sha256: str = ""
    released: str = ""
    patches_in_series: int = 0
    outcomes: list[PortOutcome] = field(default_factory=list)
    written: bool = False
    files: list[str] = field(default_factory=list)  # what was (or would be) written, relative
    relocked: list[str] = field(default_factory=list)  # the pins whose lock entries were re-recorded
    error: str = ""
    tree: str = ""  # the release's tree with every accepted port (the lock's tree when complete)
    prepared: str = ""  # build/port/<version>/, the tree left for a person (relative), if any

    @property
    def complete(self) -> bool:
        """Every patch of the series classified (an empty or partial trial is not complete)."""
        return (
            not self.error
            and len(self.outcomes) == self.patches_in_series
            and all(outcome.verdict in CLASSIFIED for outcome in self.outcomes)
        )

    def to_dict(self) -> dict:
        return {**asdict(self), "complete": self.complete}

    def text(self) -> str:
        lines = [f"sglang {self.version} ({self.artifact}, sha256 {self.sha256[:16]}..., uploaded {self.released})"]
        for outcome in self.outcomes:
            via = f" via {outcome.rendition}" if outcome.rendition else ""
            lines.append(f"  {outcome.name}: {outcome.verdict}{via}")
            lines.append(
                f"      witness {outcome.witness or '-'}: pristine {outcome.witness_before or '-'}"
                f" -> ported {outcome.witness_after or '-'}"
            )
            for attempt in outcome.attempts:
                after = f"; witness after: {attempt.witness_after}" if attempt.witness_after else ""
                base = f" from {attempt.made_for}" if attempt.made_for else ""
                lines.append(f"      tried {attempt.rendition} {attempt.how}{base}: {attempt.result}{after}")
                lines.extend(f"          {line}" for line in attempt.detail.splitlines()[:12])
                if attempt.judge:
                    lines.append(f"          judge: {attempt.judge}")
                    lines.extend(f"            {finding}" for finding in attempt.findings[:6])
            lines.extend(f"      {line}" for line in outcome.detail.splitlines())
        if self.prepared:
            lines.append(f"  left for a person: {self.prepared} (the nearest candidate of {self._left()}, zdiff3 markers where it"
                         f" conflicted); edit it, then: sglpatch patch refresh {self.version}")
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)

    def _left(self) -> str:
        return next((o.name for o in self.outcomes if o.prepared), "")

    def markdown(self) -> str:
        state = "every patch classified" if self.complete else "NOT every patch classified"
        lines = [
            f"### sglang {self.version}: {state}",
            "",
            f"Artifact `{self.artifact}` (sha256 `{self.sha256}`), uploaded {self.released}.",
            "",
            "| patch | verdict | rendition | witness | pristine | ported |",
            "|---|---|---|---|---|---|",
        ]
        for o in self.outcomes:
            lines.append(
                f"| `{o.name}` | {o.verdict} | {('`' + o.rendition + '`') if o.rendition else '-'} | "
                f"{o.witness or '-'} | {o.witness_before or '-'} | {o.witness_after or '-'} |"
            )
        for o in self.outcomes:
            lines += ["", f"**{o.name}**: {o.verdict}"]
            for a in o.attempts:
                after = f"; witness after: {a.witness_after}" if a.witness_after else ""
                base = f" from {a.made_for}" if a.made_for else ""
                judged = f"; judge: {a.judge}" if a.judge else ""
                lines.append(f"- tried `{a.rendition}` {a.how}{base}: {a.result}{after}{judged}")
                lines.extend(f"  - {finding}" for finding in a.findings[:6])
            if o.detail:
                lines += ["", "```", o.detail, "```"]
        if self.files:
            lines += ["", "Files: " + ", ".join(f"`{name}`" for name in self.files)]
        if self.relocked:
            lines += ["", "Lock entries re-recorded (applied with witnesses): " + ", ".join(self.relocked)]
        hand = [o for o in self.outcomes if o.verdict == NEEDS_HAND_PORT]
        if hand:
            lines += ["", "**Needs a hand port:** " + ", ".join(f"`{o.name}`" for o in hand)]
            for o in hand:
                if o.prepared:
                    lines.append(f"- `{o.name}`: the nearest candidate ({o.conflict[1]} of `{o.conflict[0]}`) is applied in"
                                 f" `{o.prepared}` (zdiff3 conflict markers where it conflicted); edit it there, then"
                                 f" `sglpatch patch refresh {self.version}`")
        made = [o for o in self.outcomes if o.verdict == NEW_RENDITION]
        if made:
            lines += ["", "**Made by a merge tool, review before merging:** "
                      + ", ".join(f"`{o.rendition}` ({o.step or 'merged'})" for o in made)]
        if self.error:
            lines += ["", f"Error: {self.error}"]
        return "\n".join(lines) + "\n"


# -- the new pin --------------------------------------------------------------------------------


def new_pin(version: str, index=None) -> tuple[Pin, str]:
    """The pin for ``version`` from the index -- its CPython 3.11 x86_64 wheel, else its sdist --
    and a note where the upload time did not come from the index."""
    entries = sources.index_entries(index)
    candidates = [f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl", f"sglang-{version}.tar.gz"]
    name = next((candidate for candidate in candidates if candidate in entries), None)
    if name is None:
        where = sources.package_index.resolve(index).describe()
        raise SglpatchError(f"sglang {version}: neither {' nor '.join(candidates)} is on the index {where}")
    entry = entries[name]
    sha256 = entry["sha256"] or ""
    if not re.fullmatch(r"[0-9a-f]{64}", sha256):
        raise SglpatchError(f"{name}: the index gives no sha256 for it; pin it by hand")
    pin = Pin(
        version=version,
        tag=f"v{version}",
        commit="",
        commit_verified=False,
        commit_evidence="none yet: pinned by sglpatch rebase from the package index",
        artifact=name,
        sha256=sha256,
        released=re.sub(r"\.\d+Z$", "Z", entry["released"] or "") or "1970-01-01T00:00:00Z",
        rocm_image=f"lmsysorg/sglang:v{version}-rocm720-mi35x",
    )
    if entry["released"]:
        return pin, ""
    # Simple (PEP 503) pages carry no upload time; the artifact's own newest file time is a fact
    # about it, and the pin's comment says where it came from.
    released = _artifact_time(sources.fetch_artifact(pin, index))
    pin = Pin(**{**asdict(pin), "released": released})
    return pin, "the index gives no upload time; this is the newest file time inside the artifact"


def _artifact_time(artifact: Path) -> str:
    if artifact.name.endswith(".whl"):
        with zipfile.ZipFile(artifact) as archive:
            stamp = max(datetime.datetime(*info.date_time, tzinfo=datetime.UTC) for info in archive.infolist())
    else:
        with tarfile.open(artifact) as archive:
            stamp = datetime.datetime.fromtimestamp(max(m.mtime for m in archive.getmembers()), datetime.UTC)
    return stamp.strftime("%Y-%m-%dT%H:%M:%SZ")


def pin_toml(pin: Pin, note: str = "") -> str:
    comment = f"# released: {note}\n" if note else ""
    return (
        f"[[pin]]\n{comment}"
        f'version = "{pin.version}"\n'
        f'tag = "{pin.tag}"\n'
        f'commit = "{pin.commit}"\n'
        f"commit_verified = {'true' if pin.commit_verified else 'false'}\n"
        f'commit_evidence = "{pin.commit_evidence}"\n'
        f'artifact = "{pin.artifact}"\n'
        f'sha256 = "{pin.sha256}"\n'
        f'released = "{pin.released}"\n'
        f'rocm_image = "{pin.rocm_image}"\n'
    )


def with_pin(pins_text: str, pin: Pin, note: str = "") -> str:
    """``pins.toml`` with ``pin`` inserted in version order (before the first newer pin)."""
    block = pin_toml(pin, note)
    for match in _PIN_BLOCK_RE.finditer(pins_text):
        if Version(match.group(1)) > pin.parsed_version:
            return pins_text[: match.start()] + block + "\n" + pins_text[match.start() :]
    return pins_text.rstrip("\n") + "\n\n" + block


# -- Applies-To ---------------------------------------------------------------------------------


def spec_for(versions, pinned) -> str | None:
    """The ``Applies-To`` that holds exactly ``versions`` among the ``pinned`` versions (``==v``
    or ``>=a,<=b``), or None where no single range does."""
    chosen = sorted(set(versions), key=Version)
    if not chosen:
        return None
    if len(chosen) == 1:
        return f"=={chosen[0]}"
    low, high = Version(chosen[0]), Version(chosen[-1])
    inside = sorted((v for v in set(pinned) | set(chosen) if low <= Version(v) <= high), key=Version)
    return f">={chosen[0]},<={chosen[-1]}" if inside == chosen else None


def set_applies_to(text: str, spec: str) -> str:
    return re.sub(r"^Applies-To: .*$", f"Applies-To: {spec}", text, count=1, flags=re.MULTILINE)


# -- trying renditions --------------------------------------------------------------------------


@dataclass
class _Candidate:
    rendition: PatchFile
    made_for: Pin | None
    bases: list[Pin]  # every pin the rendition covers, nearest first
    rank: tuple


def candidates(patch: SeriesPatch, pins: tuple[Pin, ...], version: str) -> list[_Candidate]:
    """Every rendition of ``patch``, nearest release first: one that claims ``version`` itself,
    then by how many pins lie between ``version`` and the nearest pin the rendition covers (the
    older side first on a tie: a release grows out of the one before it)."""
    ordered = sorted([pin.version for pin in pins] + [version], key=Version)
    at = ordered.index(version)
    found = []
    for rendition in patch.renditions:
        covered = [pin for pin in pins if rendition.covers(pin.version)]
        covered.sort(key=lambda pin: (abs(ordered.index(pin.version) - at), pin.parsed_version > Version(version)))
        stem = next((pin for pin in covered if pin.version == rendition.path.stem), None)
        if rendition.covers(version):
            rank = (0, 0)
        elif covered:
            nearest = covered[0]
            rank = (abs(ordered.index(nearest.version) - at), int(nearest.parsed_version > Version(version)))
        else:
            rank = (len(ordered) + 1, 0)
        found.append(_Candidate(rendition, stem or (covered[0] if covered else None), covered, rank))
    return sorted(found, key=lambda candidate: candidate.rank)


class _Trial:
    """The release's pristine commit in a scratch clone, where renditions are tried with git
    plumbing in a private index, each patch on top of the ones accepted before it."""

    def __init__(self, scratch: Path, pin: Pin, pristine: sources.Pristine):
        self.scratch = scratch
        self.pin = pin
        self.pristine = pristine
        self.repo = scratch / "trial"
        run_git(["clone", "--quiet", "--local", "--no-checkout", str(pristine.repo), str(self.repo)], scratch)
        self.env = {"GIT_INDEX_FILE": str(scratch / "index")}
        self.parent = pristine.commit
        self._alternates: set[str] = set()
        self._verdicts: dict[str, tuple] = {}
        self.wiggle = porters.wiggle_available()

    def borrow(self, bases: list[sources.Pristine]) -> None:
        """Borrow the objects of other pristine trees (for merges from the trees renditions were made for)."""
        added = [str(base.repo / "objects") for base in bases if str(base.repo / "objects") not in self._alternates]
        if added:
            self._alternates.update(added)
            alternates = self.repo / ".git" / "objects" / "info" / "alternates"
            existing = alternates.read_text() if alternates.exists() else ""
            alternates.write_text(existing + "".join(f"{path}\n" for path in added))

    def apply_text(self, diff: str) -> porters.Proposal:
        """A diff (a rendition less some hunks) applied exactly on the current parent."""
        self._reset()
        done = run_git(["apply", "--cached", "--whitespace=nowarn", "-"], self.repo, env=self.env, input=diff.encode(), check=False)
        if done.returncode != 0:
            return porters.Proposal(detail=done.stderr.decode(errors="replace").strip()[-800:])
        tree = git_out(["write-tree"], self.repo, env=self.env)
        changed = git_out(["diff", "--name-only", "--no-renames", self.parent, tree], self.repo).splitlines()
        return porters.Proposal(tree, changed)

    def commit_tree(self, rendition: PatchFile, tree: str) -> str:
        return commit_patch(self.repo, rendition, tree, self.parent)

    def _text(self, commit: str, path: str) -> str | None:
        shown = run_git(["cat-file", "blob", f"{commit}:{path}"], self.repo, check=False)
        return shown.stdout.decode(errors="replace") if shown.returncode == 0 else None

    def judge(self, witness, commit: str) -> tuple[judging.Verdict, WitnessResult | None]:
        """The judge's verdict on ``commit`` (a candidate on the current parent): names, then the
        witness, then the import smoke, each only when the ones before passed."""
        tree = git_out(["rev-parse", f"{commit}^{{tree}}"], self.repo)
        key = (tree, self.parent, witness.name)
        if key in self._verdicts:
            return self._verdicts[key]
        verdict = judging.Verdict()
        changed = [p for p in git_out(["diff", "--name-only", "--no-renames", self.parent, commit], self.repo).splitlines() if p]
        exists = lambda path: run_git(["cat-file", "-e", f"{commit}:{path}"], self.repo, check=False).returncode == 0  # noqa: E731
        release = judging.Release(lambda path: self._text(commit, path), exists)
        for path in changed:
            new = self._text(commit, path)
            if path.endswith(".py") and new is not None:
                verdict.names += judging.names_findings(path, self._text(self.parent, path), new, release)
        verdict.checked.append("names")
        after = None
        if not verdict.names:
            after = self.witness(witness, commit)
            verdict.checked.append("witness")
            if after.state != CLEAN:
                verdict.witness.append(f"{witness.name} says {after.summary()} on the port: {after.detail}"[:600])
            else:
                verdict.imports = self.import_smoke(commit, changed)
                verdict.checked.append("imports")
        self._verdicts[key] = (verdict, after)
        return verdict, after

    def import_smoke(self, commit: str, changed: list[str]) -> list[str]:
        """Findings of importing every module the port touches (and, for a kernel source, the
        modules that load it) in the pin's CPU Python on the emulated MI355X box."""
        import dataclasses

        from sglpatch import pyenv
        from sglpatch.errors import Unavailable
        from sglpatch.witnesses import mtp_exclude

        modules = []
        for path in changed:
            if path.startswith("python/sglang/") and path.endswith(".py"):
                before = self._text(self.parent, path)
                try:
                    ast.parse(before or "")
                except SyntaxError:
                    continue  # the release's own file is no Python: nothing to import
                modules.append(path[len("python/"):-3].replace("/", ".").removesuffix(".__init__"))
            elif path.startswith("python/sglang/"):
                name = Path(path).name
                found = run_git(["grep", "-l", "-F", name, commit, "--", "python/sglang/*.py"], self.repo, check=False)
                for line in found.stdout.decode().splitlines():
                    module = line.split(":", 1)[-1]
                    modules.append(module[len("python/"):-3].replace("/", ".").removesuffix(".__init__"))
        modules = list(dict.fromkeys(modules))
        if not modules:
            return []
        try:
            python = pyenv.cpu_python(self.pin)
        except Unavailable as exc:
            return [f"unavailable: no CPU Python for {self.pin.version}: {exc}"[:600]]
        environment = mtp_exclude.probe_request(self.pin).environment()
        request = pyenv.ProbeRequest("import-smoke", "import_smoke", {"modules": modules}, IMPORT_SMOKE_LIMIT_S,
                                     import_env=environment[0], arch=environment[1])
        tree = checkout_commit(self.repo, commit, Path(tempfile.mkdtemp(dir=self.scratch, prefix="imports-")))
        run = python.run_probes(tree, [dataclasses.replace(request)], remember=True)
        shutil.rmtree(tree, ignore_errors=True)
        failure = run.failure(request.name)
        if failure:
            return [f"unavailable: {failure}"[:600]]
        answer = run.answers[request.name].get("modules", {})
        return [f"{module}: {error}"[:600] for module, error in answer.items() if error]

    def _reset(self) -> None:
        run_git(["read-tree", self.parent], self.repo, env=self.env)

    def _commit(self, rendition: PatchFile) -> str:
        tree = git_out(["write-tree"], self.repo, env=self.env)
        return commit_patch(self.repo, rendition, tree, self.parent)

    def exact(self, rendition: PatchFile) -> tuple[str, str, str]:
        """(result, commit or "", detail) of applying the rendition as it is."""
        self._reset()
        diff = rendition.diff_text.encode()
        check = run_git(["apply", "--cached", "--check", "-v", "--whitespace=nowarn", "-"], self.repo, env=self.env, input=diff, check=False)
        if check.returncode != 0:
            return "does not apply", "", conflict_detail(display_name(rendition), parse_diff(rendition), check.stderr.decode())
        run_git(["apply", "--cached", "--whitespace=nowarn", "-"], self.repo, env=self.env, input=diff)
        offsets = _OFFSET_RE.findall(check.stderr.decode())
        detail = ", ".join(f"hunk {h} at line {line} (offset {off})" for h, line, off in offsets)
        return ("applies-with-offset" if offsets else "applies"), self._commit(rendition), detail

    def reverse_applies(self, rendition: PatchFile) -> bool:
        self._reset()
        return reverse_applies(self.repo, self.env, rendition.diff_text)

    def three_way(self, rendition: PatchFile, bases: list[sources.Pristine]) -> tuple[str, str, str]:
        """(result, commit or "", detail) of a three-way merge from the trees the rendition was
        made for (their objects are borrowed, not copied)."""
        self.borrow(bases)
        self._reset()
        merged = run_git(["apply", "--cached", "--3way", "--whitespace=nowarn", "-"], self.repo, env=self.env, input=rendition.diff_text.encode(), check=False)
        if merged.returncode != 0:
            message = merged.stderr.decode().strip()
            return "conflict", "", message[-1500:]
        return "merges", self._commit(rendition), ""

    def witness(self, witness, commit: str) -> WitnessResult:
        tree = git_out(["rev-parse", f"{commit}^{{tree}}"], self.repo)

        def materialize() -> Path:
            return checkout_commit(self.repo, commit, Path(tempfile.mkdtemp(dir=self.scratch, prefix="witness-")))

        return witnesses.run_cached(witness, tree, self.pin, materialize)

    def format_patch(self, commit: str) -> str:
        return run_git(["format-patch", "-1", "--stdout", "--zero-commit", commit], self.repo).stdout.decode()


@dataclass
class _Port:
    """What a classified patch asks to be written: rendition files and their new text."""

    files: dict[Path, str] = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)


def _port_patch(project, trial: _Trial, patch: SeriesPatch, pins: tuple[Pin, ...], version: str, writes: _Port) -> PortOutcome:
    outcome = PortOutcome(patch.name, CONFLICT)
    relative = lambda path: str(Path(path).relative_to(project.root))  # noqa: E731
    witness = witnesses.witness_for(patch.main.trailer("Witness"), str(patch.main.path))
    if witness is None:
        outcome.verdict = WITNESS_UNAVAILABLE
        outcome.detail = f"{patch.name} names no witness, so nothing can confirm a port"
        return outcome
    outcome.witness = witness.name
    tree = git_out(["rev-parse", f"{trial.pristine.commit}^{{tree}}"], trial.repo)
    before = witnesses.run_cached(
        witness, tree, trial.pin,
        lambda: checkout_commit(trial.repo, trial.pristine.commit, Path(tempfile.mkdtemp(dir=trial.scratch, prefix="witness-"))),
    )
    outcome.witness_before = before.summary()
    tried = candidates(patch, pins, version)
    if before.state == UNAVAILABLE:
        outcome.verdict = WITNESS_UNAVAILABLE
        outcome.detail = f"witness {witness.name} could not run on the pristine release: {before.detail}"
        return outcome
    if before.state == CLEAN:
        for candidate in tried:
            same = trial.reverse_applies(candidate.rendition)
            made_for = candidate.made_for.version if candidate.made_for else ""
            outcome.attempts.append(Attempt(relative(candidate.rendition.path), made_for, "reverse", "reverse-applies" if same else "does not reverse-apply"))
            if same:
                outcome.verdict = ALREADY_UPSTREAM
                outcome.rendition = relative(candidate.rendition.path)
                outcome.detail = f"the release holds this change ({outcome.rendition} reverse-applies); witness {witness.name} passes on it"
                _claim(writes, patch, candidate.rendition, pins, version)
                return outcome
        outcome.verdict = FIXED_UPSTREAM
        outcome.detail = f"witness {witness.name} passes on the pristine release and no rendition reverse-applies: fixed upstream its own way"
        _claim(writes, patch, None, pins, version)
        return outcome

    def judged(attempt: Attempt, commit: str) -> bool:
        verdict, after = trial.judge(witness, commit)
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
            outcome.verdict = CARRIES_OVER
            outcome.step = "exact"
            outcome.rendition = relative(_claim(writes, patch, candidate.rendition, pins, version))
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
        base = sources.pristine_from_index(candidate.made_for or candidate.bases[0])
        trial.borrow([base])
        diff = candidate.rendition.diff_text
        steps = [("three-way", None), ("merge-ort", diff), ("wiggle", diff)]
        reduced = porters.reduce(trial.repo, diff, trial.parent, trial.scratch)
        if reduced.dropped and reduced.diff:
            steps += [("reduced exact", reduced.diff), ("reduced merge-ort", reduced.diff), ("reduced wiggle", reduced.diff)]
        while steps:
            how, text = steps.pop(0)
            if how.endswith(("+ renames", "+ both insertions")):
                if how.endswith("+ renames"):
                    proposal = porters.follow_renames(trial.repo, base.commit, text, trial.parent, trial.scratch)
                else:
                    proposal = porters.keep_both_insertions(trial.repo, text, trial.parent, trial.scratch)
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
                else:
                    proposal = (porters.merge_ort if tool == "merge-ort" else porters.wiggle)(trial.repo, base.commit, text, trial.parent, trial.scratch)
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
                if attempt.findings and attempt.findings[0].startswith("names:") and not how.endswith("+ renames"):
                    # A name the release renamed where the patch's lines use it: rename it as the release did.
                    steps.insert(0, (f"{how} + renames", tree_hash))
                continue
            outcome.witness_after = attempt.witness_after
            trial.parent = commit
            outcome.verdict = NEW_RENDITION
            new = project.patches_dir / RENDITIONS_DIR / patch.stem / f"{version}.patch"
            writes.files[new] = set_applies_to(_with_message_of(candidate.rendition, trial.format_patch(commit)), f"=={version}")
            _claim(writes, patch, None, pins, version)
            outcome.rendition = relative(new)
            outcome.step = how
            outcome.detail = f"{how} of {path} (made for {made_for}); the judge accepts it ({attempt.judge}): review it"
            if how.startswith("reduced"):
                outcome.detail += "\n" + "\n".join("dropped " + line for line in reduced.dropped)
            return outcome
    outcome.verdict = NEEDS_HAND_PORT
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


def _with_message_of(rendition: PatchFile, merged: str) -> str:
    """The merged patch with the rendition's own mail header and message (git mailinfo, like git
    am, drops a subject's bracketed tags such as "[AMD]"; the rendition keeps them)."""
    head = rendition.raw.decode()
    return head[: re.search(r"^---$", head, re.MULTILINE).start()] + merged[re.search(r"^---$", merged, re.MULTILINE).start() :]


def _claim(writes: _Port, patch: SeriesPatch, chosen: PatchFile | None, pins: tuple[Pin, ...], version: str) -> Path | None:
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
                writes.files[served] = set_applies_to(rendition.raw.decode(), f"=={version}")
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
            writes.files[rendition.path] = set_applies_to(writes.files.get(rendition.path, rendition.raw.decode()), spec)
    return served


# -- the whole port -----------------------------------------------------------------------------


PORT_NOTE = "sglpatch-port.json"  # in the prepared tree's .git: what it was prepared from


def prepare_hand_port(project, trial: _Trial, version: str, left: list[PortOutcome]) -> Path:
    """``build/port/<version>/``: a git checkout of the release with the patches accepted before the
    first patch that needs a hand port committed on branch ``port``, and that patch's nearest
    candidate in the working tree (git's zdiff3 conflict markers where it conflicted), for a person
    to finish and ``sglpatch patch refresh <version>`` to write back as the rendition."""
    first = left[0]
    rendition, how, tree, parent = first.conflict
    dest = project.build_dir / "port" / version
    if dest.exists():
        shutil.rmtree(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    run_git(["clone", "--quiet", "--local", "--no-checkout", str(trial.pristine.repo), str(dest)], dest.parent)
    run_git(["push", "--quiet", str(dest), f"{parent}:refs/heads/port"], trial.repo)
    candidate = git_out(["commit-tree", tree, "-p", parent, "-m", f"candidate: {how} of {rendition}"], trial.repo,
                        env=porters._FIXED)
    run_git(["push", "--quiet", str(dest), f"{candidate}:refs/sglpatch/candidate"], trial.repo)
    run_git(["symbolic-ref", "HEAD", "refs/heads/port"], dest)
    run_git(["read-tree", "refs/sglpatch/candidate"], dest)
    run_git(["checkout-index", "--all", "--force"], dest)
    run_git(["read-tree", "port"], dest)
    note = {
        "version": version,
        "patch": first.name,
        "rendition": rendition,
        "step": how,
        "findings": next((a.findings for a in first.attempts if a.rendition == rendition and a.how == how), []),
        "others": [o.name for o in left[1:]],
    }
    (dest / ".git" / PORT_NOTE).write_text(json.dumps(note, indent=2) + "\n")
    return dest


def refresh_port(project, version: str) -> Path:
    """Write the edited tree under ``build/port/<version>/`` back as the patch's rendition for
    ``version`` (``Applies-To: ==<version>``, the candidate's message); refuses while conflict
    markers remain. Returns the rendition's path."""
    dest = project.build_dir / "port" / version
    note_file = dest / ".git" / PORT_NOTE
    if not note_file.is_file():
        raise SglpatchError(f"{dest}: no tree prepared for a hand port of {version} (sglpatch rebase {version} prepares one)")
    note = json.loads(note_file.read_text())
    env = {"GIT_INDEX_FILE": str(dest / ".git" / "index-refresh")}
    run_git(["read-tree", "port"], dest, env=env)
    run_git(["add", "--all", "--", "."], dest, env=env)
    tree = git_out(["write-tree"], dest, env=env)
    changed = [p for p in git_out(["diff", "--name-only", "--cached", "port"], dest, env=env).splitlines() if p]
    if not changed:
        raise SglpatchError(f"{dest}: nothing changed against the release; nothing written")
    for path in changed:
        shown = run_git(["cat-file", "blob", f"{tree}:{path}"], dest, check=False)
        marked = [n for n, line in enumerate(shown.stdout.decode(errors="replace").splitlines(), 1)
                  if line.startswith(("<<<<<<< ", ">>>>>>> ", "||||||| ")) or line == "======="]
        if shown.returncode == 0 and marked:
            raise SglpatchError(f"{dest / path}:{marked[0]}: a conflict marker is left; resolve it, then refresh again")
    series = project.series()
    patch = series.get(note["patch"])
    source = next((r for r in patch.renditions if str(r.path.relative_to(project.root)) == note["rendition"]), patch.main)
    commit = commit_patch(dest, source, tree, git_out(["rev-parse", "port"], dest))
    text = run_git(["format-patch", "-1", "--stdout", "--zero-commit", commit], dest).stdout.decode()
    target = project.patches_dir / RENDITIONS_DIR / patch.stem / f"{version}.patch"
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(set_applies_to(_with_message_of(source, text), f"=={version}"))
    return target


def forward_port(project, version: str, *, write: bool = True) -> PortReport:
    """Classify every patch of the series on ``version``; with ``write``, and only when every patch
    is classified and the staged apply succeeds, pin it and write the renditions and the lock."""
    pins = project.pins()
    if version in [pin.version for pin in pins.pins]:
        raise SglpatchError(f"{pins.path}: {version} is already pinned")
    pin, note = new_pin(version)
    pristine = sources.pristine_from_index(pin)
    series = project.series()
    report = PortReport(version, pin.artifact, pin.sha256, pin.released, len(series.patches))
    writes = _Port()
    with tempfile.TemporaryDirectory(prefix="sglpatch-rebase-") as scratch:
        trial = _Trial(Path(scratch), pin, pristine)
        for patch in series.patches:
            report.outcomes.append(_port_patch(project, trial, patch, pins.pins, version, writes))
        report.tree = git_out(["rev-parse", f"{trial.parent}^{{tree}}"], trial.repo)
        left = [outcome for outcome in report.outcomes if outcome.verdict == NEEDS_HAND_PORT and outcome.conflict]
        if left:
            report.prepared = str(prepare_hand_port(project, trial, version, left).relative_to(project.root))
            for outcome in left:
                outcome.prepared = report.prepared if outcome is left[0] else ""
    report.files = sorted(str(path.relative_to(project.root)) for path in writes.files)
    report.files += ["upstream/pins.toml", LOCK_FILE]
    if not write or not report.complete:
        return report
    if writes.problems:
        report.error = "; ".join(writes.problems)
        return report
    changes = {path: text.encode() for path, text in writes.files.items()}
    changes[pins.path] = with_pin(pins.path.read_text(), pin, note).encode()
    touched = sorted(
        {
            other.version
            for patch in series.patches
            for rendition in patch.renditions
            if rendition.path in writes.files
            for other in pins.pins
            if rendition.covers(other.version)
        },
        key=Version,
    )
    report.relocked = [*touched, version]
    try:
        write_staged(project, changes, report.relocked, verify=lambda staged: _agrees(staged, report))
    except SglpatchError as exc:
        report.error = str(exc)
        return report
    report.written = True
    return report


def _agrees(applied, report: PortReport) -> str:
    """Where the staged apply says something other than the classification on the release, why."""
    result = next(result for result in applied.results if result.version == report.version)
    by_name = {outcome.name: outcome for outcome in result.patches}
    for outcome in report.outcomes:
        got = by_name.get(outcome.name)
        status = got.status if got else "missing"
        if status not in _APPLY_AGREES[outcome.verdict]:
            return f"{outcome.name}: the rebase says {outcome.verdict} on {report.version}, but apply says {status}"
    return ""


def write_staged(project, changes: dict[Path, bytes], pins_to_apply: list[str], verify=None) -> None:
    """Write ``changes`` (project path -> bytes) only if the series, staged with them in a temporary
    copy of the project, passes ``check`` and applies to ``pins_to_apply`` with witnesses (the
    staged lock updated, and taken along); ``verify(report)`` may refuse with a reason. On any
    refusal nothing in the project has changed."""
    from sglpatch.check import check_series
    from sglpatch.project import Project, apply_series

    root = project.root
    with tempfile.TemporaryDirectory(prefix="sglpatch-stage-") as scratch:
        stage = Path(scratch) / "project"
        for part in ("upstream", "patches"):
            shutil.copytree(root / part, stage / part)
        if project.lock_file.exists():
            shutil.copy2(project.lock_file, stage / LOCK_FILE)
        for path, data in changes.items():
            target = stage / path.relative_to(root)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        staged = Project(stage)
        problems = check_series(staged.patches_dir, staged.pins())
        if problems:
            raise SglpatchError(f"the staged series does not pass check: {problems[0]}")
        applied = apply_series(
            staged, pins_to_apply, update_lock=True, out_dir=Path(scratch) / "build", report_path=Path(scratch) / "report.json"
        )
        failed = next((result for result in applied.results if not result.ok), None)
        if failed is not None:
            raise SglpatchError(f"the staged series does not apply to {failed.version}: {failed.error}; nothing written")
        reason = verify(applied) if verify else ""
        if reason:
            raise SglpatchError(f"{reason}; nothing written")
        final = {path: (stage / path.relative_to(root)).read_bytes() for path in changes}
        final[project.lock_file] = (stage / LOCK_FILE).read_bytes()
        move_in(final)


def move_in(files: dict[Path, bytes]) -> None:
    """Each file written beside its destination, then renamed onto it; if one fails, the ones
    already moved are put back as they were."""
    ready: list[tuple[Path, Path]] = []
    try:
        for path, data in files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            ready.append((Path(name), path))
    except OSError as exc:
        for tmp, _ in ready:
            tmp.unlink(missing_ok=True)
        raise SglpatchError(f"cannot stage {path}: {exc}; nothing written") from None
    previous = {path: path.read_bytes() if path.exists() else None for _, path in ready}
    done: list[Path] = []
    try:
        for tmp, path in ready:
            os.replace(tmp, path)
            done.append(path)
    except OSError as exc:
        for path in done:
            if previous[path] is None:
                path.unlink(missing_ok=True)
            else:
                path.write_bytes(previous[path])
        for tmp, _ in ready:
            tmp.unlink(missing_ok=True)
        raise SglpatchError(f"cannot move {path} into place: {exc}; the files are as they were") from None
