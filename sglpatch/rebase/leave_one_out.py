"""A copy of the project as if one pinned release had never been seen (the leave-one-out port).

For release ``V``: its pin and its lock entry are removed; every rendition whose ``Applies-To``
holds ``V`` alone is deleted (a main patch made for ``V`` alone is replaced by its nearest
rendition, whose own file then goes). A rendition that holds ``V`` and other pins may have been
made for ``V`` (a three-way apply serving its neighbours), so it is split: on each other pin where
the lock commits the patch, a rendition of its own, made from that pin's locked commit
(``into.locked_series``, checked against the lock) as ``git format-patch`` writes it, with the
rendition's message, named after the pin, ``Applies-To: ==<pin>``; the pins where it is not
committed (it serves there to say "already upstream") keep its text, narrowed to them -- split in
two where they lie on both sides of ``V`` (the pins below, the pins above, each a file of its own),
so that no range still spans ``V``. Where the lock commits the patch on ``V`` alone among the
rendition's pins, its text was made for ``V``: it is made again from the locked commit of the pin
nearest ``V`` that commits the patch, or dropped where none does. The newest is the main file.
Each pin left thus gets its committed tree from a file made for it or for no release at all, and
``sglpatch rebase V`` in the copy must port the series by itself: no file in the copy was made for
``V``, and none claims it (checked at the end; a copy that still would is refused).
"""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

from packaging.version import Version

from sglpatch.apply.index_apply import commit_as_patch
from sglpatch.apply.into import locked_series
from sglpatch.apply.outcomes import APPLIED_STATES, CLASSIFIED
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.project import Project
from sglpatch.rebase.onto import rebase_onto
from sglpatch.rebase.patch import with_message_of
from sglpatch.series.lock import LOCK_FILE, read_lock
from sglpatch.series.patches import RENDITIONS_DIR, load_series, newest_in_main, set_trailers, spec_for
from sglpatch.sources.pins import load_pins, without_pin


def leave_out(source_root: Path, version: str, dest: Path) -> dict:
    """Write the copy of ``source_root`` without ``version`` to ``dest``; returns what was done
    (``deleted``, ``remade``, ``narrowed``, ``replaced_main``), paths relative to the project."""
    source_root, dest = Path(source_root), Path(dest)
    pins = load_pins(source_root / "upstream" / "pins.toml")
    if version not in [pin.version for pin in pins.pins]:
        raise SglpatchError(f"{version} is not pinned in {source_root}")
    shutil.copytree(source_root / "patches", dest / "patches")
    (dest / "upstream").mkdir(parents=True, exist_ok=True)
    (dest / "upstream" / "pins.toml").write_text(without_pin((source_root / "upstream" / "pins.toml").read_text(), version))
    lock_path = source_root / LOCK_FILE
    lock = json.loads(lock_path.read_text()) if lock_path.exists() else {"pins": {}}
    if lock_path.exists():
        left_lock = dict(lock, pins={v: entry for v, entry in lock.get("pins", {}).items() if v != version})
        (dest / LOCK_FILE).write_text(json.dumps(left_lock, indent=2) + "\n")
    left = load_pins(dest / "upstream" / "pins.toml").pins
    pinned = [pin.version for pin in left]
    done = {"deleted": [], "remade": [], "narrowed": [], "replaced_main": [], "dropped": []}
    series = load_series(dest / "patches")
    relative = lambda path: str(Path(path).relative_to(dest))  # noqa: E731
    remake = _Remaker(Project(source_root), lock.get("pins", {}))
    for patch in series.patches:
        for rendition in patch.renditions:
            covered = [pin.version for pin in pins.pins if rendition.covers(pin.version)]
            if version not in covered:
                continue
            rest = [v for v in covered if v != version]
            if not rest:
                if rendition is not patch.main:  # a main file made for V alone: the newest other takes its place below
                    rendition.path.unlink()
                    done["deleted"].append(relative(rendition.path))
                continue
            kept = [v for v in rest if not remake(patch.name, rendition, v)]
            made = [v for v in rest if v not in kept]
            pieces = _pieces(kept, version)
            stem_dir = rendition.path.parent if rendition is not patch.main else rendition.path.parent / RENDITIONS_DIR / patch.stem
            if not made and remake.committed(patch.name, version):
                # Committed on V alone among its pins: its text was made for V. It is made again from
                # the locked commit of the pin nearest V that commits the patch, or dropped.
                neighbour = remake.nearest_committed(patch.name, version, [pin.version for pin in pins.pins])
                if neighbour is None:
                    if rendition is patch.main:
                        raise SglpatchError(f"{rendition.path}: made for {version} alone among its pins, and no other pin "
                                            f"commits {patch.name}: nothing to make it again from")
                    rendition.path.unlink()
                    done["dropped"].append(f"{relative(rendition.path)} (made for {version} alone; no other pin commits the patch)")
                    continue
                text = remake(patch.name, rendition, neighbour)
                texts = _piece_texts(rendition, text, pieces, pinned, stem_dir)
                _write_texts(rendition, texts)
                done["remade"].append(f"{relative(rendition.path)} -> " + ", ".join(relative(path) for path in texts)
                                      + f" (made for {version} alone among its pins: made again from {neighbour}'s locked commit)")
                continue
            if not made:
                texts = _piece_texts(rendition, rendition.path.read_text(), pieces, pinned, stem_dir)
                _write_texts(rendition, texts)
                done["narrowed"] += [f"{relative(path)}: {_applies_to(text)}" for path, text in texts.items()]
                continue
            files = {v: stem_dir / f"{v}.patch" for v in made}
            if rendition is patch.main and not kept:
                files[max(made, key=Version)] = rendition.path  # the series names the main file: it stays
            texts = {files[v]: set_trailers(remake(patch.name, rendition, v), {"Applies-To": f"=={v}"}) for v in made}
            if kept:
                narrowed = _piece_texts(rendition, rendition.path.read_text(), pieces, pinned, stem_dir)
                clash = [path for path in narrowed if path in texts]
                if clash:
                    raise SglpatchError(f"{clash[0]}: both a pin's own rendition and a narrowed part of {rendition.path.name}")
                texts.update(narrowed)
                done["narrowed"] += [f"{relative(path)}: {_applies_to(text)}" for path, text in narrowed.items()]
            _write_texts(rendition, texts)
            done["remade"].append(f"{relative(rendition.path)} -> " + ", ".join(relative(files[v]) for v in made)
                                  + " (each made for its pin from the pin's locked commit)")
        fresh = load_series(dest / "patches").get(patch.name)
        for path, text in newest_in_main(fresh, {}, pinned).items():
            if text is None:
                done["replaced_main"].append(f"{relative(fresh.main.path)} <- {relative(path)}")
                path.unlink()
            else:
                path.parent.mkdir(parents=True, exist_ok=True)
                path.write_text(text)
    claims = [relative(r.path) for p in load_series(dest / "patches").patches for r in p.renditions if r.covers(version)]
    if claims:
        raise SglpatchError(f"{claims[0]}: still claims {version} in the copy without it")
    return done


