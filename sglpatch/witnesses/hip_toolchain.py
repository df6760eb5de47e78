"""The HIP compilers the ``rocm-guard`` witness compiles the kernel unit with, strongest first:

- ``RocmInstallation``: the box's own ROCm (``$ROCM_PATH``, else ``/opt/rocm``) for the GPUs it
  has, level ``rocm-compile``;
- ``HipToolchain``: the private clang 22 + HIP headers + ROCm device libraries + sysroot of
  ``ci/install-hip-toolchain.sh``, level ``hip-compile``.

``HipToolchain.check`` compiles the unit as the two passes the driver would run inside one
``clang++ -x hip -c`` (host, device), each pass's answer remembered under a digest of its
preprocessed input (``HipToolchain.pass_key``), so the same input is never compiled twice.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import Unavailable
from sglpatch.plumbing.processes import declared_env
from sglpatch.witnesses.guard_kernel import (KernelLayout, fp8_macro, judge_compile, per_arch, run_or_unavailable,
                                             translation_unit)
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult

TOOLCHAIN_ENV = "SGLPATCH_HIP_TOOLCHAIN"
TOOLCHAIN_DIR = "clang-22"  # under the install root; see ci/install-hip-toolchain.sh
ARCHES = ("gfx942", "gfx950")  # MI300X and MI355X; compiled in this order
REQUIRED_ARCHES = ARCHES  # "clean" only when every one of these compiled

# Seconds before a subprocess is taken for hung. A compile of the real unit for one architecture
# takes 20-60 s on a shared 2-core machine.
COMPILE_TIMEOUT_S = 900
SIDES = ("host", "device")  # the passes of one ``clang++ -x hip -c``, compiled and remembered apart
PREPROCESS_TIMEOUT_S = 300
QUERY_TIMEOUT_S = 60


@dataclass(frozen=True)
class HipToolchain:
    """The private clang + HIP headers + device libraries + sysroot of ci/install-hip-toolchain.sh."""

    clangxx: Path
    rocm_path: Path
    sysroot: Path | None = None
    stamp: str = "unstamped"
    llvm: str = ""
    level: str = "hip-compile"  # what its answers are recorded as ("rocm-compile": the box's own ROCm)

    @classmethod
    def find(cls) -> "HipToolchain | None":
        """The installed toolchain, or None where it is missing, half-installed or was installed
        for another path (its binaries carry absolute paths)."""
        prefix = Path(os.environ.get(TOOLCHAIN_ENV) or cache.cache_root() / "hip-toolchain")
        home = prefix / TOOLCHAIN_DIR
        try:
            manifest = json.loads((home / "toolchain.json").read_text())
            stamp = (home / ".stamp").read_text().strip()
            clangxx, rocm = Path(manifest["clangxx"]), Path(manifest["rocm_path"])
            sysroot = Path(manifest["sysroot"]) if manifest.get("sysroot") else None
        except (OSError, ValueError, KeyError, TypeError):
            return None
        if stamp != manifest.get("stamp") or not clangxx.resolve().is_relative_to(home.resolve()):
            return None
        if clangxx.is_file() and (rocm / "include" / "hip" / "hip_runtime.h").is_file():
            return cls(clangxx, rocm, sysroot, stamp, str(manifest.get("llvm", "")))
        return None

    def knows(self, arch: str) -> bool:
        return arch in _supported_cpus(str(self.clangxx), self.stamp)

    def flags(self, layout: KernelLayout, tvm_include: Path, arch: str) -> list[str]:
        common = ["-fPIC", "-D__HIP_PLATFORM_AMD__=1", "-fno-gpu-rdc", f"--offload-arch={arch}", "-DUSE_ROCM"]
        common += ["-std=c++20", "-O3", fp8_macro(arch)]
        if self.sysroot is not None:
            # The host side's libstdc++ and glibc headers come with the toolchain, so the answer
            # does not depend on what the machine has installed.
            common.insert(0, f"--sysroot={self.sysroot}")
        if layout.loader == "tvm-ffi":
            # tvm_ffi.cpp's HIP build puts its own defaults first and the include folders twice.
            return ["-std=c++17", "-O2", *common, f"-I{tvm_include}", f"-I{tvm_include}",
                    f"-I{self.rocm_path / 'include'}", f"-I{layout.root / 'include'}"]
        return [*common, f"-I{tvm_include}", f"-I{self.rocm_path / 'include'}", f"-I{layout.root / 'include'}"]

    def compile_pass(self, unit: Path, layout: KernelLayout, tvm_include: Path, arch: str, side: str) -> tuple[str, str]:
        """(state, detail) of one pass (``host`` or ``device``) of compiling ``unit`` for ``arch``,
        as the driver runs it inside one ``clang++ -x hip -c``.

        The answer is remembered under a digest of the pass's input (``pass_key``), so a release
        whose preprocessed kernel unit is that of another is not compiled again, nor is the host
        pass of the second architecture where it reads what the first one did; one process or
        thread compiles a pass while the others asking for it wait and read its answer. A compile
        that could not run is never remembered."""
        key = self.pass_key(unit, layout, tvm_include, arch, side)
        return remembered_compile(key, lambda: self._compile(unit, layout, tvm_include, arch, side))

    def _compile(self, unit: Path, layout: KernelLayout, tvm_include: Path, arch: str, side: str) -> tuple[str, str]:
        command = [str(self.clangxx), "-x", "hip", f"--rocm-path={self.rocm_path}",
                   *self.flags(layout, tvm_include, arch), f"--offload-{side}-only",
                   "-c", str(unit), "-o", str(unit.with_suffix(f".{arch}.{side}.o"))]
        try:
            run = run_or_unavailable(command, f"clang++ ({self.level} {arch}, {side} pass)", COMPILE_TIMEOUT_S,
                       env=declared_env(extra={"HIP_PLATFORM": "amd"}))
        except Unavailable as exc:
            return UNAVAILABLE, str(exc)
        return (CLEAN, "") if run.returncode == 0 else judge_compile(run.stderr, layout)

    def pass_key(self, unit: Path, layout: KernelLayout, tvm_include: Path, arch: str, side: str) -> str | None:
        """A digest of what one pass compiles: the toolchain's pinned stamp, the pass, the flags
        that reach the compiler proper, and the unit as the preprocessor hands it on (every file it
        reaches, line markers included, with the checkout's and the unit's folders taken out).
        The ``-D`` and ``-I`` flags are in that text already. The host pass does not name the
        architecture: the driver gives the host compiler the same command for each, but for
        those flags and the unit's id (measured with clang 22). None when the preprocessor
        fails (a missing header): then the pass is compiled, and not remembered by this key."""
        root = layout.checkout
        flags = self.flags(layout, tvm_include, arch)
        command = [str(self.clangxx), "-x", "hip", f"--rocm-path={self.rocm_path}", *flags,
                   f"--offload-{side}-only", "-E", str(unit)]
        try:
            run = run_or_unavailable(command, f"clang++ -E ({self.level} {arch}, {side} pass)", PREPROCESS_TIMEOUT_S,
                       env=declared_env(extra={"HIP_PLATFORM": "amd"}))
        except Unavailable:
            return None
        if run.returncode != 0:
            return None
        compiler = [flag for flag in flags if not flag.startswith(("-D", "-I", "--sysroot="))]
        if side == "host":
            compiler = [flag for flag in compiler if not flag.startswith("--offload-arch=")]
        text = run.stdout.replace(root, "<tree>").replace(str(unit.parent), "<unit>")
        digest = hashlib.sha256(f"rocm-guard-compile-2\0{self.stamp}\0{side}\0".encode())
        digest.update("\0".join(compiler).encode() + b"\0" + text.encode(errors="surrogateescape"))
        return digest.hexdigest()[:32]

    def check(self, name: str, layout: KernelLayout, tvm_include: Path,
              arches: tuple[str, ...] = ARCHES, required: tuple[str, ...] = REQUIRED_ARCHES) -> WitnessResult:
        compiler = f"clang {re.sub(r'^[0-9]+:', '', self.llvm)}".strip()  # the Debian version, less its epoch
        try:
            unknown = [arch for arch in arches if not self.knows(arch)]
        except Unavailable as exc:
            return WitnessResult(name, UNAVAILABLE, self.level, str(exc))
        tried = [arch for arch in arches if arch not in unknown]
        with tempfile.TemporaryDirectory() as work:
            unit = Path(work) / "cuda.cu"
            unit.write_text(translation_unit(layout))
            # Every pass of every architecture side by side: each compiler is single-threaded.
            # A host pass two architectures share is compiled by one, the other waits for it.
            passes = [(arch, side) for arch in tried for side in SIDES]
            with ThreadPoolExecutor(max_workers=max(1, len(passes))) as pool:
                answers = dict(zip(passes, pool.map(lambda p: self.compile_pass(unit, layout, tvm_include, *p), passes)))
            outcomes = {}
            for arch in tried:
                failed = [answers[arch, side] for side in SIDES if answers[arch, side][0] != CLEAN]
                outcomes[arch] = failed[0] if failed else (CLEAN, f"{arch} ({fp8_macro(arch)[2:]})")
        bugs = [arch for arch in tried if outcomes[arch][0] == BUG]
        if bugs:
            return WitnessResult(name, BUG, f"{self.level} {','.join(bugs)}", per_arch(outcomes, bugs))
        failed = [arch for arch in tried if outcomes[arch][0] == UNAVAILABLE]
        compiled = [arch for arch in tried if outcomes[arch][0] == CLEAN]
        level = f"{self.level} {','.join(compiled)}" if compiled else self.level
        if failed:
            return WitnessResult(name, UNAVAILABLE, level, per_arch(outcomes, failed))
        missing = [arch for arch in required if arch not in compiled]
        if missing:
            what = f"compiled for {', '.join(compiled)}" if compiled else "nothing compiled"
            return WitnessResult(name, UNAVAILABLE, level,
                                 f"{what}; not compiled: {', '.join(missing)} (unknown to {compiler} at {self.clangxx})")
        return WitnessResult(name, CLEAN, level,
                             f"compiled with {compiler} for {', '.join(outcomes[arch][1] for arch in compiled)}")


ROCM_ENV = "ROCM_PATH"
ROCM_DEFAULT = Path("/opt/rocm")


@dataclass(frozen=True)
class RocmInstallation:
    """The box's own ROCm (``$ROCM_PATH``, else ``/opt/rocm``): its clang, its HIP headers and
    device libraries, and the GPU architectures the box has (``rocm_agent_enumerator``). Where it
    is present, the strongest proof is that compiler for those GPUs (level ``rocm-compile``);
    the pinned Debian toolchain stays the level CI, which has no ROCm, runs at."""

    toolchain: HipToolchain
    arches: tuple[str, ...]

    @classmethod
    def find(cls) -> "RocmInstallation | None":
        root = Path(os.environ.get(ROCM_ENV) or ROCM_DEFAULT)
        clangxx = root / "llvm" / "bin" / "clang++"
        if not (clangxx.is_file() and (root / "include" / "hip" / "hip_runtime.h").is_file()):
            return None
        arches = _box_arches(str(root))
        if not arches:
            return None  # a ROCm without a GPU it can see: nothing of the box's to compile for
        try:
            version = (root / ".info" / "version").read_text().strip()
        except OSError:
            version = "unknown version"
        stamp = hashlib.sha256(f"{root}\0{version}\0{_binary_identity(clangxx)}".encode()).hexdigest()[:16]
        return cls(HipToolchain(clangxx, root, None, f"rocm-{stamp}", f"ROCm {version}", "rocm-compile"), arches)


@functools.lru_cache(maxsize=4)
def _box_arches(root: str) -> tuple[str, ...]:
    """The box's GPU architectures as ROCm enumerates them (``gfx000``, the CPU agent, left out;
    target features such as ``:sramecc+`` cut)."""
    enumerator = Path(root) / "bin" / "rocm_agent_enumerator"
    if not enumerator.is_file():
        return ()
    try:
        run = run_or_unavailable([str(enumerator)], "rocm_agent_enumerator", QUERY_TIMEOUT_S)
    except Unavailable:
        return ()
    found = {line.strip().split(":")[0] for line in run.stdout.splitlines() if re.match(r"^gfx[0-9a-f]+", line.strip())}
    return tuple(sorted(found - {"gfx000"}))


COMPILES = cache.Memo("rocm-guard-compile")  # by ``HipToolchain.pass_key`` (and ``cuda_check``'s key)


def remembered_compile(key: str | None, compile_: Callable[[], tuple[str, str]]) -> tuple[str, str]:
    """``compile_()``'s (state, detail), kept under ``key``: one process or thread compiles while
    the others asking for the same key wait and read its answer. Without a key it just compiles;
    a compile that could not run is never kept."""
    state, detail = COMPILES.remember(key, lambda: list(compile_()), keep=lambda answer: answer[0] != UNAVAILABLE)
    return state, detail


@functools.lru_cache(maxsize=8)
def _supported_cpus(clangxx: str, stamp: str) -> frozenset[str]:
    """The GPU targets the compiler knows, remembered by the binary (its resolved path, size and
    time) and the toolchain's stamp: a warm run starts no compiler to ask."""
    try:
        key = hashlib.sha256(f"{_binary_identity(Path(clangxx))}\0{stamp}".encode()).hexdigest()[:32]
    except OSError:
        key = None

    def ask() -> list[str]:
        run = run_or_unavailable([clangxx, "--target=amdgcn-amd-amdhsa", "-nogpulib", "--print-supported-cpus"],
                   "clang++ --print-supported-cpus", QUERY_TIMEOUT_S)
        return sorted(set(re.findall(r"\bgfx[0-9a-f]+\b", run.stdout + run.stderr)))

    return frozenset(SUPPORTED_CPUS.remember(key, ask, keep=bool))


SUPPORTED_CPUS = cache.Memo("clang-supported-cpus")


def _binary_identity(path: Path) -> str:
    """A compiler binary as far as a remembered answer about it goes: where it really is, its size
    and time (a reinstall or an upgrade in place changes them)."""
    binary = path.resolve()
    seen = binary.stat()
    return f"{binary}\0{seen.st_size}\0{seen.st_mtime_ns}"
