"""Porting the series to an sglang release that is not pinned (``sglpatch rebase <version>``).

The release -- newer than every pin, or between two -- is pinned from the package index. Each
patch's witness runs on the release's pristine tree first. Then every rendition of the patch is
tried, nearest release first: exactly, then three-way from the pristine trees it was applied to;
the first whose result the witness confirms on the new release is accepted. Each patch ends as:

- ``carries-over``: a rendition applies as it is and the witness confirms it; its ``Applies-To``
  grows to take the release;
- ``new-rendition``: only a three-way merge applies, and the witness confirms the merge; it is a new
  rendition for review, ``Applies-To: ==<release>``;
- ``already-upstream``: the witness passes on the pristine release and a rendition (perhaps one made
  for a file's new path) reverse-applies: the release holds this very change. The rendition's
  ``Applies-To`` grows to take the release, so ``apply`` says not-needed there, with the evidence;
- ``fixed-upstream``: the witness passes and no rendition reverse-applies: upstream fixed it its
  own way. No rendition claims the release (``apply`` says not-applicable there);
- ``conflict``, ``witness-failed``, ``witness-unavailable``: a person must look.

The report says, per patch, each rendition tried, how, the result and the witness before and after.

Nothing is written unless every patch is classified. Then the new pin, the renditions and the
changed ``Applies-To`` trailers are staged in a temporary copy of the project, linted, and the
series is applied there -- witnesses and all, lock updated -- to the release and to every pin whose
rendition changed. Only when that apply succeeds and agrees with the classification are the staged
files moved into the project (and put back as they were if a move fails).
"""

from __future__ import annotations

import datetime
import os
import re
import shutil
import tarfile
import tempfile
import zipfile
from dataclasses import asdict, dataclass, field
from pathlib import Path

from packaging.version import Version

from sglpatch import sources, witnesses
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
)
from sglpatch.diffs import parse_diff
from sglpatch.errors import SglpatchError
from sglpatch.gitcmd import git_out, run_git
from sglpatch.lock import LOCK_FILE
from sglpatch.pins import Pin
from sglpatch.series import RENDITIONS_DIR, PatchFile, SeriesPatch
from sglpatch.witnesses import BUG, CLEAN, UNAVAILABLE, WitnessResult

CARRIES_OVER = "carries-over"
NEW_RENDITION = "new-rendition"
FIXED_UPSTREAM = "fixed-upstream"
CONFLICT = "conflict"
WITNESS_FAILED = "witness-failed"
WITNESS_UNAVAILABLE = "witness-unavailable"
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
            lines.extend(f"      {line}" for line in outcome.detail.splitlines())
        if self.error:
            lines.append(f"  error: {self.error}")
        return "\n".join(lines)

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
                lines.append(f"- tried `{a.rendition}` {a.how}{base}: {a.result}{after}")
            if o.detail:
                lines += ["", "```", o.detail, "```"]
        if self.files:
            lines += ["", "Files: " + ", ".join(f"`{name}`" for name in self.files)]
        if self.relocked:
            lines += ["", "Lock entries re-recorded (applied with witnesses): " + ", ".join(self.relocked)]
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
        reverse = run_git(
            ["apply", "--cached", "--check", "--reverse", "--whitespace=nowarn", "-"],
            self.repo, env=self.env, input=rendition.diff_text.encode(), check=False,
        )
        return reverse.returncode == 0

    def three_way(self, rendition: PatchFile, bases: list[sources.Pristine]) -> tuple[str, str, str]:
        """(result, commit or "", detail) of a three-way merge from the trees the rendition was
        made for (their objects are borrowed, not copied)."""
        added = [str(base.repo / "objects") for base in bases if str(base.repo / "objects") not in self._alternates]
        if added:
            self._alternates.update(added)
            alternates = self.repo / ".git" / "objects" / "info" / "alternates"
            existing = alternates.read_text() if alternates.exists() else ""
            alternates.write_text(existing + "".join(f"{path}\n" for path in added))
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
    witness_said: list[str] = []
    # Every rendition as it is, nearest first, before any three-way merge: a rendition that
    # applies unchanged is better than a new one.
    tries = [(candidate, "exact") for candidate in tried] + [(candidate, "three-way") for candidate in tried]
    inapplicable: set[int] = set()
    for candidate, how in tries:
        made_for = candidate.made_for.version if candidate.made_for else ""
        path = relative(candidate.rendition.path)
        if how == "exact":
            result, commit, detail = trial.exact(candidate.rendition)
        elif id(candidate) not in inapplicable:
            continue  # it applied as it is; a merge would give the same tree
        elif not candidate.bases:
            outcome.attempts.append(Attempt(path, "", how, "no pinned tree it was made for"))
            continue
        else:
            bases = [sources.pristine_from_index(pin) for pin in candidate.bases]
            result, commit, detail = trial.three_way(candidate.rendition, bases)
        attempt = Attempt(path, made_for, how, result, detail=detail)
        outcome.attempts.append(attempt)
        if not commit:
            inapplicable.add(id(candidate))
            continue
        after = trial.witness(witness, commit)
        attempt.witness_after = after.summary()
        witness_said.append(after.state)
        if after.state != CLEAN:
            if after.detail:
                attempt.detail = (attempt.detail + "\n" if attempt.detail else "") + after.detail
            continue
        outcome.witness_after = after.summary()
        trial.parent = commit
        if how == "exact":
            outcome.verdict = CARRIES_OVER
            outcome.rendition = relative(_claim(writes, patch, candidate.rendition, pins, version))
            outcome.detail = f"applies as it is ({result}); witness {witness.name} confirms it"
        else:
            outcome.verdict = NEW_RENDITION
            new = project.patches_dir / RENDITIONS_DIR / patch.stem / f"{version}.patch"
            writes.files[new] = set_applies_to(_with_message_of(candidate.rendition, trial.format_patch(commit)), f"=={version}")
            _claim(writes, patch, None, pins, version)
            outcome.rendition = relative(new)
            outcome.detail = f"merged three-way from {made_for}; witness {witness.name} confirms the merge: review it"
        return outcome
    if BUG in witness_said:
        outcome.verdict = WITNESS_FAILED
        outcome.detail = f"a rendition applied, but witness {witness.name} still finds the bug on every result"
    elif UNAVAILABLE in witness_said:
        outcome.verdict = WITNESS_UNAVAILABLE
        outcome.detail = f"a rendition applied, but witness {witness.name} could not run on it"
    else:
        outcome.verdict = CONFLICT
        outcome.detail = "no rendition applies, exactly or three-way: port it by hand"
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
