"""The staged write: changes to the project's series, pins and lock written only when the series,
staged with them in a temporary copy of the project, passes ``check`` and applies with witnesses;
then each file is moved in, and all are put back as they were if a move fails. ``rebase`` and
``sglpatch status --write`` write this way.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

from sglpatch.apply.apply_pins import apply_series
from sglpatch.plumbing import interrupts
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.project import Project
from sglpatch.series.check import check_series
from sglpatch.series.lock import LOCK_FILE


def write_staged(project, changes: dict[Path, bytes | None], pins_to_apply: list[str], verify=None) -> None:
    """Write ``changes`` (project path -> bytes, or None to remove the file) only if the series, staged with them in a temporary
    copy of the project, passes ``check`` and applies to ``pins_to_apply`` with witnesses (the
    staged lock updated, and taken along); ``verify(staged, report)`` -- the staged project and
    its apply -- may refuse with a reason. On any refusal nothing in the project has changed."""
    root = project.root
    with tempfile.TemporaryDirectory(prefix="sglpatch-stage-") as scratch:
        stage = Path(scratch) / "project"
        for part in ("upstream", "patches"):
            shutil.copytree(root / part, stage / part)
        if project.lock_file.exists():
            shutil.copy2(project.lock_file, stage / LOCK_FILE)
        for path, data in changes.items():
            target = stage / path.relative_to(root)
            if data is None:
                target.unlink(missing_ok=True)
                continue
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(data)
        staged = Project(stage, sealed=True)
        problems = check_series(staged.patches_dir, staged.pins())
        if problems:
            raise SglpatchError(f"the staged series does not pass check: {problems[0]}")
        applied = apply_series(
            staged, pins_to_apply, update_lock=True, out_dir=Path(scratch) / "build", report_path=Path(scratch) / "report.json"
        )
        failed = next((result for result in applied.results if not result.ok), None)
        if failed is not None:
            raise SglpatchError(f"the staged series does not apply to {failed.version}: {failed.error}; nothing written")
        reason = verify(staged, applied) if verify else ""
        if reason:
            raise SglpatchError(f"{reason}; nothing written")
        final = {path: None if data is None else (stage / path.relative_to(root)).read_bytes() for path, data in changes.items()}
        final[project.lock_file] = (stage / LOCK_FILE).read_bytes()
        move_in(final)


def move_in(files: dict[Path, bytes | None]) -> None:
    """Each file written beside its destination, then renamed onto it (a None removes it); if one
    fails, the ones already moved or removed are put back as they were."""
    ready: list[tuple[Path | None, Path]] = []
    try:
        for path, data in files.items():
            if data is None:
                ready.append((None, path))
                continue
            path.parent.mkdir(parents=True, exist_ok=True)
            fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(data)
            ready.append((Path(name), path))
    except BaseException as exc:  # an OSError, or Ctrl-C: the staged copies go either way
        for tmp, _ in ready:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise SglpatchError(f"cannot stage {path}: {exc}; nothing written") from None
        raise
    try:
        previous = {path: path.read_bytes() if path.exists() else None for _, path in ready}
    except OSError as exc:
        for tmp, _ in ready:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        raise SglpatchError(f"cannot read {exc.filename}, which would be replaced: {exc.strerror}; nothing written") from None
    done: list[Path] = []
    try:
        # All of them or none: Ctrl-C waits until the last is in place (then says what was written).
        with interrupts.whole(f"{len(ready)} files written: {', '.join(path.name for _, path in ready)}"):
            for tmp, path in ready:
                if tmp is None:
                    path.unlink(missing_ok=True)
                else:
                    os.replace(tmp, path)
                done.append(path)
    except OSError as exc:
        for moved in done:
            if previous[moved] is None:
                moved.unlink(missing_ok=True)
            else:
                moved.write_bytes(previous[moved])
        for tmp, _ in ready:
            if tmp is not None:
                tmp.unlink(missing_ok=True)
        raise SglpatchError(f"cannot move {path} into place: {exc}; the files are as they were") from None
