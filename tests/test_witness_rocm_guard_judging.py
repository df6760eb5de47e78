"""How rocm-guard judges what the compiler said, on small kernel trees made here.

Each tree is shaped like a pin's JIT kernel folder (``python/sglang/jit_kernel/csrc/elementwise/
fused_metadata_copy.cuh``) and is compiled exactly as a pin's is, with the real tvm-ffi headers:
by the private HIP toolchain (skipped where it is not installed, failed where CI requires it) and
by the host preprocessor for the include-graph level. ``bug`` must mean this bug and nothing else.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from conftest import skip_unless_required
from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import Unavailable
from sglpatch.witnesses import guard_kernel, hip_toolchain, rocm_guard
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE

GUARDED = """\
#ifndef USE_ROCM
#include <cuda_runtime.h>
#else
#include <hip/hip_runtime.h>
#endif
"""
UNGUARDED = "#include <cuda_runtime.h>\n#include <hip/hip_runtime.h>\n"

# A kernel with the two entry points the loader exports, small enough to compile in seconds.
KERNEL = """\
#pragma once
#include <tvm/ffi/container/tensor.h>
{includes}
{extra}
__global__ void copy_metadata(const int* src, int* dst, int n) {{
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) dst[i] = src[i];
}}

template <int MODE, bool HAS_REAL_PAGE_TABLE, bool HAS_FLASHMLA>
struct FusedMetadataCopyKernel {{
  static void run(const tvm::ffi::TensorView src, const tvm::ffi::TensorView dst) {{
    int n = static_cast<int>(src.numel());
    hipLaunchKernelGGL(copy_metadata, dim3((n + 255) / 256), dim3(256), 0, 0,
                       static_cast<const int*>(src.data_ptr()), static_cast<int*>(dst.data_ptr()), n);
  }}
}};

