"""Forward-porting the series to a new sglang release (``nox -s rebase -- <version>``).

The new release is pinned from the package index, every patch is tried on its pristine tree --
exactly first, then three-way from the tree the patch was made for -- with the witnesses run on
the pristine tree, and each patch is classified:

- ``carries-over``: the patch applies as it is;
- ``new-rendition``: only a three-way merge applies it; the merged rendition is written for review;
- ``already-upstream``: the release holds this very change (it reverse-applies);
- ``fixed-upstream``: the witness passes on the pristine release and the patch does not
  reverse-apply (upstream fixed it its own way);
- ``conflict``: a person must port it; the hunk is shown.

Nothing is written unless every patch is classified without a conflict: then the pin, the new
renditions and the lock entry are written together.
"""

from __future__ import annotations

import dataclasses
import re
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from packaging.version import Version

from sglpatch import sources
from sglpatch.apply import (
    ALREADY_UPSTREAM,
    APPLIED,
    APPLIED_WITH_OFFSET,
    NOT_APPLICABLE,
    NOT_NEEDED,
    apply_pin,
    commit_patch,
)
from sglpatch.errors import SglpatchError
from sglpatch.gitcmd import git_out, run_git
from sglpatch.pins import Pin
from sglpatch.series import RENDITIONS_DIR, PatchFile, Series, SeriesPatch

CARRIES_OVER = "carries-over"
NEW_RENDITION = "new-rendition"
FIXED_UPSTREAM = "fixed-upstream"
CONFLICT = "conflict"


@dataclass
class PortOutcome:
    name: str
    verdict: str
    detail: str = ""
    rendition: str = ""


@dataclass
class PortReport:
    version: str
    artifact: str
    outcomes: list[PortOutcome] = field(default_factory=list)
    written: bool = False

    @property
    def complete(self) -> bool:
        return all(outcome.verdict != CONFLICT for outcome in self.outcomes)


def new_pin(version: str, index=None) -> Pin:
    """The pin for ``version``: its CPython 3.11 x86_64 wheel, else its sdist, from the index."""
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
    released = entry["released"] or "1970-01-01T00:00:00Z"
    return Pin(
        version=version,
        tag=f"v{version}",
        commit="",
        commit_verified=False,
        commit_evidence="none yet: pinned by sglpatch rebase from the package index",
        artifact=name,
        sha256=sha256,
        released=re.sub(r"\.\d+Z$", "Z", released),
        rocm_image=f"lmsysorg/sglang:v{version}-rocm720-mi35x",
    )


def forward_port(project, version: str, *, write: bool = True) -> PortReport:
    pins = project.pins()
    if version in [pin.version for pin in pins.pins]:
        raise SglpatchError(f"{pins.path}: {version} is already pinned")
    pin = new_pin(version)
    pristine = sources.pristine_from_index(pin)
    series = project.series()
    report = PortReport(version=version, artifact=pin.artifact)
    candidates = {patch.name: _candidate(patch, pins.pins, version) for patch in series.patches}
    trial = _trial_series(series, candidates, version)
    new_files: dict[Path, str] = {}
    with tempfile.TemporaryDirectory() as scratch:
        work = Path(scratch)
        result = apply_pin(pin, trial, pristine, work / "out", work / "trial.lock", run_witnesses=True)
        tree = work / "out" / version
        for outcome in result.patches:
            patch = series.get(outcome.name)
            source_pin, rendition = candidates[outcome.name]
            if outcome.status in (APPLIED, APPLIED_WITH_OFFSET):
                if rendition.covers(version):
                    report.outcomes.append(PortOutcome(outcome.name, CARRIES_OVER, outcome.detail, str(rendition.path)))
                else:
                    path, text = _rendition_file(project, patch, version, rendition.raw.decode())
                    new_files[path] = text
                    report.outcomes.append(PortOutcome(outcome.name, NEW_RENDITION, "applies as is; written with Applies-To >=" + version, str(path)))
            elif outcome.status == ALREADY_UPSTREAM:
                report.outcomes.append(PortOutcome(outcome.name, ALREADY_UPSTREAM, outcome.detail))
            elif outcome.status == NOT_NEEDED:
                verdict = ALREADY_UPSTREAM if outcome.reverse_applies else FIXED_UPSTREAM
                report.outcomes.append(PortOutcome(outcome.name, verdict, outcome.detail))
            elif outcome.status == NOT_APPLICABLE:
                report.outcomes.append(PortOutcome(outcome.name, CONFLICT, "no rendition to try"))
            else:
                merged = _three_way(tree, rendition, pristine.commit, source_pin)
                if merged is None:
                    report.outcomes.append(PortOutcome(outcome.name, CONFLICT, outcome.detail))
                else:
                    path, text = _rendition_file(project, patch, version, merged)
                    new_files[path] = text
                    if rendition.covers(version):
                        # The old rendition must stop where the new one starts.
                        capped = f"{rendition.trailer('Applies-To')},<{version}"
                        new_files[rendition.path] = _set_applies_to(rendition.raw.decode(), capped)
                    report.outcomes.append(PortOutcome(outcome.name, NEW_RENDITION, "three-way merge from " + source_pin.version, str(path)))
    if write and report.complete:
        for path, text in new_files.items():
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text)
        with pins.path.open("a") as handle:
            handle.write(pin_toml(pin))
        from sglpatch.project import apply_series

        # Capped renditions change their commit messages, so the pins they serve are re-locked too.
        changed = {path for path in new_files if path.exists()}
        touched = [
            other.version
            for other in pins.pins
            if any(r.path in changed for patch in series.patches for r in patch.renditions if r.covers(other.version))
        ]
        applied = apply_series(project, [*touched, version], update_lock=True)
        if not applied.ok:
            failed = next(result for result in applied.results if not result.ok)
            raise SglpatchError(f"{failed.version}: the ported series does not apply: {failed.error}")
        report.written = True
    return report