def _pieces(versions: list[str], left_out: str) -> list[list[str]]:
    """``versions`` split at the release left out: the pins below it, the pins above it (each
    non-empty one a piece), so no piece's range spans it."""
    ordered = sorted(versions, key=Version)
    below = [v for v in ordered if Version(v) < Version(left_out)]
    above = [v for v in ordered if Version(v) > Version(left_out)]
    return [piece for piece in (below, above) if piece]


def _piece_texts(rendition, text: str, pieces: list[list[str]], pinned: list[str], stem_dir: Path) -> dict[Path, str]:
    """``text`` for each piece of pins: the newest piece in the rendition's own file, each other in
    a file of its own named after its newest pin, ``Applies-To`` holding exactly that piece."""
    texts = {}
    for index, piece in enumerate(sorted(pieces, key=lambda piece: Version(piece[-1]), reverse=True)):
        spec = spec_for(piece, pinned)
        if spec is None:
            raise SglpatchError(f"{rendition.path}: the pins {piece} it is kept for are no single range")
        path = rendition.path if index == 0 else stem_dir / f"{piece[-1]}.patch"
        if index and path.exists():
            raise SglpatchError(f"{path}: exists, so {rendition.path.name} cannot be split under that name")
        texts[path] = set_trailers(text, {"Applies-To": spec})
    return texts


def _write_texts(rendition, texts: dict[Path, str]) -> None:
    clash = [path for path in texts if path.exists() and path != rendition.path]
    if clash:
        raise SglpatchError(f"{clash[0]}: exists, so {rendition.path.name} cannot be split under that name")
    if rendition.path not in texts:
        rendition.path.unlink()
    for path, text in texts.items():
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)


def _applies_to(text: str) -> str:
    return next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("Applies-To:")), "")


def _place(pins, version: str) -> int:
    return sorted((pin.version for pin in pins.pins), key=Version).index(version)


class _Remaker:
    """A patch's rendition made for a pin from the pin's locked commit of it (None where the lock
    commits the patch on that pin not at all); each pin's series is committed again once."""

    def __init__(self, project: Project, lock: dict):
        self.project = project
        self.lock = lock
        self.made: dict[str, dict[str, str]] = {}

    def committed(self, name: str, version: str) -> bool:
        """Whether the lock commits the patch on that pin."""
        statuses = {o.get("name"): o.get("status") for o in self.lock.get(version, {}).get("patches", [])}
        return statuses.get(name) in APPLIED_STATES

    def nearest_committed(self, name: str, version: str, pinned: list[str]) -> str | None:
        """The pin nearest ``version`` (the older first on a tie) on which the lock commits the patch."""
        ordered = sorted(pinned, key=Version)
        at = ordered.index(version)
        others = [v for v in ordered if v != version and self.committed(name, v)]
        return min(others, key=lambda v: (abs(ordered.index(v) - at), Version(v) > Version(version)), default=None)

    def __call__(self, name: str, rendition, version: str) -> str | None:
        if not self.committed(name, version):
            return None
        if version not in self.made:
            pin = self.project.pins().select([version])[0]
            with locked_series(self.project, pin) as locked:
                self.made[version] = {
                    patch: commit_as_patch(locked.repo, commit, zero_commit=True).decode()
                    for (patch, _), commit in zip(locked.renditions, locked.commits)
                }
        text = self.made[version].get(name)
        return with_message_of(rendition, text) if text else None


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
        # The oldest pin left out is older than every pin left: ported back from its neighbour.
        report = rebase_onto(Project(copy, sealed=True), version, write=write, backwards=True)
    except SglpatchError as exc:
        return {"version": version, "ported": False, "identical": False, "seconds": time.perf_counter() - started,
                "patches": [], "error": str(exc), "removed": removed, "cells": []}
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
        "cells": report.cells, "cells_replayed": report.cells_replayed,
    }
