"""Stand-in modules: named test doubles for packages that cannot exist on a CPU-only machine.

sglang imports GPU-only packages (sgl_kernel, aiter, cutlass, cuda-python) and torchvision, whose
wheel from the index does not load beside torch 2.13 CPU. The probes need sglang's Python code,
not those packages. Two kinds of double, both returned by ``install`` so every probe reports them:

- a **catch-all** (``install(root)``): every attribute of the module and its submodules is a
  placeholder, usable as a class (in annotations, ``isinstance``, as a base class), as a decorator
  (returns the function unchanged), called (returns another placeholder), and in attribute chains.
  Only for packages whose features sglang never probes on the witnessed paths (torchvision).
- a **named** stand-in (``install(names={module: [attribute, ...]})``): the module has exactly the
  listed attributes, each a placeholder, and the listed modules' parent packages exist bare. Any
  other attribute is missing (``hasattr`` is False, ``from m import x`` fails) and any other
  submodule does not import, so sglang's own feature probes (``hasattr(sgl_kernel, "op")``, a
  guarded ``from aiter import op``) see what a box without that op sees, and a new unguarded
  import in a release fails loudly instead of being papered over.

Placeholders record the calls made to them (``calls()``), and named stand-ins record every
attribute read from them that is not a ``from m import name`` statement, present or absent
(``reads()``): a probe can say which doubles its answer actually went through, and show that a
judged code path read nothing from them (no ``hasattr`` probe, no version check, no call).

Runs inside the probe's interpreter, before sglang is imported (no sglpatch imports here).
"""

from __future__ import annotations

import enum
import importlib
import importlib.abc
import importlib.machinery
import sys
import types

_CALLS: dict[str, int] = {}
_READS: dict[str, str] = {}
# What the import machinery reads from any module; not sglang looking at the package.
_MACHINERY = frozenset({
    "__spec__", "__path__", "__name__", "__loader__", "__dict__", "__class__", "__package__", "__file__",
    "__cached__", "__builtins__", "__getattr__", "__getattribute__", "__setattr__", "__dir__", "__doc__",
    "__qualname__", "__module__", "_sglpatch_standin", "__origin__", "__wrapped__", "__mro_entries__",
    "__annotations__", "__init_subclass__", "__reduce__", "__reduce_ex__", "__repr__", "__str__",
})


def calls() -> list[str]:
    """The stand-ins called since the last ``reset_calls`` (as functions or constructors)."""
    return sorted(_CALLS)


def call_counts() -> dict[str, int]:
    """How often each stand-in was called since the last ``reset_calls``: two snapshots tell
    what one step of a probe called."""
    return dict(_CALLS)


def is_standin(value) -> bool:
    """Whether ``value`` is a stand-in's placeholder (or a module of a stand-in package)."""
    try:
        return "_sglpatch_standin" in vars(value) or "_sglpatch_standin" in vars(type(value))
    except TypeError:
        return False


def reads() -> list[str]:
    """Attributes read from named stand-ins since the last ``reset_calls``, other than by
    ``from m import name``: ``module.name (how, where)``, ``absent`` for a name it does not have."""
    return [f"{name} ({how})" for name, how in sorted(_READS.items())]


def reset_calls() -> None:
    _CALLS.clear()
    _READS.clear()


def _import_statement(frame) -> bool:
    """Whether the attribute is being read by a ``from m import name`` (IMPORT_FROM, or the import
    machinery's ``_handle_fromlist``)."""
    import dis

    if frame is None:
        return False
    if frame.f_code.co_filename.startswith("<frozen importlib"):
        return True
    return dis.opname[frame.f_code.co_code[frame.f_lasti]] == "IMPORT_FROM"


def _where(frame) -> str:
    """``file:line``, and whether the reading code is a module's top level (run at its import)."""
    while frame is not None and frame.f_code.co_filename.startswith("<frozen"):
        frame = frame.f_back
    if frame is None:
        return "?"
    where = f"{frame.f_code.co_filename.split('/python/')[-1]}:{frame.f_lineno}"
    return f"{where}, module level" if frame.f_code.co_name == "<module>" else where


class _NamedModule(types.ModuleType):
    def __getattribute__(self, name):
        if name not in _MACHINERY:
            import sys as _sys

            caller = _sys._getframe(1)
            if not _import_statement(caller):
                module = types.ModuleType.__getattribute__(self, "__name__")
                _READS.setdefault(f"{module}.{name}", f"read at {_where(caller)}")
        return types.ModuleType.__getattribute__(self, name)

    def __getattr__(self, name):  # only for names the module does not have
        if name not in _MACHINERY:
            import sys as _sys

            caller = _sys._getframe(1)
            module = types.ModuleType.__getattribute__(self, "__name__")
            how = "imported" if _import_statement(caller) else "probed"
            _READS[f"{module}.{name}"] = f"absent, {how} at {_where(caller)}"
        raise AttributeError(name)


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
        _CALLS[cls.__qualname__] = _CALLS.get(cls.__qualname__, 0) + 1
        return placeholder(f"{cls.__qualname__}()")

    def __repr__(cls):
        return f"<stand-in {cls.__qualname__}>"


