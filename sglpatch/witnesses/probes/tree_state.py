"""What changed in a folder while something ran on it: every file's state before, compared after.

Used on both sides: by a probe child (``upstream_test_probe``: did a test write to the tree it
judges?) and by sglpatch itself (``answer_cache``: did any witness?). A write changes a file's
change time, which no process can set back, so a test that restores a file's size and times is
still seen.

No sglpatch imports: this file also runs in the pin's interpreter.
"""

from __future__ import annotations

import os


def file_states(folder) -> dict[str, tuple]:
    """Every file (and link) under ``folder`` by relative name, with what any write to it changes:
    size, times, inode and mode."""
    found = {}
    for root, dirs, files in os.walk(folder):
        for name in files + [d for d in dirs if os.path.islink(os.path.join(root, d))]:
            path = os.path.join(root, name)
            stat = os.lstat(path)
            found[os.path.relpath(path, folder)] = (stat.st_size, stat.st_mtime_ns, stat.st_ctime_ns, stat.st_ino,
                                                    stat.st_mode)
    return found


def changed_files(folder, before: dict[str, tuple]) -> list[str]:
    """The paths under ``folder`` added, removed or written to since ``file_states`` gave ``before``."""
    return differences(before, file_states(folder))


def differences(before: dict[str, tuple], after: dict[str, tuple]) -> list[str]:
    """The paths added, removed or written to between two ``file_states``."""
    return sorted(name for name in before.keys() | after.keys() if before.get(name) != after.get(name))
