"""Reads and rewrites a ``.pre-commit-config.yaml`` with pre-commit's own parser.

Runs in the pre-commit environment ``upstream_precommit`` installs (``python precommit_config.py
describe CONFIG`` or ``... rewrite CONFIG OUT PLAN``), not in sglpatch's: no sglpatch imports.

``describe`` prints the config's repositories as pre-commit reads them (validated, defaults
filled): ``{"repos": [{"repo": URL, "rev": REV, "hooks": [ID, ...]}]}``.

``rewrite`` writes the config with, per repository URL the plan names, either ``{"repo": PATH}``
(the same hooks, ids, args and rev, from another place: a local repository holding the hook
repository's manifest) or ``{"fail": MESSAGE, "manifest": {ID: {...}}}``: the repository cannot
be had, so each of its hooks becomes a local ``language: fail`` hook with the same id, name and
file filters (its manifest's, overridden by the config's), which pre-commit itself skips where
no file of its kind is given and fails with MESSAGE where one is.
"""

from __future__ import annotations

import json
import sys

import yaml
from pre_commit.clientlib import load_config

FILTERS = ("files", "exclude", "types", "types_or", "exclude_types", "always_run", "pass_filenames", "stages")


def describe(path: str) -> None:
    config = load_config(path)
    repos = [{"repo": repo["repo"], "rev": repo.get("rev", ""), "hooks": [hook["id"] for hook in repo["hooks"]]}
             for repo in config["repos"]]
    print(json.dumps({"repos": repos}))


def rewrite(path: str, out: str, plan_path: str) -> None:
    with open(plan_path, encoding="utf-8") as handle:
        plan = json.load(handle)
    with open(path, encoding="utf-8") as handle:
        raw = yaml.safe_load(handle)
    for repo in raw.get("repos") or []:
        change = plan.get(repo.get("repo"))
        if change is None:
            continue
        if "repo" in change:
            repo["repo"] = change["repo"]
            continue
        manifest = change.get("manifest") or {}
        hooks = []
        for hook in repo.get("hooks") or []:
            defined = {**manifest.get(hook["id"], {}), **hook}
            local = {"id": hook["id"], "name": defined.get("name", hook["id"]), "language": "fail",
                     "entry": change["fail"]}
            local.update({key: defined[key] for key in FILTERS if key in defined})
            hooks.append(local)
        repo.clear()
        repo.update({"repo": "local", "hooks": hooks})
    with open(out, "w", encoding="utf-8") as handle:
        yaml.safe_dump(raw, handle, sort_keys=False)
    load_config(out)  # what is written must be a config pre-commit accepts


if __name__ == "__main__":
    if sys.argv[1] == "describe":
        describe(sys.argv[2])
    else:
        rewrite(sys.argv[2], sys.argv[3], sys.argv[4])