template <bool HAS_REAL_PAGE_TABLE, bool HAS_FLASHMLA>
struct FusedMetadataCopyMultiKernel {{
  static void run(const tvm::ffi::TensorView src, const tvm::ffi::TensorView dst) {{
    FusedMetadataCopyKernel<0, HAS_REAL_PAGE_TABLE, HAS_FLASHMLA>::run(src, dst);
  }}
}};
"""


def kernel_tree(root: Path, includes: str = GUARDED, extra: str = "", files: dict[str, str] | None = None):
    """A pin-shaped tree whose metadata-copy header has ``includes`` and ``extra``; its layout."""
    kernels = root / "python" / "sglang" / "jit_kernel"
    header = kernels / guard_kernel.HEADER
    header.parent.mkdir(parents=True)
    (kernels / "include").mkdir()
    header.write_text(KERNEL.format(includes=includes, extra=extra))
    for name, text in (files or {}).items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    layout = guard_kernel.kernel_layout(root)
    assert layout is not None and layout.loader == "tvm-ffi"
    return layout


@pytest.fixture(scope="module")
def tvm_include() -> Path:
    try:
        return rocm_guard.tvm_ffi_headers("0.1.11")
    except Unavailable as exc:
        skip_unless_required(str(exc))


@pytest.fixture
def toolchain(tmp_path, monkeypatch) -> hip_toolchain.HipToolchain:
    found = hip_toolchain.HipToolchain.find()
    if found is None:
        skip_unless_required("the HIP toolchain is not installed (bash ci/install-hip-toolchain.sh)")
    # Each test compiles for itself: an answer remembered by another test would hide what this
    # one is about (a hang, a crash).
    monkeypatch.setenv(cache.ANSWERS_ENV, str(tmp_path / "answers"))
    return found


# Only gfx942, where one architecture says what the test is about: half the compile time.
ONE = {"arches": ("gfx942",), "required": ("gfx942",)}


# -- hip-compile -----------------------------------------------------------------------------


def test_compile_is_clean_only_when_both_mi300_and_mi355_targets_compiled(toolchain, tvm_include, tmp_path):
    result = toolchain.check("rocm-guard", kernel_tree(tmp_path), tvm_include)
    assert result.state == CLEAN, result
    assert result.level == "hip-compile gfx942,gfx950"
    assert "gfx942 (HIP_FP8_TYPE_FNUZ=1)" in result.detail and "gfx950 (HIP_FP8_TYPE_E4M3=1)" in result.detail


def test_compile_names_the_unguarded_cuda_runtime_include_on_every_arch(toolchain, tvm_include, tmp_path):
    result = toolchain.check("rocm-guard", kernel_tree(tmp_path, UNGUARDED), tvm_include)
    assert result.state == BUG, result
    assert result.level == "hip-compile gfx942,gfx950"
    assert "'cuda_runtime.h' not found under the ROCm build" in result.detail
    assert "python/sglang/jit_kernel/csrc/elementwise/fused_metadata_copy.cuh:3" in result.detail


def test_compile_judges_each_arch_with_its_own_fp8_flag(toolchain, tvm_include, tmp_path):
    # The include is reached only under the OCP fp8 macro the loader sets for gfx950.
    only_ocp = GUARDED + "#ifdef HIP_FP8_TYPE_E4M3\n#include <cuda_fp8.h>\n#endif\n"
    result = toolchain.check("rocm-guard", kernel_tree(tmp_path, only_ocp), tvm_include)
    assert result.state == BUG, result
    assert result.level == "hip-compile gfx950"
    assert "'cuda_fp8.h'" in result.detail


def test_compile_missing_other_header_is_unavailable_not_bug(toolchain, tvm_include, tmp_path):
    layout = kernel_tree(tmp_path, GUARDED + "#include <sgl_kernel/added_in_a_new_release.h>\n")
    result = toolchain.check("rocm-guard", layout, tvm_include, **ONE)
    assert result.state == UNAVAILABLE, result
    assert "another reason" in result.detail and "added_in_a_new_release.h" in result.detail


def test_compile_syntax_error_is_unavailable_with_the_first_error(toolchain, tvm_include, tmp_path):
    layout = kernel_tree(tmp_path, extra="template <typename T> struct Broken { T value }\n")
    result = toolchain.check("rocm-guard", layout, tvm_include, **ONE)
    assert result.state == UNAVAILABLE, result
    assert "fused_metadata_copy.cuh" in result.detail and "error:" in result.detail


def test_compile_crash_of_the_compiler_is_unavailable(toolchain, tvm_include, tmp_path):
    # clang's own debug pragma makes the real compiler crash, as a bug in a new release might.
    layout = kernel_tree(tmp_path, extra="#pragma clang __debug crash\n")
    result = toolchain.check("rocm-guard", layout, tvm_include, **ONE)
    assert result.state == UNAVAILABLE, result
    assert "another reason: clang++: error:" in result.detail


def test_compile_cuda_header_from_outside_the_kernel_sources_is_not_this_bug(toolchain, tvm_include, tmp_path):
    elsewhere = {"python/sglang/elsewhere/wrapper.h": "#pragma once\n#include <cuda_runtime.h>\n"}
    layout = kernel_tree(tmp_path, GUARDED + '#include "../../../elsewhere/wrapper.h"\n', files=elsewhere)
    result = toolchain.check("rocm-guard", layout, tvm_include, **ONE)
    assert result.state == UNAVAILABLE, result
    assert "outside the pin's kernel sources" in result.detail


def test_compile_that_hangs_is_unavailable_naming_the_compiler_and_arch(toolchain, tvm_include, tmp_path, monkeypatch):
    monkeypatch.setattr(hip_toolchain, "COMPILE_TIMEOUT_S", 0.05)
    result = toolchain.check("rocm-guard", kernel_tree(tmp_path), tvm_include, **ONE)
    assert result.state == UNAVAILABLE, result
    assert "clang++ (hip-compile gfx942, host pass) did not finish within 0.05 s" in result.detail


def _count_compiles(monkeypatch) -> list[str]:
    """The compiles ``rocm_guard`` runs from now on, by what it calls them (preprocessing aside)."""
    compiled = []
    real_run = hip_toolchain.run_or_unavailable

    def counting(command, what, timeout, **kwargs):
        if "-c" in command:
            compiled.append(what)
        return real_run(command, what, timeout, **kwargs)

    monkeypatch.setattr(hip_toolchain, "run_or_unavailable", counting)
    return compiled


def test_a_kernel_closure_compiled_before_is_not_compiled_again(toolchain, tvm_include, tmp_path, monkeypatch):
    first = toolchain.check("rocm-guard", kernel_tree(tmp_path / "a"), tvm_include, **ONE)
    assert first.state == CLEAN, first
    compiled = _count_compiles(monkeypatch)
    # The same kernel sources in another checkout: served from the compile cache.
    again = toolchain.check("rocm-guard", kernel_tree(tmp_path / "b"), tvm_include, **ONE)
    assert again == first and compiled == []
    # One line more in a header the compile reads (its code moves down a line): compiled again.
    changed = kernel_tree(tmp_path / "c", extra="// one more line\n")
    assert toolchain.check("rocm-guard", changed, tvm_include, **ONE).state == CLEAN
    assert sorted(compiled) == ["clang++ (hip-compile gfx942, device pass)", "clang++ (hip-compile gfx942, host pass)"]


def test_both_architectures_share_one_host_pass_and_compile_their_own_device_pass(toolchain, tvm_include, tmp_path,
                                                                                 monkeypatch):
    compiled = _count_compiles(monkeypatch)
    result = toolchain.check("rocm-guard", kernel_tree(tmp_path), tvm_include)
    assert result.state == CLEAN and result.level == "hip-compile gfx942,gfx950", result
    hosts = [what for what in compiled if what.endswith("host pass)")]
    assert len(hosts) == 1, compiled
    assert sorted(what for what in compiled if what not in hosts) == [
        "clang++ (hip-compile gfx942, device pass)", "clang++ (hip-compile gfx950, device pass)"]


def test_nothing_compiled_is_unavailable_never_clean(toolchain, tvm_include, tmp_path):
    result = toolchain.check("rocm-guard", kernel_tree(tmp_path), tvm_include, arches=("gfx9999",), required=("gfx9999",))
    assert result.state == UNAVAILABLE, result
    assert "nothing compiled; not compiled: gfx9999" in result.detail


def test_a_required_arch_the_compiler_does_not_know_keeps_it_from_clean(toolchain, tvm_include, tmp_path):
    result = toolchain.check("rocm-guard", kernel_tree(tmp_path), tvm_include,
                             arches=("gfx942", "gfx9999"), required=("gfx942", "gfx9999"))
    assert result.state == UNAVAILABLE, result
    assert result.level == "hip-compile gfx942"
    assert "compiled for gfx942; not compiled: gfx9999" in result.detail


# -- include-graph ---------------------------------------------------------------------------


def graph(layout, tvm_include):
    return rocm_guard.include_graph_check("rocm-guard", layout, tvm_include)


def test_graph_is_clean_when_the_guard_is_there(tvm_include, tmp_path):
    result = graph(kernel_tree(tmp_path), tvm_include)
    assert (result.state, result.level) == (CLEAN, "include-graph gfx942,gfx950"), result


def test_graph_walks_each_architecture_with_its_own_fp8_macro(tvm_include, tmp_path):
    # A header only the gfx950 (OCP e4m3) build reaches: gfx942's macros alone would call it clean.
    only_mi355 = GUARDED + "#if defined(HIP_FP8_TYPE_E4M3)\n#include <cuda_runtime.h>\n#endif\n"
    result = graph(kernel_tree(tmp_path, only_mi355), tvm_include)
    assert result.state == BUG, result
    assert result.detail.startswith("gfx950: ROCm build reaches cuda_runtime.h"), result
    assert "gfx942" not in result.detail


def test_graph_names_the_cuda_header_reached_from_the_kernel(tvm_include, tmp_path):
    result = graph(kernel_tree(tmp_path, UNGUARDED), tvm_include)
    assert result.state == BUG, result
    assert "cuda_runtime.h (included from python/sglang/jit_kernel/csrc/elementwise/fused_metadata_copy.cuh)" in result.detail


def test_graph_missing_other_header_is_unavailable_not_clean(tvm_include, tmp_path):
    result = graph(kernel_tree(tmp_path, GUARDED + "#include <sgl_kernel/added_in_a_new_release.h>\n"), tvm_include)
    assert result.state == UNAVAILABLE, result
    assert "sgl_kernel/added_in_a_new_release.h" in result.detail


def test_graph_preprocessor_error_is_unavailable(tvm_include, tmp_path):
    result = graph(kernel_tree(tmp_path, extra='#error "this release needs a newer toolchain"\n'), tvm_include)
    assert result.state == UNAVAILABLE, result
    assert "the preprocessor failed" in result.detail and "newer toolchain" in result.detail


def test_graph_cuda_header_from_outside_the_kernel_sources_is_not_this_bug(tvm_include, tmp_path):
    elsewhere = {"python/sglang/elsewhere/wrapper.h": "#pragma once\n#include <cuda_runtime.h>\n"}
    result = graph(kernel_tree(tmp_path, GUARDED + '#include "../../../elsewhere/wrapper.h"\n', files=elsewhere), tvm_include)
    assert result.state == UNAVAILABLE, result
    assert "outside the pin's kernel sources" in result.detail


def test_graph_that_hangs_is_unavailable_naming_the_preprocessor(tvm_include, tmp_path, monkeypatch):
    monkeypatch.setattr(rocm_guard, "PREPROCESS_TIMEOUT_S", 0.001)
    result = graph(kernel_tree(tmp_path), tvm_include)
    assert result.state == UNAVAILABLE, result
    assert "(include-graph gfx942) did not finish within 0.001 s" in result.detail


def test_no_compiler_at_all_is_unavailable(tvm_include, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    result = graph(kernel_tree(tmp_path), tvm_include)
    assert result.state == UNAVAILABLE and "neither the HIP toolchain nor a host C++ compiler" in result.detail


# -- the whole witness -------------------------------------------------------------------------


def test_witness_returns_unavailable_when_tvm_ffi_download_hangs(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setattr(rocm_guard, "DOWNLOAD_TIMEOUT_S", 0.001)
    monkeypatch.setattr(rocm_guard, "required_tvm_ffi", lambda pin: "0.1.11")
    kernel_tree(tmp_path / "tree")
    result = rocm_guard.RocmGuardWitness().run(tmp_path / "tree", pin=None)
    assert result.state == UNAVAILABLE, result
    assert "pip download apache-tvm-ffi==0.1.11 did not finish within 0.001 s" in result.detail


# -- fingerprint -------------------------------------------------------------------------------


def fake_install(root: Path, stamp: str, arches: str = "gfx942 gfx950") -> Path:
    """An install root shaped like ci/install-hip-toolchain.sh's, whose clang++ is a stand-in
    script that only lists target CPUs: enough for ``find`` and the fingerprint, never compiled with."""
    home = root / hip_toolchain.TOOLCHAIN_DIR
    clangxx = home / "root" / "usr" / "lib" / "llvm-22" / "bin" / "clang++"
    clangxx.parent.mkdir(parents=True)
    clangxx.write_text("#!/bin/sh\n" + "".join(f"echo '\t{arch}'\n" for arch in arches.split()))
    clangxx.chmod(0o755)
    hip = home / "rocm" / "include" / "hip"
    hip.mkdir(parents=True)
    (hip / "hip_runtime.h").write_text("")
    manifest = {"stamp": stamp, "clangxx": str(clangxx), "rocm_path": str(home / "rocm"), "sysroot": str(home / "root")}
    (home / "toolchain.json").write_text(json.dumps(manifest))
    (home / ".stamp").write_text(stamp + "\n")
    return root


@pytest.fixture
def fingerprint(monkeypatch):
    monkeypatch.setattr(rocm_guard, "required_tvm_ffi", lambda pin: pin)
    hip_toolchain._supported_cpus.cache_clear()
    yield lambda pin="0.1.11": rocm_guard.RocmGuardWitness().fingerprint(pin)
    hip_toolchain._supported_cpus.cache_clear()


def test_fingerprint_changes_when_the_toolchain_is_installed_after_an_include_graph_answer(fingerprint, tmp_path, monkeypatch):
    monkeypatch.setenv(hip_toolchain.TOOLCHAIN_ENV, str(tmp_path / "tc"))
    before = fingerprint()
    assert fingerprint() == before  # stable
    fake_install(tmp_path / "tc", "aaaa")
    assert hip_toolchain.HipToolchain.find() is not None
    assert fingerprint() != before


def test_fingerprint_follows_the_toolchain_stamp_its_arches_and_the_tvm_ffi_version(fingerprint, tmp_path, monkeypatch):
    monkeypatch.setenv(hip_toolchain.TOOLCHAIN_ENV, str(fake_install(tmp_path / "a", "aaaa")))
    first = fingerprint()
    assert fingerprint("0.1.9") != first
    monkeypatch.setenv(hip_toolchain.TOOLCHAIN_ENV, str(fake_install(tmp_path / "b", "bbbb")))
    assert fingerprint() != first
    monkeypatch.setenv(hip_toolchain.TOOLCHAIN_ENV, str(fake_install(tmp_path / "c", "aaaa", arches="gfx942")))
    assert fingerprint() != first


def test_fingerprint_follows_the_witness_code(fingerprint, tmp_path, monkeypatch):
    before = fingerprint()
    edited = tmp_path / "rocm_guard.py"
    edited.write_text(Path(rocm_guard.__file__).read_text() + "\n# an edit\n")
    monkeypatch.setattr(rocm_guard, "__file__", str(edited))
    assert fingerprint() != before


def test_half_installed_or_moved_toolchain_is_not_found(tmp_path, monkeypatch):
    root = fake_install(tmp_path / "tc", "aaaa")
    monkeypatch.setenv(hip_toolchain.TOOLCHAIN_ENV, str(root))
    assert hip_toolchain.HipToolchain.find() is not None
    (root / hip_toolchain.TOOLCHAIN_DIR / ".stamp").write_text("other\n")  # smoke test never passed
    assert hip_toolchain.HipToolchain.find() is None
    (root / hip_toolchain.TOOLCHAIN_DIR / ".stamp").write_text("aaaa\n")
    moved = tmp_path / "moved"
    root.rename(moved)
    monkeypatch.setenv(hip_toolchain.TOOLCHAIN_ENV, str(moved))
    assert hip_toolchain.HipToolchain.find() is None



# -- the box's own ROCm -------------------------------------------------------------------------


def standin_rocm(root: Path, toolchain: hip_toolchain.HipToolchain, gpus: str) -> Path:
    """A ROCm installation's layout (``$ROCM_PATH``) standing in for a real one, which cannot
    exist here: ``rocm_agent_enumerator`` lists ``gpus`` (and the CPU agent, gfx000), and
    ``llvm/bin/clang++`` records each call and runs the pinned Debian clang with its sysroot; the
    HIP headers and device libraries are the pinned toolchain's."""
    (root / "bin").mkdir(parents=True)
    (root / "llvm" / "bin").mkdir(parents=True)
    (root / ".info").mkdir()
    (root / ".info" / "version").write_text("7.2.0-standin\n")
    enumerator = root / "bin" / "rocm_agent_enumerator"
    enumerator.write_text("#!/bin/sh\necho gfx000\n" + "".join(f"echo {gpu}\n" for gpu in gpus.split()))
    clangxx = root / "llvm" / "bin" / "clang++"
    sysroot = f" --sysroot={toolchain.sysroot}" if toolchain.sysroot else ""
    clangxx.write_text(f'#!/bin/sh\necho "$@" >> {root / "calls.log"}\nexec {toolchain.clangxx}{sysroot} "$@"\n')
    for tool in (enumerator, clangxx):
        tool.chmod(0o755)
    for part in ("include", "amdgcn"):
        (root / part).symlink_to(toolchain.rocm_path / part)
    return root


