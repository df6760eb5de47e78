"""``sglpatch check``: lint the series, every patch file and its renditions, against the pins."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from sglpatch import diffs
from sglpatch.errors import SglpatchError
from sglpatch.pins import Pins
from sglpatch.series import (
    CHANGELOG_FILE,
    RENDITIONS_DIR,
    REQUIRED_TRAILERS,
    SERIES_FILE,
    UPSTREAM_STATUS_RE,
    UPSTREAM_STATUS_VOCABULARY,
    PatchFile,
    Problem,
    parse_patch_file,
    series_entries,
    series_version,
)
from sglpatch.witnesses import registry


def check_series(patches_dir: Path, pins: Pins) -> list[Problem]:
    """Every problem found, each naming its file and line; an empty list means the series is clean."""
    problems: list[Problem] = []
    series_path = patches_dir / SERIES_FILE
    try:
        entries = series_entries(patches_dir)
    except SglpatchError as exc:
        return [Problem(series_path, 0, str(exc))]
    try:
        series_version(patches_dir)
    except SglpatchError as exc:
        problems.append(Problem(patches_dir / CHANGELOG_FILE, 1, str(exc)))
    listed: set[Path] = set()
    seen_names: dict[str, int] = {}
    for line, name in entries:
        if name in seen_names:
            problems.append(Problem(series_path, line, f"{name} is already listed at line {seen_names[name]}"))
            continue
        seen_names[name] = line
        main = patches_dir / name
        if not main.is_file():
            problems.append(Problem(series_path, line, f"{name} does not exist"))
            continue
        renditions = [main, *sorted((patches_dir / RENDITIONS_DIR / main.stem).glob("*.patch"))]
        listed.update(renditions)
        parsed = []
        for path in renditions:
            try:
                patch = parse_patch_file(path)
            except SglpatchError as exc:
                problems.append(Problem(path, 1, str(exc)))
                continue
            problems.extend(patch_problems(patch, patches_dir.parent))
            parsed.append(patch)
        problems.extend(_coverage_problems(name, parsed, pins))
    for stray in sorted(patches_dir.rglob("*.patch")):
        if stray not in listed:
            problems.append(Problem(stray, 1, f"not listed in {series_path.name} (nor a rendition of a listed patch)"))
    return problems


def patch_problems(patch: PatchFile, project_root: Path | None = None) -> list[Problem]:
    """What one patch file shows on its own: its trailers, its Origin and its diff. ``apply``
    refuses a rendition with any of these (with ``--update-lock`` and ``--no-witnesses`` too),
    so nothing ``check`` refuses reaches a tree or the lock."""
    return _metadata_problems(patch, project_root) + diffs.diff_problems(patch)


def _metadata_problems(patch: PatchFile, project_root: Path | None = None) -> list[Problem]:
    problems = []
    present = {name.lower() for name, _ in patch.trailers}
    for required in REQUIRED_TRAILERS:
        if required.lower() not in present:
            problems.append(Problem(patch.path, patch.diff_line, f"missing the {required} trailer"))
    status = patch.trailer("Upstream-Status")
    if status is not None and not UPSTREAM_STATUS_RE.match(status):
        problems.append(
            Problem(
                patch.path,
                patch.trailer_lines.get("upstream-status", 1),
                f"Upstream-Status {status!r} is not one of: {UPSTREAM_STATUS_VOCABULARY}",
            )
        )
    spec = patch.trailer("Applies-To")
    if spec is not None:
        try:
            SpecifierSet(spec)
        except InvalidSpecifier:
            problems.append(
                Problem(patch.path, patch.trailer_lines.get("applies-to", 1), f"Applies-To {spec!r} is not a PEP 440 specifier")
            )
    witness = patch.trailer("Witness")
    if witness:
        try:
            registry.witness_for(witness, str(patch.path))
        except SglpatchError as exc:
            problems.append(Problem(patch.path, patch.trailer_lines.get("witness", 1), str(exc).split(": ", 1)[1]))
    for key in ("Witness", "Origin"):
        value = patch.trailer(key)
        if value is not None and not value:
            problems.append(Problem(patch.path, patch.trailer_lines.get(key.lower(), 1), f"{key} is empty"))
    problems.extend(_origin_problems(patch, project_root))
    return problems


_PATH_LIKE = re.compile(r"(?<![\w/.:-])((?:\.{0,2}/)?[\w.-]+(?:/[\w.-]+)+\.\w+)")


def _origin_problems(patch: PatchFile, project_root: Path | None) -> list[Problem]:
    """The Origin must make sense to a reader with only this repository (a user's clone, a
    reviewer): every file it cites must be in the repository."""
    origin = patch.trailer("Origin") or ""
    if project_root is None:
        return []
    problems = []
    for cited in _PATH_LIKE.findall(origin):
        if "://" in origin and cited in origin.split("://", 1)[1].split()[0]:
            continue  # part of a URL
        if not (project_root / cited).exists():
            problems.append(
                Problem(
                    patch.path,
                    patch.trailer_lines.get("origin", 1),
                    f"Origin cites {cited}, which is not in this repository: say in words where the patch comes from",
                )
            )
    return problems


def _coverage_problems(name: str, renditions: list[PatchFile], pins: Pins) -> list[Problem]:
    problems = []
    specs = []
    for patch in renditions:
        try:
            specs.append((patch, patch.applies_to))
        except SglpatchError:
            continue  # already reported by _metadata_problems
    for patch, spec in specs:
        covered = [pin.version for pin in pins.pins if spec.contains(Version(pin.version), prereleases=True)]
        if not covered:
            problems.append(
                Problem(patch.path, patch.trailer_lines.get("applies-to", 1), f"Applies-To {spec} matches no pin in {pins.path.name}")
            )
    newest = None
    for pin in sorted(pins.pins, key=lambda pin: pin.parsed_version):
        claiming = [patch for patch, spec in specs if spec.contains(Version(pin.version), prereleases=True)]
        if len(claiming) > 1:
            names = ", ".join(p.path.name for p in claiming)
            problems.append(
                Problem(claiming[1].path, claiming[1].trailer_lines.get("applies-to", 1), f"{name}: renditions {names} both claim pin {pin.version}")
            )
        if claiming:
            newest = (pin.version, claiming[0])
    main = renditions[0] if renditions and renditions[0].path.name == Path(name).name else None
    if newest is not None and main is not None and newest[1] is not main:
        problems.append(Problem(
            main.path, main.trailer_lines.get("applies-to", 1),
            f"{name}: the main file must be the newest rendition, but {newest[1].path.relative_to(main.path.parent)} "
            f"covers the newest pin {newest[0]}; `sglpatch patch tidy` moves it"))
    return problems
