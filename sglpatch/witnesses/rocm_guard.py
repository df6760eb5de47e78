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
answer is kept under a digest of its preprocessed input (``HipToolchain.pass_key``); the same
input is never compiled twice, and the host pass, which reads the same for both architectures,
once.

The compilers of the two compiling levels are in ``hip_toolchain``, the translation unit and the
judging of a compiler's failure in ``guard_kernel``; this module is the witness, the tvm-ffi
headers it compiles against, the include-graph level and the CUDA side (``cuda_check``).
"""

from __future__ import annotations

import functools
import hashlib
import re
import shutil
import sys
import tempfile
import zipfile
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import SglpatchError, Unavailable
from sglpatch.plumbing.processes import pip_env
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import guard_kernel, hip_toolchain
from sglpatch.witnesses.guard_kernel import (CUDA_HEADERS, HEADER, KernelLayout, first_error, fp8_macro,
                                             in_kernel_sources, kernel_layout, per_arch, run_or_unavailable,
                                             translation_unit, tree_relative)
from sglpatch.witnesses.hip_toolchain import (ARCHES, COMPILE_TIMEOUT_S, PREPROCESS_TIMEOUT_S, QUERY_TIMEOUT_S,
                                              HipToolchain, RocmInstallation, remembered_compile)
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult

DOWNLOAD_TIMEOUT_S = 300

# apache-tvm-ffi wheels whose headers the pins' loaders compile against; only the headers are used,
# and the CPython 3.11 x86_64 wheel is fetched whatever the local Python, so the hash is fixed.
TVM_FFI_WHEELS = {
    "0.1.9": "21365abd2a2a1a6d3b4e6e4f048309651125becfa795440c3607f3cc27d30ac7",
    "0.1.11": "87f84e7c2393fadac340fd179a631a697effe54d7317b2543e0930452a0a673d",
}


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
        """What, besides the tree, decides the answer: the witness's code (this module, the kernel
        unit's and the compilers'), the toolchain's pinned stamp (or "none") and the level that
        would run with its architectures or host compiler, and the tvm-ffi version the pin
        requires. A change of any of them re-runs the witness."""
        code = hashlib.sha256()
        for path in (__file__, guard_kernel.__file__, hip_toolchain.__file__):
            code.update(Path(path).read_bytes())
        parts = [f"code {code.hexdigest()}"]
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


def required_tvm_ffi(pin: Pin) -> str:
    """The apache-tvm-ffi version the pin's metadata asks for (the newest pinned one in a range)."""
    metadata = pristine_tree.pin_metadata(pin)
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
            run = run_or_unavailable(
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


def _host_compiler() -> str | None:
    return shutil.which("g++") or shutil.which("c++")


@functools.lru_cache(maxsize=4)
def _host_compiler_identity() -> str:
    compiler = _host_compiler()
    if compiler is None:
        return "no host compiler"
    try:
        version = run_or_unavailable([compiler, "--version"], f"{compiler} --version", QUERY_TIMEOUT_S).stdout
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
            return WitnessResult(name, state, level, per_arch(outcomes, hit))
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
            run = run_or_unavailable(command, f"{Path(compiler).name} (include-graph {arch})", PREPROCESS_TIMEOUT_S)
        except Unavailable as exc:
            return UNAVAILABLE, str(exc)
    if run.returncode != 0:
        return UNAVAILABLE, f"the preprocessor failed: {first_error(run.stderr)}"
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
            shown = f"{Path(path).name} (included from {tree_relative(includer) if includer else 'the translation unit'})"
            (hits if includer and in_kernel_sources(includer, layout) else foreign).add(shown)
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
                run = run_or_unavailable([nvcc, *flags, "-c", str(unit), "-o", str(Path(work) / "cuda.o")], f"nvcc ({arch})",
                           COMPILE_TIMEOUT_S)
            except Unavailable as exc:
                return UNAVAILABLE, str(exc)
            return (CLEAN, f"compiled for {arch}") if run.returncode == 0 else (BUG, first_error(run.stderr))

        state, detail = remembered_compile(_nvcc_key(nvcc, flags, unit, layout), compile_)
    return WitnessResult("rocm-guard/cuda", state, f"nvcc {arch}", detail)


def _nvcc_key(nvcc: str, flags: list[str], unit: Path, layout: KernelLayout) -> str | None:
    root = layout.checkout
    try:
        version = run_or_unavailable([nvcc, "--version"], "nvcc --version", PREPROCESS_TIMEOUT_S)
        run = run_or_unavailable([nvcc, *flags, "-E", str(unit)], "nvcc -E", PREPROCESS_TIMEOUT_S)
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
