"""A bytecode cache keyed on source content, for the trees the probes import sglang from.

Every tree is a fresh checkout at a temporary path, so Python's own ``__pycache__`` (keyed by
path and modification time, and not written at all under ``PYTHONDONTWRITEBYTECODE``) never
helps: each probe run compiled thousands of sglang files from source. Here a module under the
tree is compiled once per distinct content: its code object is stored under the SHA-256 of the
source bytes (and the interpreter's magic number), so the pristine and patched trees of a pin,
and the releases that share a file, share its bytecode. A cached code object gets the file name
of the source it now stands for (``_imp._fix_co_filename``, what CPython does for a moved
``.pyc``), so tracebacks, ``inspect.getsource`` and triton's kernel parser read the right file.

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


def install(root: str, cache_dir: str) -> dict:
    """Load every module under ``root`` (the tree's python/ folder) through the content-keyed
    cache in ``cache_dir``; other modules load as usual. Returns the hit/miss counters."""
    ContentKeyedLoader.cache_dir = cache_dir
    root = os.path.abspath(root)
    tree_hook = importlib.machinery.FileFinder.path_hook(
        (importlib.machinery.ExtensionFileLoader, importlib.machinery.EXTENSION_SUFFIXES),
        (ContentKeyedLoader, importlib.machinery.SOURCE_SUFFIXES),
    )

    def hook(path):
        absolute = os.path.abspath(path or os.getcwd())
        if absolute == root or absolute.startswith(root + os.sep):
            return tree_hook(path)
        raise ImportError("not under the tree: the usual finders take it")

    sys.path_hooks.insert(0, hook)
    sys.path_importer_cache.clear()
    return ContentKeyedLoader.stats
