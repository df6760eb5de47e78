"""Witness ``rocm-guard``: the fused multi-step metadata kernel must compile for ROCm.

It compiles the kernel's translation unit the way the pin's own JIT loader does on a HIP build:
the same generated ``cuda.cu`` (tvm-ffi headers, the kernel header, the exported instantiations
the Python caller asks for), the same flags (``-DUSE_ROCM``, ``-D__HIP_PLATFORM_AMD__``, the
loader's FP8 macro for each architecture and its include folders) and the tvm-ffi headers of the
version the pin requires. On the unpatched 0.5.10-0.5.14 this fails with "'cuda_runtime.h' file
not found".

Three levels, the strongest first, and the result says which ran:

- ``rocm-compile``: on a box with ROCm installed (``$ROCM_PATH``, else ``/opt/rocm``), ROCm's own
  clang, headers and device libraries, for the GPU architectures the box has.
- ``hip-compile``: clang 22 with HIP 7.2.4 headers, ROCm 7.2.4 device libraries and a private
  sysroot, all from Debian and pinned by ``ci/install-hip-toolchain.sh``, compiling for gfx942
  (MI300X, FNUZ fp8) and gfx950 (MI355X, OCP e4m3 fp8). clang 19, the newest LLVM bookworm has,
  does not know gfx950; that script says which other compilers were tried and why not.
- ``include-graph``: without that toolchain, the host preprocessor walks the same translation unit
  with the loader's ROCm macros, once per architecture with its own (the FP8 type), as
  hip-compile compiles once per architecture. Weaker (nothing is compiled) but real.

The answer names this bug only: ``bug`` means a CUDA runtime header was reached (or not found)
from the pin's own kernel sources under the ROCm build. Any other failure (another missing
header, a syntax error, a compiler crash or hang) is ``unavailable`` with the compiler's first
error, and ``clean`` means every required architecture compiled.

A compile takes 15-60 s per architecture, most of it the host pass, and most releases share their
kernel sources with the release before or with their own patched tree. So each architecture's
compile runs as the two passes the driver would run inside it (host, device), and each pass's
answer is kept under a digest of its preprocessed input (``HipToolchain.pass_key``); the same input
is never compiled twice, and the host pass, which reads the same for both architectures, once.
"""

from __future__ import annotations

import functools
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Callable
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch import cache, sources
from sglpatch.errors import SglpatchError, Unavailable
from sglpatch.pins import Pin
from sglpatch.processes import declared_env, pip_env, run_tool
from sglpatch.witnesses import BUG, CLEAN, UNAVAILABLE, WitnessResult

TOOLCHAIN_ENV = "SGLPATCH_HIP_TOOLCHAIN"
TOOLCHAIN_DIR = "clang-22"  # under the install root; see ci/install-hip-toolchain.sh
ARCHES = ("gfx942", "gfx950")  # MI300X and MI355X; compiled in this order
REQUIRED_ARCHES = ARCHES  # "clean" only when every one of these compiled
HEADER = "csrc/elementwise/fused_metadata_copy.cuh"
CUDA_HEADERS = re.compile(r"^cuda(_runtime|_runtime_api|_fp16|_bf16|_fp8)?\.h$")

# Seconds before a subprocess is taken for hung. A compile of the real unit for one architecture
# takes 20-60 s on a shared 2-core machine.
COMPILE_TIMEOUT_S = 900
SIDES = ("host", "device")  # the passes of one ``clang++ -x hip -c``, compiled and remembered apart
PREPROCESS_TIMEOUT_S = 300
QUERY_TIMEOUT_S = 60
DOWNLOAD_TIMEOUT_S = 300

# apache-tvm-ffi wheels whose headers the pins' loaders compile against; only the headers are used,
# and the CPython 3.11 x86_64 wheel is fetched whatever the local Python, so the hash is fixed.
TVM_FFI_WHEELS = {
    "0.1.9": "21365abd2a2a1a6d3b4e6e4f048309651125becfa795440c3607f3cc27d30ac7",
    "0.1.11": "87f84e7c2393fadac340fd179a631a697effe54d7317b2543e0930452a0a673d",
}


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


