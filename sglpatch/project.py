"""The repository's layout: the folder holding ``upstream/pins.toml``, ``patches/`` and
``series.lock``; applied trees land in ``build/trees/<version>`` and the report in
``build/apply-report.json`` unless told otherwise. Light on purpose: every command starts here,
so it imports only what reading the pins takes, the series when asked (``sglpatch pins`` starts fast);
applying the series to pins is ``sglpatch.apply_pins``.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from sglpatch.errors import SglpatchError
from sglpatch.pins import Pins, load_pins

if TYPE_CHECKING:
    from sglpatch.series import Series

OUT_ENV = "SGLPATCH_OUT_DIR"
LOCK_FILE = "series.lock"  # sglpatch.lock reads and writes it


@dataclass(frozen=True)
class Project:
    root: Path

    @classmethod
    def find(cls, start: Path | None = None) -> "Project":
        here = (start or Path.cwd()).resolve()
        for candidate in (here, *here.parents):
            if (candidate / "upstream" / "pins.toml").is_file() and (candidate / "patches").is_dir():
                return cls(candidate)
        raise SglpatchError(f"{here}: not inside an sglpatch project (no upstream/pins.toml and patches/)")

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
        return Path(os.environ.get(OUT_ENV) or self.root / "build")

    def pins(self) -> Pins:
        return load_pins(self.pins_file)

    def series(self) -> Series:
        # Imported here: reading the series (email, packaging's specifiers, git) costs a command that
        # only lists the pins 40% of its start.
        from sglpatch.series import load_series

        return load_series(self.patches_dir)
