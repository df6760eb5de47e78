"""A bytecode cache keyed on source content, for the trees the probes import sglang from and
for the environment's own packages.

Every tree is a fresh checkout at a temporary path, so Python's own ``__pycache__`` (keyed by
path and modification time, and not written at all under ``PYTHONDONTWRITEBYTECODE``) never
helps: each probe run compiled thousands of sglang files from source. Here a module under the
tree is compiled once per distinct content: its code object is stored under the SHA-256 of the
source bytes (and the interpreter's magic number), so the pristine and patched trees of a pin,
and the releases that share a file, share its bytecode. The CPU environments are installed
without bytecode (pip's own compile of all 14,000 files of the base took 55 s of its 111 s, and
a probe imports about a tenth of them), and their ``site-packages`` load through the same cache:
what is imported is compiled once, and overlays holding the same package version share it. A
cached code object gets the file name of the source it now stands for (``_imp._fix_co_filename``,
what CPython does for a moved ``.pyc``), so tracebacks, ``inspect.getsource`` and triton's kernel
parser read the right file.

Runs inside the probe's interpreter (no sglpatch imports here).
"""

from __future__ import annotations

import _imp
import hashlib
import importlib.machinery
import importlib.util
import marshal
import os
import sys
import tempfile

MAGIC = importlib.util.MAGIC_NUMBER


class ContentKeyedLoader(importlib.machinery.SourceFileLoader):
    cache_dir = ""
    stats = {"hit": 0, "miss": 0}

    def get_code(self, fullname):
        path = self.get_filename(fullname)
        source = self.get_data(path)
        key = hashlib.sha256(MAGIC + source).hexdigest()
        entry = os.path.join(self.cache_dir, key[:2], key + ".code")
        try:
            with open(entry, "rb") as handle:
                code = marshal.loads(handle.read())
            _imp._fix_co_filename(code, path)
            self.stats["hit"] += 1
            return code
        except (OSError, ValueError, EOFError, TypeError):
            pass
        code = self.source_to_code(source, path)
        self.stats["miss"] += 1
        try:
            os.makedirs(os.path.dirname(entry), exist_ok=True)
            fd, tmp = tempfile.mkstemp(dir=os.path.dirname(entry), prefix=".tmp-")
            with os.fdopen(fd, "wb") as handle:
                handle.write(marshal.dumps(code))
            os.replace(tmp, entry)
        except OSError:
            pass  # a cache that cannot be written is only slower
        return code


_ROOTS: list[str] = []  # the folders whose modules load through the cache
_FINDER_HOOK = importlib.machinery.FileFinder.path_hook(
    (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
    (ContentKeyedLoader, importlib.machinery.SOURCE_SUFFIXES),
    (importlib.machinery.SourcelessFileLoader, importlib.machinery.BYTECODE_SUFFIXES),
)


def _hook(path):
    absolute = os.path.abspath(path or os.getcwd())
    if any(absolute == root or absolute.startswith(root + os.sep) for root in _ROOTS):
        return _FINDER_HOOK(path)
    raise ImportError("not under a cached root: the usual finders take it")


def environment_roots() -> list[str]:
    """The interpreter's site-packages folders: its own and those a ``.pth`` adds (an overlay's base)."""
    return [os.path.abspath(p) for p in sys.path if p and os.path.basename(os.path.normpath(p)) == "site-packages"]


def install(roots: list[str], cache_dir: str) -> dict:
    """Load every module under ``roots`` (the tree's python/ folder, the environment's
    site-packages) through the content-keyed cache in ``cache_dir``; other modules load as
    usual. Called again (a forked child adding its tree), it adds the new roots. Returns the
    hit/miss counters."""
    ContentKeyedLoader.cache_dir = cache_dir
    _ROOTS.extend(root for root in map(os.path.abspath, roots) if root not in _ROOTS)
    if _hook not in sys.path_hooks:
        sys.path_hooks.insert(0, _hook)
    sys.path_importer_cache.clear()
    return ContentKeyedLoader.stats