class RocmGuardWitness:
    name = "rocm-guard"
    version = "2"

    def run(self, tree: Path, pin: Pin) -> WitnessResult:
        layout = kernel_layout(tree)
        if layout is None:
            return WitnessResult(self.name, UNAVAILABLE, detail=f"no {HEADER} in this tree")
        try:
            tvm_include = tvm_ffi_headers(required_tvm_ffi(pin))
            box = RocmInstallation.find()
            if box is not None:
                return box.toolchain.check(self.name, layout, tvm_include, box.arches, box.arches)
            toolchain = HipToolchain.find()
            if toolchain is None:
                return include_graph_check(self.name, layout, tvm_include)
            return toolchain.check(self.name, layout, tvm_include)
        except SglpatchError as exc:
            return WitnessResult(self.name, UNAVAILABLE, detail=str(exc))

    def fingerprint(self, pin: Pin) -> str:
        """What, besides the tree, decides the answer: this module's code, the toolchain's pinned
        stamp (or "none") and the level that would run with its architectures or host compiler,
        and the tvm-ffi version the pin requires. A change of any of them re-runs the witness."""
        parts = [f"code {hashlib.sha256(Path(__file__).read_bytes()).hexdigest()}"]
        box = RocmInstallation.find()
        toolchain = HipToolchain.find()
        if box is not None:
            parts += [f"rocm {box.toolchain.stamp}", f"level rocm-compile {','.join(box.arches)}"]
        elif toolchain is None:
            parts += ["toolchain none", f"level include-graph {','.join(ARCHES)} {_host_compiler_identity()}"]
        else:
            try:
                arches = ",".join(arch for arch in ARCHES if toolchain.knows(arch))
            except Unavailable as exc:
                arches = f"cannot tell: {exc}"
            parts += [f"toolchain {toolchain.stamp}", f"level hip-compile {arches}"]
        try:
            parts.append(f"tvm-ffi {required_tvm_ffi(pin)}")
        except SglpatchError as exc:
            parts.append(f"tvm-ffi unknown: {exc}")
        return hashlib.sha256("\n".join(parts).encode()).hexdigest()[:16]


# -- subprocesses ------------------------------------------------------------------------------


def _run(command: list[str], what: str, timeout: float, **kwargs) -> subprocess.CompletedProcess:
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


def required_tvm_ffi(pin: Pin) -> str:
    """The apache-tvm-ffi version the pin's metadata asks for (the newest pinned one in a range)."""
    metadata = sources.pin_metadata(pin)
    match = re.search(r"^Requires-Dist: apache-tvm-ffi\s*\(?([^;\n)]*)", metadata, re.MULTILINE)
    if not match:
        raise SglpatchError(f"{pin.artifact}: its metadata does not require apache-tvm-ffi")
    spec = SpecifierSet(match.group(1).replace(" ", ""))
    candidates = sorted((v for v in TVM_FFI_WHEELS if spec.contains(Version(v))), key=Version)
    if not candidates:
        raise SglpatchError(
            f"{pin.artifact} requires apache-tvm-ffi {spec}, and no such version is pinned in "
            f"TVM_FFI_WHEELS ({__file__})"
        )
    return candidates[-1]


def tvm_ffi_headers(version: str) -> Path:
    """The include folder of apache-tvm-ffi ``version``, downloaded once (from the index of pip's
    own configuration) and checked by sha256."""
    folder = cache.cache_root() / "tvm-ffi" / version
    include = folder / "tvm_ffi" / "include"
    with cache.entry_lock(folder):
        if (folder / ".complete").exists():
            return include
        with tempfile.TemporaryDirectory() as download:
            run = _run(
                [
                    sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
                    "--implementation", "cp", "--abi", "cp311", "-d", download, f"apache-tvm-ffi=={version}",
                ],
                f"pip download apache-tvm-ffi=={version}",
                DOWNLOAD_TIMEOUT_S,
                env=pip_env(),
            )
            wheels = list(Path(download).glob("apache_tvm_ffi-*.whl"))
            if run.returncode != 0 or not wheels:
                raise Unavailable(f"cannot download apache-tvm-ffi {version}: {run.stderr.strip()[-300:]}")
            digest = hashlib.sha256(wheels[0].read_bytes()).hexdigest()
            if digest != TVM_FFI_WHEELS[version]:
                raise SglpatchError(
                    f"{wheels[0].name}: sha256 {digest} does not match the pinned {TVM_FFI_WHEELS[version]}; refusing it"
                )
            cache.remove(folder)
            with zipfile.ZipFile(wheels[0]) as archive:
                members = [n for n in archive.namelist() if n.startswith("tvm_ffi/include/")]
                archive.extractall(folder, members)
        (folder / ".complete").write_text(version + "\n")
    return include


