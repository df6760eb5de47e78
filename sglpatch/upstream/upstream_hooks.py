"""sglang's own pre-commit formatters, at the versions its ``.pre-commit-config.yaml`` pins, run on
what a pull request adds: every line of a file it adds, the changed lines of a file it edits.

The released files do not all pass these hooks, so a finding on a line the PR leaves alone is
not the PR's. The tools come from the package index into their own venv in the sglpatch cache
(outside any repository), made once per set of versions.
"""

from __future__ import annotations

import hashlib
import re
import sys
import tempfile
import venv
from dataclasses import dataclass
from pathlib import Path

from sglpatch.apply.checkouts import checkout_commit
from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import git_out
from sglpatch.plumbing.processes import declared_env, pip_env, run_tool

# sgl-project/sglang .pre-commit-config.yaml: isort 5.13.2, black(-jupyter) 24.10.0, codespell
# v2.4.1 (with tomli, for its --toml), mirrors-clang-format v18.1.8.
TOOLS = ("isort==5.13.2", "black==24.10.0", "codespell==2.4.1", "tomli==2.2.1", "clang-format==18.1.8")
# The repository's .isort.cfg.
ISORT_SETTINGS = "[settings]\nprofile=black\nknown_first_party=sglang\n"
# The codespell hook's own arguments (its --toml python/pyproject.toml is added where the tree has it).
CODESPELL_IGNORE = "cann,thi,makro,wil,rouge,PRIS"
CLANG_SUFFIXES = (".c", ".cc", ".cpp", ".cu", ".cuh", ".h", ".hpp")
INSTALL_TIMEOUT_S = 900
TOOL_TIMEOUT_S = 300


@dataclass(frozen=True)
class Finding:
    tool: str
    path: str
    line: int
    what: str

    def __str__(self) -> str:
        return f"{self.tool}: {self.path}:{self.line}: {self.what}"


def hooks_env() -> Path:
    """The venv holding the pinned tools."""
    return tool_env(TOOLS, "", "sglang's pre-commit tools")


def tool_env(requirements: tuple[str, ...], prefix: str, what: str) -> Path:
    """A venv in the cache holding ``requirements`` from the package index (made on first use,
    under a lock; a failed install leaves nothing)."""
    key = hashlib.sha256(f"{sys.version_info[:2]}|{'|'.join(requirements)}".encode()).hexdigest()[:16]
    final = cache.cache_root() / "upstream-hooks" / f"{prefix}{key}"
    python = final / "bin" / "python"
    if python.exists():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with cache.entry_lock(final):
        if python.exists():
            return final
        cache.remove(final)
        venv.EnvBuilder(with_pip=True).create(final)
        done = run_tool([str(python), "-m", "pip", "install", "--quiet", "--disable-pip-version-check", *requirements],
                        f"pip install of {what}", INSTALL_TIMEOUT_S, env=pip_env())
        if done.returncode != 0:
            cache.remove(final)
            raise SglpatchError(f"could not install {what} ({', '.join(requirements)}): {done.stderr.strip()[-400:]}")
    return final


def changed_lines(repo: Path, parent: str, commit: str) -> dict[str, set[int] | None]:
    """Per file of ``commit`` against ``parent``: the new-side line numbers it changes, or None for
    a file it adds (every line is the PR's). Deleted files are not listed."""
    status = git_out(["diff", "--name-status", "--no-renames", parent, commit], repo).splitlines()
    found: dict[str, set[int] | None] = {}
    for line in status:
        kind, path = line.split("\t", 1)
        if kind == "A":
            found[path] = None
        elif kind == "M":
            lines: set[int] = set()
            diff = git_out(["diff", "-U0", "--no-renames", parent, commit, "--", path], repo)
            for match in re.finditer(r"^@@ -\S+ \+(\d+)(?:,(\d+))? @@", diff, re.M):
                start, count = int(match[1]), int(match[2] or 1)
                lines.update(range(start, start + count))
            found[path] = lines
    return found