def test_on_a_box_with_rocm_its_own_clang_compiles_for_the_boxs_gpus_and_is_recorded_as_such(
        toolchain, tvm_include, tmp_path, monkeypatch):
    monkeypatch.setattr(rocm_guard, "required_tvm_ffi", lambda pin: "0.1.11")
    monkeypatch.setattr(rocm_guard, "tvm_ffi_headers", lambda version: tvm_include)
    monkeypatch.setenv(hip_toolchain.ROCM_ENV, str(tmp_path / "absent-rocm"))
    hip_toolchain._box_arches.cache_clear()
    kernel_tree(tmp_path / "tree")
    witness = rocm_guard.RocmGuardWitness()
    without = witness.fingerprint(None)
    rocm = standin_rocm(tmp_path / "rocm", toolchain, "gfx950 gfx950")  # an 8x MI355X box lists each GPU
    monkeypatch.setenv(hip_toolchain.ROCM_ENV, str(rocm))
    result = witness.run(tmp_path / "tree", None)
    assert (result.state, result.level) == (CLEAN, "rocm-compile gfx950"), result
    assert "--offload-arch=gfx950" in (rocm / "calls.log").read_text()
    assert "--offload-arch=gfx942" not in (rocm / "calls.log").read_text()  # not a GPU of this box
    assert witness.fingerprint(None) != without
    unguarded = tmp_path / "unguarded"
    kernel_tree(unguarded, UNGUARDED)
    result = witness.run(unguarded, None)
    assert (result.state, result.level) == (BUG, "rocm-compile gfx950"), result


def test_a_rocm_that_sees_no_gpu_is_not_the_boxs_compiler(toolchain, tmp_path, monkeypatch):
    monkeypatch.setenv(hip_toolchain.ROCM_ENV, str(standin_rocm(tmp_path / "rocm", toolchain, "")))
    hip_toolchain._box_arches.cache_clear()
    assert hip_toolchain.RocmInstallation.find() is None
