"""The kernel the ``rocm-guard`` witness compiles: where a release keeps it, the translation unit
the pin's JIT loader generates for it, and what a compiler's failure on it means.

``judge_compile`` names this witness's bug only: a CUDA runtime header not found from the pin's
own kernel sources under the ROCm build. Shared by the compiling levels (``hip_toolchain``) and
the rest of the witness (``rocm_guard``).
"""

from __future__ import annotations

import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from sglpatch.plumbing.processes import run_tool
from sglpatch.witnesses.results import BUG, UNAVAILABLE

HEADER = "csrc/elementwise/fused_metadata_copy.cuh"
CUDA_HEADERS = re.compile(r"^cuda(_runtime|_runtime_api|_fp16|_bf16|_fp8)?\.h$")


@dataclass(frozen=True)
class KernelLayout:
    """Where a release keeps its JIT kernels and which loader builds them."""

    root: Path  # the folder holding include/ and csrc/
    loader: str  # "tvm-ffi" (tvm_ffi.cpp.load_inline, up to 0.5.16) or "ninja" (sglang's own, 0.5.19 on)

    @property
    def header(self) -> Path:
        return self.root / HEADER

    @property
    def checkout(self) -> str:
        """The checkout holding python/sglang/...: taken out of what is digested, so the same
        sources in another folder give the same key."""
        return str(self.root).rsplit("/python/sglang/", 1)[0]


def kernel_layout(tree: Path) -> KernelLayout | None:
    package = tree.resolve() / "python" / "sglang"
    for root, loader in ((package / "kernels" / "jit", "ninja"), (package / "jit_kernel", "tvm-ffi")):
        if (root / HEADER).is_file():
            return KernelLayout(root, loader)
    return None


def run_or_unavailable(command: list[str], what: str, timeout: float, **kwargs) -> subprocess.CompletedProcess:
    """``command`` with its output captured; a hang or a failure to start is ``Unavailable``
    naming ``what`` (the witness cannot tell without it)."""
    return run_tool(command, what, timeout, unavailable=True, **kwargs)


# -- what the pin's loader compiles ----------------------------------------------------------


def translation_unit(layout: KernelLayout) -> str:
    """The ``cuda.cu`` the loader generates for the two kernels the DSA backend asks for."""
    includes = ["container/tensor.h", "dtype.h", "error.h", "extra/c_env_api.h", "function.h"]
    lines = [f"#include <tvm/ffi/{name}>" for name in includes]
    if layout.loader == "tvm-ffi":
        lines.append("")
    lines.append(f'#include "{layout.header}"')
    exports = [
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_metadata_copy, (FusedMetadataCopyKernel<0, false, false>::run));",
        "TVM_FFI_DLL_EXPORT_TYPED_FUNC(fused_metadata_copy_multi, (FusedMetadataCopyMultiKernel<false, false>::run));",
    ]
    if layout.loader == "ninja":
        exports = ["namespace sglang {", *exports, "}  // namespace sglang"]
    return "\n".join(lines + exports) + "\n"


def fp8_macro(arch: str) -> str:
    # The loaders: FNUZ fp8 on gfx942, OCP e4m3 elsewhere (gfx950).
    return "-DHIP_FP8_TYPE_FNUZ=1" if "gfx942" in arch else "-DHIP_FP8_TYPE_E4M3=1"


# -- judging what the compiler said --------------------------------------------------------------

_MISSING_HEADER = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+):\d+: fatal error: '(?P<header>[^']+)' file not found", re.M)


def in_kernel_sources(path: str, layout: KernelLayout) -> bool:
    return Path(path).resolve().is_relative_to(layout.root.resolve())


def tree_relative(text: str) -> str:
    """``text`` with absolute paths into a checkout cut to the tree-relative ``python/sglang/...``."""
    return re.sub(r"\S*/(python/sglang/)", r"\1", text)


def first_error(stderr: str) -> str:
    """The first error line, with the temporary checkout's path cut to the tree-relative one."""
    lines = [line for line in stderr.splitlines() if re.search(r"\berror:", line)] or stderr.splitlines() or [""]
    return tree_relative(lines[0].strip())[:300] or "no message"


def judge_compile(stderr: str, layout: KernelLayout) -> tuple[str, str]:
    """(state, detail) for a compile that failed: ``bug`` only when a CUDA runtime header is not
    found from the pin's own kernel sources; anything else is not this witness's bug."""
    for match in _MISSING_HEADER.finditer(stderr):
        if not CUDA_HEADERS.match(Path(match["header"]).name):
            continue
        where = f"{tree_relative(match['file'])}:{match['line']}"
        if in_kernel_sources(match["file"], layout):
            return BUG, f"'{match['header']}' not found under the ROCm build, included from {where}"
        return UNAVAILABLE, (f"'{match['header']}' is included from {where}, outside the pin's kernel "
                             "sources: not the guard this witness checks")
    return UNAVAILABLE, f"the compile failed for another reason: {first_error(stderr)}"


def per_arch(outcomes: dict[str, tuple[str, str]], arches: list[str]) -> str:
    """One line per distinct detail, naming the architectures that gave it."""
    by_detail: dict[str, list[str]] = {}
    for arch in arches:
        by_detail.setdefault(outcomes[arch][1], []).append(arch)
    return "; ".join(f"{', '.join(group)}: {detail}" for detail, group in by_detail.items())