def run_hooks(repo: Path, parent: str, commit: str) -> list[Finding]:
    """Findings of isort, black, codespell and clang-format on what ``commit`` adds to ``parent``."""
    targets = changed_lines(repo, parent, commit)
    if not targets:
        return []
    env_dir = hooks_env()
    with tempfile.TemporaryDirectory(prefix="sglpatch-hooks-") as scratch:
        tree = checkout_commit(repo, commit, Path(scratch) / "tree")
        settings = Path(scratch) / "isort"
        settings.mkdir()
        (settings / ".isort.cfg").write_text(ISORT_SETTINGS)
        findings: list[Finding] = []
        for path, lines in targets.items():
            mine = (lambda n: True) if lines is None else (lambda n, lines=lines: n in lines)
            if path.endswith(".py"):
                findings += _formatter(env_dir, "isort", ["--check-only", "--diff", "--settings-path", str(settings)], tree, path, mine)
                findings += _formatter(env_dir, "black", ["--check", "--diff", "--quiet"], tree, path, mine)
            if path.endswith(CLANG_SUFFIXES):
                findings += _clang_format(env_dir, tree, path, mine)
            findings += _codespell(env_dir, tree, path, mine)
    return findings


def _tool(env_dir: Path, name: str) -> str:
    return str(env_dir / "bin" / name)


def _formatter(env_dir: Path, name: str, args: list[str], tree: Path, path: str, mine) -> list[Finding]:
    done = run_tool([_tool(env_dir, name), *args, path], f"{name} on {path}", TOOL_TIMEOUT_S, cwd=tree, env=declared_env())
    if done.returncode == 0:
        return []
    touched = diff_old_lines(done.stdout)
    if not touched:
        return [Finding(name, path, 0, (done.stderr or done.stdout).strip().splitlines()[-1][:200] if (done.stderr or done.stdout).strip() else "failed")]
    return [Finding(name, path, line, "would reformat this line") for line in sorted(touched) if mine(line)]


def diff_old_lines(diff: str) -> set[int]:
    """The original file's lines a formatter's unified diff changes (an insertion counts at the
    lines either side of it)."""
    touched: set[int] = set()
    old = 0
    for line in diff.splitlines():
        match = re.match(r"^@@ -(\d+)(?:,\d+)? \+\d+(?:,\d+)? @@", line)
        if match:
            old = int(match[1])
            continue
        if not old or line.startswith(("---", "+++")):
            continue
        if line.startswith("-"):
            touched.add(old)
            old += 1
        elif line.startswith("+"):
            touched.update({max(old - 1, 1), old})
        else:
            old += 1
    return touched


def _codespell(env_dir: Path, tree: Path, path: str, mine) -> list[Finding]:
    args = [_tool(env_dir, "codespell"), "-L", CODESPELL_IGNORE]
    if (tree / "python" / "pyproject.toml").exists():
        args += ["--toml", "python/pyproject.toml"]
    done = run_tool([*args, path], f"codespell on {path}", TOOL_TIMEOUT_S, cwd=tree, env=declared_env())
    findings = []
    for line in done.stdout.splitlines():
        match = re.match(rf"^{re.escape(path)}:(\d+): (.*)$", line)
        if match and mine(int(match[1])):
            findings.append(Finding("codespell", path, int(match[1]), match[2].strip()))
    return findings


def _clang_format(env_dir: Path, tree: Path, path: str, mine) -> list[Finding]:
    done = run_tool([_tool(env_dir, "clang-format"), "--style=file", "--dry-run", path], f"clang-format on {path}",
                    TOOL_TIMEOUT_S, cwd=tree, env=declared_env())
    findings = []
    for line in done.stderr.splitlines():
        match = re.match(rf"^{re.escape(path)}:(\d+):\d+: warning: (.*)$", line)
        if match and mine(int(match[1])):
            findings.append(Finding("clang-format", path, int(match[1]), match[2].strip()))
    return findings