# -- judging what the compiler said --------------------------------------------------------------

_MISSING_HEADER = re.compile(r"^(?P<file>[^\s:]+):(?P<line>\d+):\d+: fatal error: '(?P<header>[^']+)' file not found", re.M)


def _in_kernel_sources(path: str, layout: KernelLayout) -> bool:
    return Path(path).resolve().is_relative_to(layout.root.resolve())


def _tree_relative(text: str) -> str:
    """``text`` with absolute paths into a checkout cut to the tree-relative ``python/sglang/...``."""
    return re.sub(r"\S*/(python/sglang/)", r"\1", text)


def _first_error(stderr: str) -> str:
    """The first error line, with the temporary checkout's path cut to the tree-relative one."""
    lines = [line for line in stderr.splitlines() if re.search(r"\berror:", line)] or stderr.splitlines() or [""]
    return _tree_relative(lines[0].strip())[:300] or "no message"


def _judge_compile(stderr: str, layout: KernelLayout) -> tuple[str, str]:
    """(state, detail) for a compile that failed: ``bug`` only when a CUDA runtime header is not
    found from the pin's own kernel sources; anything else is not this witness's bug."""
    for match in _MISSING_HEADER.finditer(stderr):
        if not CUDA_HEADERS.match(Path(match["header"]).name):
            continue
        where = f"{_tree_relative(match['file'])}:{match['line']}"
        if _in_kernel_sources(match["file"], layout):
            return BUG, f"'{match['header']}' not found under the ROCm build, included from {where}"
        return UNAVAILABLE, (f"'{match['header']}' is included from {where}, outside the pin's kernel "
                             "sources: not the guard this witness checks")
    return UNAVAILABLE, f"the compile failed for another reason: {_first_error(stderr)}"