def _candidate(patch: SeriesPatch, pins: tuple[Pin, ...], version: str) -> tuple[Pin, PatchFile]:
    """The rendition to try: the one for ``version``, else the one of the newest older pin."""
    older = sorted((pin for pin in pins if pin.parsed_version < Version(version)), key=lambda p: p.parsed_version)
    for pin in reversed(older):
        rendition = patch.for_version(pin.version)
        if rendition is not None:
            exact = patch.for_version(version)
            return pin, exact or rendition
    raise SglpatchError(f"{patch.name}: no rendition applies to any pin older than {version}")


def _trial_series(series: Series, candidates: dict[str, tuple[Pin, PatchFile]], version: str) -> Series:
    patches = []
    for patch in series.patches:
        _, rendition = candidates[patch.name]
        trailers = tuple((key, f"=={version}" if key.lower() == "applies-to" else value) for key, value in rendition.trailers)
        patches.append(SeriesPatch(patch.name, (dataclasses.replace(rendition, trailers=trailers),)))
    return dataclasses.replace(series, patches=tuple(patches))


def _three_way(tree: Path, rendition: PatchFile, base: str, source_pin: Pin) -> str | None:
    """The rendition merged three-way onto ``base``, as format-patch text, or None on conflict."""
    source = sources.pristine_from_index(source_pin)
    run_git(["fetch", "--quiet", str(source.repo), source.commit], tree)
    with tempfile.TemporaryDirectory() as scratch:
        env = {"GIT_INDEX_FILE": str(Path(scratch) / "index")}
        run_git(["read-tree", base], tree, env=env)
        merged = run_git(["apply", "--cached", "--3way", "-"], tree, env=env, input=rendition.diff_text.encode(), check=False)
        if merged.returncode != 0:
            return None
        commit = commit_patch(tree, rendition, git_out(["write-tree"], tree, env=env), base)
    return run_git(["format-patch", "-1", "--stdout", "--zero-commit", commit], tree).stdout.decode()


def _rendition_file(project, patch: SeriesPatch, version: str, text: str) -> tuple[Path, str]:
    return project.patches_dir / RENDITIONS_DIR / patch.stem / f"{version}.patch", _set_applies_to(text, f">={version}")


def _set_applies_to(text: str, spec: str) -> str:
    return re.sub(r"^Applies-To: .*$", f"Applies-To: {spec}", text, count=1, flags=re.MULTILINE)


def pin_toml(pin: Pin) -> str:
    return (
        "\n[[pin]]\n"
        f'version = "{pin.version}"\n'
        f'tag = "{pin.tag}"\n'
        'commit = ""\n'
        "commit_verified = false\n"
        f'commit_evidence = "{pin.commit_evidence}"\n'
        f'artifact = "{pin.artifact}"\n'
        f'sha256 = "{pin.sha256}"\n'
        f'released = "{pin.released}"\n'
        f'rocm_image = "{pin.rocm_image}"\n'
    )
