"""A copy of the project as if one pinned release had never been seen (the leave-one-out port).

For release ``V``: its pin and its lock entry are removed; every rendition whose ``Applies-To``
holds ``V`` alone is deleted (a main patch made for ``V`` alone is replaced by its nearest
rendition, whose own file then goes); a range that starts or ends at ``V`` is narrowed to the pins
left. ``sglpatch rebase V`` in the copy must then port the series by itself: no file in the copy
was made for ``V``.
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from sglpatch.errors import SglpatchError
from sglpatch.lock import LOCK_FILE, read_lock
from sglpatch.outcomes import CLASSIFIED
from sglpatch.pins import load_pins, without_pin
from sglpatch.project import Project
from sglpatch.rebase import rebase_onto
from sglpatch.rebase.trial import candidates
from sglpatch.series import load_series, set_trailers, spec_for


def leave_out(source_root: Path, version: str, dest: Path) -> dict:
    """Write the copy of ``source_root`` without ``version`` to ``dest``; returns what was done
    (``deleted``, ``narrowed``, ``replaced_main``), paths relative to the project."""
    source_root, dest = Path(source_root), Path(dest)
    pins = load_pins(source_root / "upstream" / "pins.toml")
    if version not in [pin.version for pin in pins.pins]:
        raise SglpatchError(f"{version} is not pinned in {source_root}")
    shutil.copytree(source_root / "patches", dest / "patches")
    (dest / "upstream").mkdir(parents=True, exist_ok=True)
    (dest / "upstream" / "pins.toml").write_text(without_pin((source_root / "upstream" / "pins.toml").read_text(), version))
    lock_path = source_root / LOCK_FILE
    if lock_path.exists():
        lock = json.loads(lock_path.read_text())
        lock.get("pins", {}).pop(version, None)
        (dest / LOCK_FILE).write_text(json.dumps(lock, indent=2) + "\n")
    left = load_pins(dest / "upstream" / "pins.toml").pins
    pinned = [pin.version for pin in left]
    done = {"deleted": [], "narrowed": [], "replaced_main": []}
    series = load_series(dest / "patches")
    relative = lambda path: str(Path(path).relative_to(dest))  # noqa: E731
    for patch in series.patches:
        main_alone = False
        for rendition in patch.renditions:
            covered = [pin.version for pin in pins.pins if rendition.covers(pin.version)]
            if version not in covered:
                continue
            rest = [v for v in covered if v != version]
            if not rest:
                if rendition is patch.main:
                    main_alone = True
                else:
                    rendition.path.unlink()
                    done["deleted"].append(relative(rendition.path))
                continue
            spec = spec_for(rest, pinned)
            if spec is None:
                raise SglpatchError(f"{rendition.path}: without {version} its pins {rest} are no single range")
            rendition.path.write_text(set_trailers(rendition.path.read_text(), {"Applies-To": spec}))
            done["narrowed"].append(f"{relative(rendition.path)}: {spec}")
        if main_alone:
            fresh = load_series(dest / "patches").get(patch.name)
            others = [c for c in candidates(fresh, left, version) if c.rendition.path != fresh.main.path]
            if not others:
                raise SglpatchError(f"{patch.name}: made for {version} alone, and no other rendition exists")
            nearest = others[0].rendition.path
            fresh.main.path.write_bytes(nearest.read_bytes())
            nearest.unlink()
            done["deleted"].append(relative(nearest))
            done["replaced_main"].append(f"{relative(fresh.main.path)} <- {relative(nearest)}")
    return done


# -- the port of a release left out ---------------------------------------------------------------


def rebase_left_out(source_root: Path, version: str, work: Path, *, write: bool = True) -> dict:
    """``leave_out`` then ``rebase`` of ``version`` in the copy (with ``write``: the staged,
    witnessed apply and the lock). One row of the leave-one-out benchmark: per patch the verdict
    and the cascade step (or what stopped it), whether the tree equals the committed lock's, and the
    time the rebase took."""
    copy = Path(work) / f"project-{version}"
    if copy.exists():
        shutil.rmtree(copy)
    removed = leave_out(source_root, version, copy)
    started = time.perf_counter()
    try:
        report = rebase_onto(Project(copy), version, write=write)
    except SglpatchError as exc:
        return {"version": version, "ported": False, "identical": False, "seconds": time.perf_counter() - started,
                "patches": [], "error": str(exc), "removed": removed}
    seconds = time.perf_counter() - started
    committed = read_lock(Path(source_root) / LOCK_FILE)["pins"].get(version, {})
    tree = report.tree
    if write and report.written:
        tree = read_lock(copy / LOCK_FILE)["pins"][version]["tree"]
    ported = report.complete and (report.written or not write)
    patches = []
    for outcome in report.outcomes:
        accepted = next((a for a in reversed(outcome.attempts) if a.judge.startswith("accepted")), None)
        stopped = ""
        if outcome.verdict not in CLASSIFIED:
            refused = [a for a in outcome.attempts if a.judge]
            stopped = refused[0].judge if refused else outcome.detail.splitlines()[0]
        patches.append({
            "name": outcome.name, "verdict": outcome.verdict, "step": outcome.step,
            "from": (accepted.rendition.rsplit("/", 1)[-1] if accepted else outcome.rendition.rsplit("/", 1)[-1]),
            "made_for": accepted.made_for if accepted else "", "stopped": stopped, "tries": len(outcome.attempts),
        })
    return {
        "version": version, "ported": ported, "identical": bool(ported and tree and tree == committed.get("tree")),
        "tree": tree, "committed_tree": committed.get("tree", ""), "seconds": seconds, "patches": patches,
        "error": report.error, "prepared": report.prepared, "removed": removed, "written": report.written,
    }
