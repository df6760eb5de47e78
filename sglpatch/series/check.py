"""``sglpatch check``: lint the series, every patch file and its renditions, against the pins."""

from __future__ import annotations

import re
from pathlib import Path

from packaging.specifiers import InvalidSpecifier, SpecifierSet
from packaging.version import Version

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.series import diffs
from sglpatch.sources.pins import Pins
from sglpatch.series.patches import (
    CHANGELOG_FILE,
    RENDITIONS_DIR,
    REQUIRED_TRAILERS,
    SERIES_FILE,
    TESTS_DIR,
    UPSTREAM_STATUS_RE,
    UPSTREAM_STATUS_VOCABULARY,
    PatchFile,
    Problem,
    parse_patch_file,
    regression_tests,
    series_entries,
    series_version,
)
from sglpatch.series.source_reading import source_reading_problems
from sglpatch.witnesses import agreement, registry


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
        problems.extend(_test_problems(patches_dir, main, parsed))
    tests_root = patches_dir / TESTS_DIR
    for folder in sorted(tests_root.iterdir()) if tests_root.is_dir() else ():
        if folder.name not in {Path(name).stem for _, name in entries}:
            problems.append(Problem(folder, 1, f"regression tests of no patch listed in {series_path.name}"))
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


UPSTREAM_TEST_ROOT = "test/registered/unit/"


def _test_problems(patches_dir: Path, main: Path, parsed: list[PatchFile]) -> list[Problem]:
    """A patch's regression tests (``patches/tests/<stem>/``) must be sglang CPU unit tests at
    their upstream path, registered and runnable as its suite runner requires. Once the series
    keeps tests (``patches/tests/`` exists), a patch still needed on the newest pin (its main
    file has no ``Fixed-Upstream-In``) must have one: it is what its pull request proves the fix
    with."""
    tests = regression_tests(patches_dir, main.stem)
    problems = []
    in_layout = []
    for test in tests:
        name = test.path.rsplit("/", 1)[-1]
        if not (test.path.startswith(UPSTREAM_TEST_ROOT) and name.startswith("test_") and name.endswith(".py")):
            problems.append(Problem(test.file, 1, f"not a test in sglang's layout: {UPSTREAM_TEST_ROOT}<path mirroring "
                                                  "python/sglang/srt>/test_*.py, under "
                                                  f"{TESTS_DIR}/{main.stem}/"))
            continue
        in_layout.append(test)
    head = next((p for p in parsed if p.path == main), None)
    names_tests = head is not None and (head.trailer("Witness") or "").split()[:1] == [registry.UPSTREAM_TEST]
    problems.extend(tests_problems(patches_dir, main.stem, tuple(in_layout), own_witness=not names_tests))
    if head is None:
        return problems
    if not tests and (names_tests or ((patches_dir / TESTS_DIR).is_dir() and not head.trailer("Fixed-Upstream-In"))):
        problems.append(Problem(main, head.trailer_lines.get("witness", 1),
                                f"no regression test: add {TESTS_DIR}/{main.stem}/{UPSTREAM_TEST_ROOT}<path mirroring "
                                "python/sglang/srt>/test_*.py (a patch upstream already fixed says so with "
                                "Fixed-Upstream-In)", awaits_test=True))
    return problems


def tests_problems(patches_dir: Path, stem: str, tests: tuple, own_witness: bool) -> list[Problem]:
    """What a patch's tests must be before any of them runs: what sglang's collector accepts, no
    reading of sglang's source text, and a ``cases.toml`` that names exactly the tests there are
    (``agreement.case_map_problems``). ``apply`` refuses the tests it would run with any of these."""
    problems = []
    for test in tests:
        problems.extend(_runnable_problems(test.file))
        problems.extend(source_reading_problems(test.file))
    return problems + agreement.case_map_problems(patches_dir, stem, tests, own_witness)


def _runnable_problems(path: Path) -> list[Problem]:
    """What sglang's own CI collector (``sglang.test.ci.ci_register``) refuses: no
    ``register_cpu_ci(...)`` call at the top, no ``if __name__ == "__main__":`` block that runs."""
    import ast

    try:
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except (SyntaxError, UnicodeDecodeError) as exc:
        return [Problem(path, getattr(exc, "lineno", 1) or 1, f"does not parse: {exc}")]
    registered = any(
        isinstance(node, ast.Expr) and isinstance(node.value, ast.Call)
        and getattr(node.value.func, "id", getattr(node.value.func, "attr", "")) == "register_cpu_ci"
        for node in tree.body
    )
    main = any(
        isinstance(node, ast.If) and isinstance(node.test, ast.Compare)
        and getattr(node.test.left, "id", "") == "__name__"
        and any(isinstance(c, ast.Constant) and c.value == "__main__" for c in node.test.comparators)
        and any(isinstance(n, ast.Call) for n in ast.walk(node))
        for node in tree.body
    )
    problems = []
    if not registered:
        problems.append(Problem(path, 1, 'no register_cpu_ci(est_time=..., suite="base-a-test-cpu") call at the top'))
    if not main:
        problems.append(Problem(path, 1, 'no `if __name__ == "__main__": unittest.main()` block'))
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
