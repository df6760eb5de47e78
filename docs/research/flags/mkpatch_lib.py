"""Helpers to produce unified diffs by exact, asserted string edits."""
import difflib
import os
import re


class Tree:
    def __init__(self, parent):
        self.parent = parent  # dir holding sglang/
        self.files = {}  # rel -> (orig, new)

    def _get(self, rel):
        if rel not in self.files:
            with open(os.path.join(self.parent, rel)) as f:
                s = f.read()
            self.files[rel] = [s, s]
        return self.files[rel]

    def sub(self, rel, old, new, count=1):
        ent = self._get(rel)
        n = ent[1].count(old)
        if n != count:
            raise AssertionError(f"{rel}: anchor found {n}x (want {count}):\n{old}")
        ent[1] = ent[1].replace(old, new)

    def diff(self):
        out = []
        for rel in sorted(self.files):
            a, b = self.files[rel]
            if a == b:
                continue
            out.extend(
                difflib.unified_diff(
                    a.splitlines(keepends=True),
                    b.splitlines(keepends=True),
                    fromfile="a/" + rel,
                    tofile="b/" + rel,
                    n=3,
                )
            )
        return "".join(out)
