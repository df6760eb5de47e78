"""Witness ``rocm-guard``: the fused multi-step metadata kernel must compile for ROCm.

It compiles the kernel's translation unit the way the pin's own JIT loader does on a HIP build:
the same generated ``cuda.cu`` (tvm-ffi headers, the kernel header, the exported instantiations
the Python caller asks for), the same flags (``-DUSE_ROCM``, ``-D__HIP_PLATFORM_AMD__``, the
loader's FP8 macro and include folders) and the tvm-ffi headers of the version the pin requires.
On the unpatched 0.5.10-0.5.14 this fails with "'cuda_runtime.h' file not found".

Two levels, the stronger first, and the result says which ran:

- ``hip-compile``: clang 19 with HIP 7.2 headers and the ROCm device libraries, all from Debian and
  pinned by ``ci/install-hip-toolchain.sh``, compiling for gfx942 (and gfx950 where that clang
  knows it; clang 19 does not, and the result says so).
- ``include-graph``: without that toolchain, the host preprocessor walks the same translation unit
  with the loader's ROCm macros and fails if any CUDA runtime header is reached. Weaker (nothing is
  compiled) but real.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import subprocess
import tempfile
import zipfile
from dataclasses import dataclass
from pathlib import Path

from packaging.specifiers import SpecifierSet
from packaging.version import Version

from sglpatch import cache, sources
from sglpatch.errors import SglpatchError
from sglpatch.pins import Pin
from sglpatch.witnesses import BUG, CLEAN, UNAVAILABLE, WitnessResult

TOOLCHAIN_ENV = "SGLPATCH_HIP_TOOLCHAIN"
ARCHES = ("gfx942", "gfx950")
HEADER = "csrc/elementwise/fused_metadata_copy.cuh"
CUDA_HEADERS = re.compile(r"^cuda(_runtime|_runtime_api|_fp16|_bf16|_fp8)?\.h$")

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


def kernel_layout(tree: Path) -> KernelLayout | None:
    package = tree / "python" / "sglang"
    for root, loader in ((package / "kernels" / "jit", "ninja"), (package / "jit_kernel", "tvm-ffi")):
        if (root / HEADER).is_file():
            return KernelLayout(root, loader)
    return None


class RocmGuardWitness:
    name = "rocm-guard"
    version = "1"

    def run(self, tree: Path, pin: Pin) -> WitnessResult:
        layout = kernel_layout(tree)
        if layout is None:
            return WitnessResult(self.name, UNAVAILABLE, detail=f"no {HEADER} in this tree")
        try:
            tvm_include = tvm_ffi_headers(required_tvm_ffi(pin))
        except SglpatchError as exc:
            return WitnessResult(self.name, UNAVAILABLE, detail=str(exc))
        toolchain = HipToolchain.find()
        if toolchain is None:
            return include_graph_check(self.name, layout, tvm_include)
        return toolchain.check(self.name, layout, tvm_include)


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
    artifact = sources.fetch_artifact(pin)
    metadata = sources.artifact_metadata(artifact)
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
    """The include folder of apache-tvm-ffi ``version``, downloaded once and checked by sha256."""
    folder = cache.cache_root() / "tvm-ffi" / version
    include = folder / "tvm_ffi" / "include"
    with cache.entry_lock(folder):
        if (folder / ".complete").exists():
            return include
        with tempfile.TemporaryDirectory() as download:
            run = subprocess.run(
                [
                    "python3", "-m", "pip", "download", "--quiet", "--no-deps", "--only-binary=:all:",
                    "--platform", "manylinux_2_28_x86_64", "--python-version", "3.11",
                    "--implementation", "cp", "--abi", "cp311", "-d", download, f"apache-tvm-ffi=={version}",
                ],
                capture_output=True,
                text=True,
            )
            wheels = list(Path(download).glob("apache_tvm_ffi-*.whl"))
            if run.returncode != 0 or not wheels:
                raise SglpatchError(f"cannot download apache-tvm-ffi {version}: {run.stderr.strip()[-300:]}")
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


# -- the two levels ----------------------------------------------------------------------------


@dataclass(frozen=True)
class HipToolchain:
    """The private clang + HIP headers + device libraries of ci/install-hip-toolchain.sh."""

    clangxx: Path
    rocm_path: Path

    @classmethod
    def find(cls) -> "HipToolchain | None":
        prefix = Path(os.environ.get(TOOLCHAIN_ENV) or cache.cache_root() / "hip-toolchain")
        clangxx = prefix / "root" / "usr" / "lib" / "llvm-19" / "bin" / "clang++"
        rocm = prefix / "rocm"
        if clangxx.is_file() and (rocm / "include" / "hip" / "hip_runtime.h").is_file():
            return cls(clangxx, rocm)
        return None

    def knows(self, arch: str) -> bool:
        run = subprocess.run(
            [str(self.clangxx), "--target=amdgcn-amd-amdhsa", "-nogpulib", "--print-supported-cpus"],
            capture_output=True,
            text=True,
        )
        return re.search(rf"\b{arch}\b", run.stdout + run.stderr) is not None

    def flags(self, layout: KernelLayout, tvm_include: Path, arch: str) -> list[str]:
        common = ["-fPIC", "-D__HIP_PLATFORM_AMD__=1", "-fno-gpu-rdc", f"--offload-arch={arch}", "-DUSE_ROCM"]
        common += ["-std=c++20", "-O3", fp8_macro(arch)]
        if layout.loader == "tvm-ffi":
            # tvm_ffi.cpp's HIP build puts its own defaults first and the include folders twice.
            return ["-std=c++17", "-O2", *common, f"-I{tvm_include}", f"-I{tvm_include}",
                    f"-I{self.rocm_path / 'include'}", f"-I{layout.root / 'include'}"]
        return [*common, f"-I{tvm_include}", f"-I{self.rocm_path / 'include'}", f"-I{layout.root / 'include'}"]

    def check(self, name: str, layout: KernelLayout, tvm_include: Path) -> WitnessResult:
        compiled, skipped = [], []
        with tempfile.TemporaryDirectory() as work:
            unit = Path(work) / "cuda.cu"
            unit.write_text(translation_unit(layout))
            for arch in ARCHES:
                if not self.knows(arch):
                    skipped.append(f"{arch} (unknown to {self.clangxx.name} 19)")
                    continue
                command = [str(self.clangxx), "-x", "hip", f"--rocm-path={self.rocm_path}",
                           *self.flags(layout, tvm_include, arch), "-c", str(unit), "-o", str(Path(work) / f"{arch}.o")]
                run = subprocess.run(command, capture_output=True, text=True, env={**os.environ, "HIP_PLATFORM": "amd"})
                if run.returncode != 0:
                    return WitnessResult(name, BUG, f"hip-compile {arch}", _first_error(run.stderr))
                compiled.append(arch)
        detail = f"compiled for {', '.join(compiled)}"
        if skipped:
            detail += f"; not checked: {', '.join(skipped)}"
        return WitnessResult(name, CLEAN, f"hip-compile {','.join(compiled)}", detail)


def include_graph_check(name: str, layout: KernelLayout, tvm_include: Path) -> WitnessResult:
    """Without a HIP compiler: does the ROCm preprocessing of the unit reach a CUDA runtime header?"""
    compiler = shutil.which("g++") or shutil.which("c++")
    if compiler is None:
        return WitnessResult(name, UNAVAILABLE, detail="neither the HIP toolchain nor a host C++ compiler is installed")
    with tempfile.TemporaryDirectory() as work:
        unit = Path(work) / "cuda.cu"
        unit.write_text(translation_unit(layout))
        # Empty stand-ins, searched last, make a reached CUDA header visible in the -H tree.
        standins = Path(work) / "cuda-standins"
        standins.mkdir()
        for header in ("cuda_runtime.h", "cuda_runtime_api.h", "cuda.h", "cuda_fp16.h", "cuda_bf16.h", "cuda_fp8.h"):
            (standins / header).write_text("")
        command = [compiler, "-x", "c++", "-std=c++20", "-DUSE_ROCM", "-D__HIP_PLATFORM_AMD__=1", "-D__HIPCC__=1",
                   "-D__HIP__=1", fp8_macro("gfx942"), f"-I{tvm_include}", f"-I{layout.root / 'include'}",
                   "-idirafter", str(standins), "-M", "-MG", "-H", str(unit)]
        run = subprocess.run(command, capture_output=True, text=True)
    if run.returncode != 0:
        return WitnessResult(name, UNAVAILABLE, "include-graph", _first_error(run.stderr))
    reached = _cuda_headers_reached(run.stderr, layout)
    if reached:
        return WitnessResult(name, BUG, "include-graph", f"ROCm build reaches {reached}")
    return WitnessResult(name, CLEAN, "include-graph", "no CUDA runtime header is reached under -DUSE_ROCM")


def _cuda_headers_reached(include_tree: str, layout: KernelLayout) -> str:
    parents: dict[int, str] = {}
    hits = []
    for line in include_tree.splitlines():
        match = re.match(r"^(\.+) (.*)$", line)
        if not match:
            continue
        depth, path = len(match.group(1)), match.group(2)
        parents[depth] = path
        if CUDA_HEADERS.match(Path(path).name):
            includer = parents.get(depth - 1, "the translation unit")
            hits.append(f"{Path(path).name} (included from {includer.replace(str(layout.root) + '/', '')})")
    return "; ".join(sorted(set(hits)))


def _first_error(stderr: str) -> str:
    """The first error line, with the temporary checkout's path cut to the tree-relative one."""
    lines = [line for line in stderr.splitlines() if "error" in line] or stderr.splitlines() or [""]
    return re.sub(r"\S*/(python/sglang/)", r"\1", lines[0].strip())[:300]


def cuda_check(layout: KernelLayout, tvm_include: Path, arch: str = "sm_90") -> WitnessResult:
    """The CUDA side of the same unit with ``nvcc``, as the loader builds it; unavailable without nvcc."""
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
        run = subprocess.run([nvcc, *flags, "-c", str(unit), "-o", str(Path(work) / "cuda.o")], capture_output=True, text=True)
    if run.returncode != 0:
        return WitnessResult("rocm-guard/cuda", BUG, f"nvcc {arch}", _first_error(run.stderr))
    return WitnessResult("rocm-guard/cuda", CLEAN, f"nvcc {arch}", f"compiled for {arch}")
