"""The repository's layout: the folder holding ``upstream/pins.toml``, ``patches/`` and
``series.lock``; applied trees land in ``build/trees/<version>`` and the report in
``build/apply-report.json`` unless told otherwise. Light on purpose: every command starts here,
so it imports only what reading the pins takes, the series when asked (``sglpatch pins`` starts fast);
applying the series to pins is ``sglpatch.apply.apply_pins``. The project is ``--root``, else the one
around the current folder, else the clone sglpatch was installed from (``installed_clone``), so
the commands work from anywhere.
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources.pins import Pins, load_pins

if TYPE_CHECKING:
    from sglpatch.series.patches import Series

OUT_ENV = "SGLPATCH_OUT_DIR"
LOCK_FILE = "series.lock"  # sglpatch.series.lock reads and writes it


@dataclass(frozen=True)
class Project:
    root: Path
    # A staged or copied project (a rebase's staging, a leave-one-out copy) keeps every write under
    # its own root: ``$SGLPATCH_OUT_DIR`` would send its trees and records into the real build.
    sealed: bool = False

    @classmethod
    def find(cls, start: Path | None = None) -> "Project":
        """``start`` (``--root``) or the project around the current folder; from elsewhere, the
        clone sglpatch was installed from."""
        here = (start or Path.cwd()).resolve()
        for candidate in (here, *here.parents):
            if is_project(candidate):
                return cls(candidate)
        installed = installed_clone() if start is None else None
        if installed is not None:
            return cls(installed)
        where = "" if start is not None else ", and sglpatch was not installed from a clone of one"
        raise SglpatchError(f"{here}: not inside an sglpatch project (no upstream/pins.toml and patches/){where}; "
                            "run it in your clone of sglpatch or name it with --root")

    @property
    def pins_file(self) -> Path:
        return self.root / "upstream" / "pins.toml"

    @property
    def patches_dir(self) -> Path:
        return self.root / "patches"

    @property
    def lock_file(self) -> Path:
        return self.root / LOCK_FILE

    @property
    def build_dir(self) -> Path:
        if self.sealed:
            return self.root / "build"
        return Path(os.environ.get(OUT_ENV) or self.root / "build")

    def pins(self) -> Pins:
        return load_pins(self.pins_file)

    def series(self) -> Series:
        # Imported here: reading the series (email, packaging's specifiers, git) costs a command that
        # only lists the pins 40% of its start.
        from sglpatch.series.patches import load_series

        return load_series(self.patches_dir)


def is_project(folder: Path) -> bool:
    return (folder / "upstream" / "pins.toml").is_file() and (folder / "patches").is_dir()


def installed_clone(distribution=None, package_dir: Path | None = None) -> Path | None:
    """The sglpatch clone this sglpatch was installed from: the folder pip recorded as the
    source of the install (PEP 610's ``direct_url.json``, for ``pip install -e CLONE`` and
    ``pip install CLONE`` alike), else the folder above the imported package (an editable
    install, or the clone on ``PYTHONPATH``); None where neither holds a project."""
    if distribution is None:
        from importlib import metadata

        try:
            distribution = metadata.distribution("sglpatch")
        except metadata.PackageNotFoundError:
            distribution = None
    candidates = []
    recorded = distribution.read_text("direct_url.json") if distribution is not None else None
    if recorded:
        try:
            url = json.loads(recorded).get("url", "")
        except (ValueError, AttributeError):
            url = ""
        if url.startswith("file://"):
            from urllib.parse import unquote, urlparse

            candidates.append(Path(unquote(urlparse(url).path)))
    candidates.append((package_dir or Path(__file__).resolve().parents[1]).parent)
    return next((folder.resolve() for folder in candidates if is_project(folder)), None)
