"""Stand-in modules: named test doubles for packages that cannot exist on a CPU-only machine.

sglang imports GPU-only packages (sgl_kernel, aiter, cutlass, cuda-python) and torchvision, whose
wheel from the index does not load beside torch 2.13 CPU. The probes need sglang's Python code,
not those packages, so each one that does not import here is replaced by a module whose every
attribute is a placeholder: usable as a class (in annotations, ``isinstance``, as a base class),
as a decorator (returns the function unchanged), called (returns another placeholder), and in
attribute chains. ``install`` returns what it stood in for, so every probe reports its doubles.

A catch-all can be wrong where sglang probes for a feature (``hasattr(sgl_kernel, "x")`` picks a
fallback when absent): ``partial`` stands in for a bare top-level module that has only the listed
submodules, so everything else stays "not installed" and sglang keeps its CPU fallbacks.

Runs inside the probe's interpreter, before sglang is imported (no sglpatch imports here).
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import sys
import types


class _PlaceholderMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = placeholder(f"{cls.__qualname__}.{name}")
        setattr(cls, name, value)  # the same name gives the same placeholder every time
        return value

    def __call__(cls, *args, **kwargs):
        if "_sglpatch_standin" not in cls.__dict__:
            return super().__call__(*args, **kwargs)  # a real class that subclasses a placeholder
        if len(args) == 1 and not kwargs and callable(args[0]):
            return args[0]  # used as a decorator at import time
        return placeholder(f"{cls.__qualname__}()")

    def __repr__(cls):
        return f"<stand-in {cls.__qualname__}>"


def placeholder(qualname: str) -> type:
    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "_sglpatch_standin": True})


class _StandInModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        value = placeholder(f"{self.__name__}.{name}")
        setattr(self, name, value)
        return value


def _torchvision_transforms(module: types.ModuleType) -> None:
    # sglang builds dicts keyed by InterpolationMode members at import time; placeholders would
    # all hash alike, so this one attribute is a real enum.
    names = "NEAREST NEAREST_EXACT BILINEAR BICUBIC BOX HAMMING LANCZOS".split()
    module.InterpolationMode = enum.Enum("InterpolationMode", {name: name.lower() for name in names})


_SHAPES = {"torchvision.transforms": _torchvision_transforms}


class _Finder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, names: set[str], prefixes: tuple[str, ...]):
        self.names = names
        self.prefixes = prefixes

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.names or fullname.startswith(self.prefixes):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _StandInModule(spec.name)
        module.__path__ = []
        module.__version__ = "0.0.0+standin"
        return module

    def exec_module(self, module):
        shape = _SHAPES.get(module.__name__)
        if shape is not None:
            shape(module)


def _imports(root: str) -> bool:
    try:
        importlib.import_module(root)
        return True
    except Exception:
        for name in [n for n in sys.modules if n == root or n.startswith(root + ".")]:
            del sys.modules[name]
        return False


def install(*roots: str, partial: dict[str, list[str]] | None = None) -> list[str]:
    """Stand in for each of ``roots`` (and its submodules) that does not import here.

    ``partial`` maps a root to the only submodules it gets, each a catch-all; the root itself is a
    bare module. Returns the names stood in for.
    """
    installed = []
    for root in roots:
        if _imports(root):
            continue
        sys.meta_path.insert(0, _Finder({root}, (root + ".",)))
        installed.append(root)
    for root, submodules in (partial or {}).items():
        if _imports(root):
            continue
        bare = types.ModuleType(root)
        bare.__path__ = []
        bare.__version__ = "0.0.0+standin"
        sys.modules[root] = bare
        sys.meta_path.insert(0, _Finder(set(submodules), ()))
        installed.append(f"{root}({', '.join(submodules)} only)")
    return installed