# -- the two levels ----------------------------------------------------------------------------


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
        return _remembered(key, lambda: self._compile(unit, layout, tvm_include, arch, side))

    def _compile(self, unit: Path, layout: KernelLayout, tvm_include: Path, arch: str, side: str) -> tuple[str, str]:
        command = [str(self.clangxx), "-x", "hip", f"--rocm-path={self.rocm_path}",
                   *self.flags(layout, tvm_include, arch), f"--offload-{side}-only",
                   "-c", str(unit), "-o", str(unit.with_suffix(f".{arch}.{side}.o"))]
        try:
            run = _run(command, f"clang++ ({self.level} {arch}, {side} pass)", COMPILE_TIMEOUT_S,
                       env=declared_env(extra={"HIP_PLATFORM": "amd"}))
        except Unavailable as exc:
            return UNAVAILABLE, str(exc)
        return (CLEAN, "") if run.returncode == 0 else _judge_compile(run.stderr, layout)

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
            run = _run(command, f"clang++ -E ({self.level} {arch}, {side} pass)", PREPROCESS_TIMEOUT_S,
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
            return WitnessResult(name, BUG, f"{self.level} {','.join(bugs)}", _per_arch(outcomes, bugs))
        failed = [arch for arch in tried if outcomes[arch][0] == UNAVAILABLE]
        compiled = [arch for arch in tried if outcomes[arch][0] == CLEAN]
        level = f"{self.level} {','.join(compiled)}" if compiled else self.level
        if failed:
            return WitnessResult(name, UNAVAILABLE, level, _per_arch(outcomes, failed))
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
        run = _run([str(enumerator)], "rocm_agent_enumerator", QUERY_TIMEOUT_S)
    except Unavailable:
        return ()
    found = {line.strip().split(":")[0] for line in run.stdout.splitlines() if re.match(r"^gfx[0-9a-f]+", line.strip())}
    return tuple(sorted(found - {"gfx000"}))


COMPILES = cache.Memo("rocm-guard-compile")  # by ``HipToolchain.pass_key`` (and ``cuda_check``'s key)


def _remembered(key: str | None, compile_: Callable[[], tuple[str, str]]) -> tuple[str, str]:
    """``compile_()``'s (state, detail), kept under ``key``: one process or thread compiles while
    the others asking for the same key wait and read its answer. Without a key it just compiles;
    a compile that could not run is never kept."""
    state, detail = COMPILES.remember(key, lambda: list(compile_()), keep=lambda answer: answer[0] != UNAVAILABLE)
    return state, detail


def _per_arch(outcomes: dict[str, tuple[str, str]], arches: list[str]) -> str:
    """One line per distinct detail, naming the architectures that gave it."""
    by_detail: dict[str, list[str]] = {}
    for arch in arches:
        by_detail.setdefault(outcomes[arch][1], []).append(arch)
    return "; ".join(f"{', '.join(group)}: {detail}" for detail, group in by_detail.items())


@functools.lru_cache(maxsize=8)
def _supported_cpus(clangxx: str, stamp: str) -> frozenset[str]:
    """The GPU targets the compiler knows, remembered by the binary (its resolved path, size and
    time) and the toolchain's stamp: a warm run starts no compiler to ask."""
    try:
        key = hashlib.sha256(f"{_binary_identity(Path(clangxx))}\0{stamp}".encode()).hexdigest()[:32]
    except OSError:
        key = None

    def ask() -> list[str]:
        run = _run([clangxx, "--target=amdgcn-amd-amdhsa", "-nogpulib", "--print-supported-cpus"],
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


def _host_compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


@functools.lru_cache(maxsize=4)
def _host_compiler_identity() -> str:
    compiler = _host_compiler()
    if compiler is None:
        return "no host compiler"
    try:
        version = _run([compiler, "--version"], f"{compiler} --version", QUERY_TIMEOUT_S).stdout
    except Unavailable as exc:
        return f"{compiler} ({exc})"
    return f"{compiler} {version.splitlines()[0] if version else ''}".strip()


# Headers the ROCm build finds in the HIP installation, absent without the toolchain: the
# include-graph level cannot follow them, and that is all it may leave unfollowed.
_HIP_PLATFORM_HEADER = re.compile(r"^hip/")


def include_graph_check(name: str, layout: KernelLayout, tvm_include: Path, arches: tuple[str, ...] = ARCHES) -> WitnessResult:
    """Without a HIP compiler: does the ROCm preprocessing of the unit reach a CUDA runtime header?
    Once per architecture, with the macros the loader sets for it (its FP8 type), as hip-compile
    compiles once per architecture: ``bug`` where any reaches one, ``clean`` only where none does."""
    compiler = _host_compiler()
    if compiler is None:
        return WitnessResult(name, UNAVAILABLE, detail="neither the HIP toolchain nor a host C++ compiler is installed")
    outcomes = {arch: _include_graph(compiler, layout, tvm_include, arch) for arch in arches}
    level = f"include-graph {','.join(arches)}"
    for state in (BUG, UNAVAILABLE):
        hit = [arch for arch in arches if outcomes[arch][0] == state]
        if hit:
            return WitnessResult(name, state, level, _per_arch(outcomes, hit))
    return WitnessResult(name, CLEAN, level, f"no CUDA runtime header is reached under -DUSE_ROCM for {', '.join(arches)}")


def _include_graph(compiler: str, layout: KernelLayout, tvm_include: Path, arch: str) -> tuple[str, str]:
    """(state, detail) of one architecture's ROCm preprocessing of the unit."""
    with tempfile.TemporaryDirectory() as work:
        unit = Path(work) / "cuda.cu"
        unit.write_text(translation_unit(layout))
        # Empty stand-ins, searched last, make a reached CUDA header visible in the -H tree.
        standins = Path(work) / "cuda-standins"
        standins.mkdir()
        for header in ("cuda_runtime.h", "cuda_runtime_api.h", "cuda.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h"):
            (standins / header).write_text("")
        command = [compiler, "-x", "c++", "-std=c++20", "-DUSE_ROCM", "-D__HIP_PLATFORM_AMD__=1", "-D__HIPCC__=1",
                   "-D__HIP__=1", fp8_macro(arch), f"-I{tvm_include}", f"-I{layout.root / 'include'}",
                   "-idirafter", str(standins), "-M", "-MG", "-H", str(unit)]
        try:
            run = _run(command, f"{Path(compiler).name} (include-graph {arch})", PREPROCESS_TIMEOUT_S)
        except Unavailable as exc:
            return UNAVAILABLE, str(exc)
    if run.returncode != 0:
        return UNAVAILABLE, f"the preprocessor failed: {_first_error(run.stderr)}"
    hits, foreign = _cuda_headers_reached(run.stderr, layout)
    if hits:
        return BUG, f"ROCm build reaches {hits}"
    if foreign:
        return UNAVAILABLE, f"ROCm build reaches {foreign}, outside the pin's kernel sources: not the guard this witness checks"
    unfollowed = [dep for dep in _dependencies(run.stdout) if not Path(dep).is_absolute() and not _HIP_PLATFORM_HEADER.match(dep)]
    if unfollowed:
        return UNAVAILABLE, f"header not found, so its includes could not be followed: {', '.join(unfollowed)}"
    return CLEAN, f"{arch} ({fp8_macro(arch)[2:]})"


def _dependencies(make_rule: str) -> list[str]:
    """The prerequisites of the ``-M`` rule; with ``-MG`` a header that was not found is listed as
    spelled in its #include, so it is the one that is not an absolute path."""
    body = make_rule.replace("\\\n", " ").partition(":")[2]
    return [dep.replace("\\ ", " ") for dep in re.findall(r"(?:\\ |\S)+", body)]


def _cuda_headers_reached(include_tree: str, layout: KernelLayout) -> tuple[str, str]:
    """(reached from the pin's kernel sources, reached from elsewhere), each a readable list."""
    parents: dict[int, str] = {}
    hits, foreign = set(), set()
    for line in include_tree.splitlines():
        match = re.match(r"^(\.+) (.*)$", line)
        if not match:
            continue
        depth, path = len(match.group(1)), match.group(2)
        parents[depth] = path
        if CUDA_HEADERS.match(Path(path).name):
            includer = parents.get(depth - 1)
            shown = f"{Path(path).name} (included from {_tree_relative(includer) if includer else 'the translation unit'})"
            (hits if includer and _in_kernel_sources(includer, layout) else foreign).add(shown)
    return "; ".join(sorted(hits)), "; ".join(sorted(foreign))


def cuda_check(layout: KernelLayout, tvm_include: Path, arch: str = "sm_90") -> WitnessResult:
    """The CUDA side of the same unit with ``nvcc``, as the loader builds it; unavailable without
    nvcc. Its answer is kept under a digest of nvcc's version, the flags, the unit as the host
    preprocessor hands it on and every file of the kernel sources (where a device-only include
    lives), so the same input is compiled once."""
    nvcc = shutil.which("nvcc")
    if nvcc is None:
        return WitnessResult("rocm-guard/cuda", UNAVAILABLE, detail="nvcc is not on PATH")
    number = arch.removeprefix("sm_").rstrip("a")
    flags = ["-Xcompiler", "-fPIC", f"-gencode=arch=compute_{arch[3:]},code={arch}",
             f"-DSGL_CUDA_ARCH={int(number[:-1]) * 100 + int(number[-1]) * 10}",
             "-std=c++20", "-O3", "--expt-relaxed-constexpr", f"-I{tvm_include}", f"-I{layout.root / 'include'}"]
    with tempfile.TemporaryDirectory() as work:
        unit = Path(work) / "cuda.cu"
        unit.write_text(translation_unit(layout))

        def compile_() -> tuple[str, str]:
            try:
                run = _run([nvcc, *flags, "-c", str(unit), "-o", str(Path(work) / "cuda.o")], f"nvcc ({arch})",
                           COMPILE_TIMEOUT_S)
            except Unavailable as exc:
                return UNAVAILABLE, str(exc)
            return (CLEAN, f"compiled for {arch}") if run.returncode == 0 else (BUG, _first_error(run.stderr))

        state, detail = _remembered(_nvcc_key(nvcc, flags, unit, layout), compile_)
    return WitnessResult("rocm-guard/cuda", state, f"nvcc {arch}", detail)


def _nvcc_key(nvcc: str, flags: list[str], unit: Path, layout: KernelLayout) -> str | None:
    root = layout.checkout
    try:
        version = _run([nvcc, "--version"], "nvcc --version", PREPROCESS_TIMEOUT_S)
        run = _run([nvcc, *flags, "-E", str(unit)], "nvcc -E", PREPROCESS_TIMEOUT_S)
    except Unavailable:
        return None
    if version.returncode != 0 or run.returncode != 0:
        return None
    digest = hashlib.sha256(f"rocm-guard-nvcc-1\0{version.stdout}\0".encode())
    digest.update("\0".join(flag.replace(root, "<tree>") for flag in flags).encode())
    digest.update(run.stdout.replace(root, "<tree>").replace(str(unit.parent), "<unit>").encode(errors="surrogateescape"))
    for path in sorted(p for p in layout.root.rglob("*") if p.is_file()):
        digest.update(f"\0{path.relative_to(layout.root)}\0".encode() + path.read_bytes())
    return digest.hexdigest()[:32]
