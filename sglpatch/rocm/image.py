"""The patched image of a pin: built ``FROM`` the pin's released ROCm image (or any image given),
with the series' patch files for that pin applied to the sglang checkout inside it
(``/sgl-workspace/sglang`` in sglang's images, an editable install, so the patched code is what
runs), the check scripts (``sglpatch/rocm/checks/``) and the CPU probes' checkpoint generator
copied beside them, and our labels on it. What a matrix cell, the gate and the bench run in, and
what ``sglpatch image`` gives users.
"""

from __future__ import annotations

import io
import re
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sglpatch.apply.index_apply import commit_as_patch
from sglpatch.apply.pin_under_test import PinUnderTest
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.rocm.constants import (CHECKOUT, LABEL_BASE, LABEL_OWNER, LABEL_PIN, LABEL_SERIES_HASH, LABEL_SERIES_VERSION, OWNER,
                                     TOOLS_DIR)
from sglpatch.rocm.options import RocmOptions

CHECK_SCRIPTS = Path(__file__).parent / "checks"
# The CPU probes' checkpoint generator, run in the image to write the bug-level cells' checkpoint.
CHECKPOINT_SCRIPTS = tuple(Path(__file__).parent.parent / "witnesses" / "probes" / name
                           for name in ("glm_checkpoint.py", "quark_checkpoint.py"))

# Applies the patch files in order inside the image; git where the checkout is a repository (as in
# sglang's images), GNU patch otherwise. Any failure fails the build: no fuzz (a patch without
# --fuzz, such as busybox's, refuses the option and fails the build), no partial series.
APPLY_SCRIPT = """\
#!/bin/sh
set -eu
checkout="$1"
cd "$checkout"
# The first patch program on PATH, by its path: a busybox shell would run its own applet for a
# bare "patch" whatever PATH says.
patch_program=""
IFS=:
for dir in $PATH; do
    if [ -x "$dir/patch" ]; then patch_program="$dir/patch"; break; fi
done
unset IFS
for patch in "$(dirname "$0")"/patches/*.patch; do
    [ -e "$patch" ] || { echo "sglpatch: no patch for this pin; the image is the pristine release"; exit 0; }
    echo "sglpatch: applying $(basename "$patch") to $checkout"
    if command -v git >/dev/null 2>&1 && [ -d .git ]; then
        git -c core.fileMode=false apply --whitespace=nowarn "$patch" || failed=1
    elif [ -n "$patch_program" ]; then
        "$patch_program" -p1 --forward --fuzz=0 --batch < "$patch" || failed=1
    else
        echo "sglpatch: neither git nor patch in the image"; exit 1
    fi
    if [ -n "${failed:-}" ]; then echo "sglpatch: $(basename "$patch") does not apply to $checkout"; exit 1; fi
done
echo "sglpatch: series applied"
"""


@dataclass(frozen=True)
class PatchedImage:
    """What to build: one patched image per pin and series."""

    base_image: str
    pin: str
    series_version: str
    series_hash: str
    # (series name, the pin's own patch: its commit as git format-patch writes it), in order. Not the
    # rendition file: one that apply merged three-way gives the pin's change only through git's merge.
    patches: tuple[tuple[str, bytes], ...]
    tools: tuple[Path, ...] = ()  # check scripts copied to /opt/sglpatch/checks
    checkout: str = CHECKOUT

    @property
    def tag(self) -> str:
        return f"sglpatch/sglang:{self.pin}-s{self.series_version}-{self.series_hash[:12]}"

    @property
    def labels(self) -> dict[str, str]:
        return {
            LABEL_OWNER: OWNER,
            LABEL_PIN: self.pin,
            LABEL_SERIES_VERSION: self.series_version,
            LABEL_SERIES_HASH: self.series_hash,
            LABEL_BASE: self.base_image,
        }

    def dockerfile(self) -> str:
        return "\n".join(
            [
                f"FROM {self.base_image}",
                f"COPY sglpatch/ {TOOLS_DIR}/",
                f'RUN ["/bin/sh", "{TOOLS_DIR}/apply-series.sh", "{self.checkout}"]',
                "",
            ]
        )

    def context(self) -> bytes:
        """The build context as a tar: Dockerfile, the patches (numbered, in order), the tools."""
        buffer = io.BytesIO()
        with tarfile.open(fileobj=buffer, mode="w") as tar:
            _add(tar, "Dockerfile", self.dockerfile().encode())
            _add(tar, "sglpatch/apply-series.sh", APPLY_SCRIPT.encode(), 0o755)
            for number, (name, text) in enumerate(self.patches, 1):
                # The number keeps the series order in the script's glob; the name is the series'.
                _add(tar, f"sglpatch/patches/{number:03d}_{name}", text)
            for tool in self.tools:
                _add(tar, f"sglpatch/checks/{tool.name}", tool.read_bytes(), 0o755)
        return buffer.getvalue()


def _add(tar: tarfile.TarFile, name: str, data: bytes, mode: int = 0o644) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(data)
    info.mode = mode
    tar.addfile(info, io.BytesIO(data))


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


class BuildFailed(SglpatchError):
    pass


def build_image(client, spec: PatchedImage, on_log: Callable[[str], None] = print, *, pull: bool = False) -> str:
    """Build (the engine's layer cache makes a rebuild cheap) and return the image id, streaming the
    build log line by line to ``on_log``."""
    stream = client.api.build(
        fileobj=io.BytesIO(spec.context()),
        custom_context=True,
        tag=spec.tag,
        labels=spec.labels,
        rm=True,
        forcerm=True,
        pull=pull,
        decode=True,
    )
    image_id, tail = "", []
    for chunk in stream:
        if "stream" in chunk:
            # The engine colours a step's stderr; the log is for files and CI pages, so plain text.
            for line in _ANSI.sub("", chunk["stream"]).splitlines():
                tail = (tail + [line])[-40:]
                on_log(line)
        if "error" in chunk:
            raise BuildFailed(f"building {spec.tag} from {spec.base_image} failed: {chunk['error'].strip()}\n" + "\n".join(tail[-15:]))
        if "aux" in chunk and "ID" in chunk["aux"]:
            image_id = chunk["aux"]["ID"]
    if not image_id:
        image_id = client.images.get(spec.tag).id
    return image_id


def build_patched_image(client, put: PinUnderTest, options: RocmOptions, on_log=print) -> tuple[PatchedImage, str]:
    """The pin's patched image, built FROM its released image (the engine's layer cache makes a
    rebuild cheap): what a matrix cell runs in, and what ``sglpatch image`` gives users."""
    spec = patched_image(put, options)
    on_log(f"# building {spec.tag} FROM {spec.base_image}")
    return spec, build_image(client, spec, on_log)


def patched_image(put: PinUnderTest, options: RocmOptions) -> PatchedImage:
    patches = [(outcome.name, commit_as_patch(put.tree_path, outcome.commit)) for outcome in put.applied()]
    return image_spec(put.pin, put.series_version, put.series_hash, patches, options)


def image_spec(pin, series_version: str, series_hash: str, patches: list[tuple[str, bytes]],
               options: RocmOptions) -> PatchedImage:
    """The patched image of ``pin`` with ``patches`` ((series name, the pin's own patch), in order)."""
    return PatchedImage(
        base_image=options.image_for(pin.version, pin.rocm_image),
        pin=pin.version,
        series_version=series_version,
        series_hash=series_hash,
        patches=tuple(patches),
        tools=(*sorted(CHECK_SCRIPTS.glob("*.py")), *CHECKPOINT_SCRIPTS),
    )
