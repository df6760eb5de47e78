"""ROCm tier, inside the patched image: force the JIT compile of the kernels the series touches.

Usage: build_check.py KERNEL_FILE_NAME...   (e.g. fused_metadata_copy.cuh)

sglang compiles these kernels lazily, on first use during serving, and its callers catch a failed
compile and fall back -- so a broken kernel shows only as slow serving. Here each loader function
of a touched kernel is called directly, and a compile error fails the check. Prints one JSON line:
{"kernels": {loader: "" or the error}, "gpu": name}; exits 1 on any error.
"""

from __future__ import annotations

import importlib
import importlib.util
import json
import pathlib
import sys
import traceback

# The loader functions that compile each kernel, with the template arguments the sparse-attention
# backend asks for (single-step: DECODE without page table or FlashMLA; multi-step: the same).
LOADERS = {
    "fused_metadata_copy.cuh": [
        ("_jit_fused_metadata_copy_module", (0, False, False)),
        ("_jit_fused_metadata_copy_multi_module", (False, False)),
    ],
}


def loader_modules(kernel: str) -> list[str]:
    """The Python modules of the installed sglang that define the kernel's loader functions (found
    by reading the package's files: importing sglang itself is not needed for this)."""
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        return []
    root = pathlib.Path(list(spec.submodule_search_locations)[0])
    names = [name for name, _ in LOADERS.get(kernel, [])]
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(errors="replace")
        if kernel in text and any(f"def {name}(" in text for name in names):
            found.append("sglang." + ".".join(path.relative_to(root).with_suffix("").parts))
    return found


def main(kernels: list[str]) -> int:
    import torch

    results: dict[str, str] = {}
    for kernel in kernels:
        if kernel not in LOADERS:
            results[kernel] = "no loader is known for this kernel; add it to LOADERS"
            continue
        modules = loader_modules(kernel)
        if not modules:
            results[kernel] = "no module of the installed sglang loads it"
        for module_name in modules:
            module = importlib.import_module(module_name)
            for name, args in LOADERS[kernel]:
                key = f"{module_name}.{name}{args}"
                try:
                    getattr(module, name)(*args)
                    results[key] = ""
                except Exception as exc:
                    results[key] = f"{type(exc).__name__}: {str(exc)[-800:]}"
                    traceback.print_exc()
    gpu = torch.cuda.get_device_name(0) if torch.cuda.is_available() else "no GPU visible"
    print(json.dumps({"kernels": results, "gpu": gpu, "hip": getattr(torch.version, "hip", None)}))
    return 1 if any(results.values()) or not results else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