def placeholder(qualname: str) -> type:
    return _PlaceholderMeta(qualname.rsplit(".", 1)[-1], (), {"__qualname__": qualname, "_sglpatch_standin": True})


class _CatchAllModule(types.ModuleType):
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
STANDIN_VERSION = "0.0.0+standin"


class _CatchAllFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    def __init__(self, root: str):
        self.root = root

    def find_spec(self, fullname, path=None, target=None):
        if fullname == self.root or fullname.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        module = _CatchAllModule(spec.name)
        module.__path__ = []
        module.__version__ = STANDIN_VERSION
        return module

    def exec_module(self, module):
        shape = _SHAPES.get(module.__name__)
        if shape is not None:
            shape(module)


class _NamedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Modules with exactly the listed attributes; their parent packages exist, bare."""

    def __init__(self, names: dict[str, list[str]]):
        self.names = names
        self.packages = {name.rsplit(".", i)[0] for name in names for i in range(name.count(".") + 1)}

    def find_spec(self, fullname, path=None, target=None):
        if fullname in self.packages:
            return importlib.machinery.ModuleSpec(fullname, self, is_package=True)
        return None

    def create_module(self, spec):
        return _NamedModule(spec.name)

    def exec_module(self, module):
        module.__path__ = []
        module.__version__ = STANDIN_VERSION
        module._sglpatch_standin = True
        for attribute in self.names.get(module.__name__, []):
            setattr(module, attribute, placeholder(f"{module.__name__}.{attribute}"))


class StandinCalled(RuntimeError):
    """Something of an import-only stand-in was called: the stand-in cannot run it, and says which."""


class _ImportOnlyMeta(type):
    def __getattr__(cls, name):
        if name.startswith("__"):
            raise AttributeError(name)
        # Module-level constants are read at import (``scalar_types.uint4b8``): a placeholder,
        # which raises when it is used.
        return _import_only_attribute(cls, cls.__qualname__, name)

    def __call__(cls, *args, **kwargs):
        message = (f"sglpatch stand-in: {cls.__qualname__} was called: "
                   "the import-only stand-in cannot run it (no CPU build of the package exists)")
        print(message, file=sys.stderr, flush=True)
        _CALLS[cls.__qualname__] = _CALLS.get(cls.__qualname__, 0) + 1
        raise StandinCalled(message)

    def __repr__(cls):
        return f"<import-only stand-in {cls.__qualname__}>"


class _ImportOnlyModule(types.ModuleType):
    def __getattr__(self, name):
        if name.startswith("__"):
            raise AttributeError(name)
        return _import_only_attribute(self, self.__name__, name)


def _import_only_attribute(owner, owner_name: str, name: str):
    """``owner.name`` as an import-only placeholder, kept on ``owner`` so it is made once."""
    value = _ImportOnlyMeta(name, (), {"__qualname__": f"{owner_name}.{name}", "_sglpatch_standin": True})
    setattr(owner, name, value)
    return value


class _ImportOnlyFinder(_CatchAllFinder):
    def create_module(self, spec):
        module = _ImportOnlyModule(spec.name)
        module.__path__ = []
        module.__version__ = STANDIN_VERSION
        module._sglpatch_standin = True
        return module

    def exec_module(self, module):
        pass


def install_import_only(root: str) -> bool:
    """Stand in for ``root`` with an import-only module (see the module's docstring) where it does
    not import here; whether it was stood in."""
    if _imports(root):
        return False
    sys.meta_path.insert(0, _ImportOnlyFinder(root))
    return True


def _imports(root: str) -> bool:
    try:
        importlib.import_module(root)
        return True
    except Exception:
        for name in [n for n in sys.modules if n == root or n.startswith(root + ".")]:
            del sys.modules[name]
        return False


def install(*roots: str, names: dict[str, list[str]] | None = None) -> list[str]:
    """Stand in for each of ``roots`` (catch-all) and each root of ``names`` (exactly the listed
    attributes per module) that does not import here. Returns what was stood in, as
    ``root`` for a catch-all and ``root{module: attributes, ...}`` counts for a named one."""
    installed = []
    for root in roots:
        if _imports(root):
            continue
        sys.meta_path.insert(0, _CatchAllFinder(root))
        installed.append(root)
    by_root: dict[str, dict[str, list[str]]] = {}
    for module, attributes in (names or {}).items():
        by_root.setdefault(module.split(".")[0], {})[module] = list(attributes)
    for root, modules in by_root.items():
        if _imports(root):
            continue
        sys.meta_path.insert(0, _NamedFinder(modules))
        count = sum(len(attributes) for attributes in modules.values())
        installed.append(f"{root} (named: {count} names in {len(modules)} modules)")
    return installed
