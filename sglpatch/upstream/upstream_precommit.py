"""The clone's own pre-commit hooks, run by the real ``pre-commit`` on what a pull request adds
and changes: ``pre-commit run --files`` with the clone's ``.pre-commit-config.yaml``, every hook
it lists (``pre-commit-hooks`` included), in a checkout of the pull request's commit on its
branch, so clang-format's ``--style=file`` reads the clone's own ``.clang-format``.

pre-commit comes from the package index into its own venv under the sglpatch cache, and its hook
environments are kept there too (``PRE_COMMIT_HOME``). pre-commit clones each hook repository
from GitHub, which this machine cannot reach: each repository the config names is replaced by a
local one holding its hook definitions and the one requirement that carries its tools at the
rev's version (``upstream_hook_repos``), so pre-commit installs the same tools from the package
index. Nothing else of the config changes: hook ids, arguments, file filters and revs are the
clone's. A repository that cannot be had (not in that table, another toolchain, an install that
fails) has its hooks kept as ``language: fail`` hooks with the same filters: pre-commit skips
them where the pull request has no file of their kind, and where it has, the hook is named as not
run and the checklist's box stays empty.

A finding is the pull request's when it is on a line the pull request adds or changes: a hook
that rewrote a file (black, isort, trailing whitespace) counts on the lines it changed, one that
reports ``path:line`` on that line, one that judges a whole file (check-ast) on that file.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.gitcmd import IDENTITY_EMAIL, IDENTITY_NAME, commit_env, git_out, run_git
from sglpatch.plumbing.processes import pip_env, run_tool
from sglpatch.upstream.upstream_hook_repos import HookRepo, hook_repo
from sglpatch.upstream.upstream_hooks import Finding, tool_env

PRE_COMMIT = "pre-commit==4.7.0"
CONFIG_NAME = ".pre-commit-config.yaml"
HELPER = Path(__file__).with_name("precommit_config.py")
RUN_TIMEOUT_S = 1800  # the first run installs every hook's environment
REPO_LAYOUT = "1"  # bump when the local hook repositories are made differently
CANNOT = "cannot be installed here:"
_STATUS_RE = re.compile(r"^(?P<name>.+?)\.*(?P<none>\(no files to check\))?(?P<status>Passed|Failed|Skipped)$")
_AT_LINE_RE = re.compile(r"^(?:\./)?(?P<path>[^\s:]+):(?P<line>\d+)(?::\d+)?:?\s*(?P<what>.*)$")


@dataclass
class HookResult:
    id: str
    name: str
    status: str  # Passed, Failed, Skipped
    modified: bool = False
    output: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class CloneHooks:
    """What the clone's hooks said on a pull request's files."""

    findings: list
    said: str  # for the body: which hooks ran, on what
    complete: bool  # every hook that applies to these files ran
    console: str
    wall_s: float


def precommit_env() -> Path:
    """The venv holding pre-commit, from the package index."""
    return tool_env((PRE_COMMIT,), "pre-commit-", PRE_COMMIT)


def precommit_home() -> Path:
    return cache.cache_root() / "upstream-hooks" / "pre-commit-home"


def local_hook_repo(known: HookRepo, rev: str) -> Path:
    """A git repository standing for ``known`` at ``rev``: its hook definitions, and a package
    whose one requirement is ``known.package`` at the rev's version (tagged ``rev``)."""
    version = rev.removeprefix("v")
    extras = sorted({dep[2:-1] for hook in known.hooks for dep in hook.get("additional_dependencies", [])
                     if dep.startswith(".[") and dep.endswith("]")})
    setup = (f"from setuptools import setup\n\nsetup(name=\"hook-repository\", version=\"0\", py_modules=[],\n"
             f"      install_requires=[{f'{known.package}=={version}'!r}],\n"
             f"      extras_require={ {extra: [f'{known.package}[{extra}]=={version}'] for extra in extras}!r})\n")
    manifest = json.dumps(list(known.hooks), indent=1)  # YAML reads JSON
    key = hashlib.sha256(f"{REPO_LAYOUT}\0{known.url}\0{rev}\0{setup}\0{manifest}".encode()).hexdigest()[:16]
    final = cache.cache_root() / "upstream-hooks" / "repos" / key
    if (final / ".git").is_dir():
        return final
    final.parent.mkdir(parents=True, exist_ok=True)
    with cache.entry_lock(final):
        if (final / ".git").is_dir():
            return final
        with cache.staging(final) as staging:
            (staging / ".pre-commit-hooks.yaml").write_text(manifest + "\n")
            (staging / "setup.py").write_text(setup)
            run_git(["init", "--quiet"], staging)
            run_git(["add", "-A"], staging)
            run_git(["commit", "--quiet", "-m", f"{known.url} at {rev}: hook definitions ({known.source})"], staging,
                    env=commit_env(IDENTITY_NAME, IDENTITY_EMAIL, "2026-01-01T00:00:00+00:00"))
            run_git(["tag", rev], staging)
    return final


def _helper(env_dir: Path, *args: str) -> str:
    done = run_tool([str(env_dir / "bin" / "python"), str(HELPER), *args], "reading .pre-commit-config.yaml",
                    120, env=pip_env())
    if done.returncode != 0:
        said = (done.stderr.strip() or done.stdout.strip() or "no output").splitlines()[-1]
        raise SglpatchError(f"{CONFIG_NAME}: pre-commit cannot read it: {said}")
    return done.stdout


def run_clone_hooks(repo: Path, parent: str, commit: str, branch: str, targets: dict) -> CloneHooks:
    """The clone's ``.pre-commit-config.yaml`` (at ``commit``) on the files ``targets`` names
    (path -> the lines the pull request changes, or None for a file it adds)."""
    started = time.monotonic()
    env_dir = precommit_env()
    with tempfile.TemporaryDirectory(prefix="sglpatch-pre-commit-") as scratch:
        clone = Path(scratch) / "clone"
        run_git(["clone", "--quiet", "--shared", "--no-checkout", str(repo), str(clone)], Path(scratch))
        run_git(["checkout", "--quiet", "-b", branch, commit], clone)
        config = clone / CONFIG_NAME
        described = json.loads(_helper(env_dir, "describe", str(config)))
        plan, cannot = _plan(described["repos"])
        rewritten = Path(scratch) / "config.yaml"
        for _ in range(len(plan) + 1):
            (Path(scratch) / "plan.json").write_text(json.dumps(plan))
            _helper(env_dir, "rewrite", str(config), str(rewritten), str(Path(scratch) / "plan.json"))
            done = _pre_commit(env_dir, clone, rewritten, sorted(targets))
            failed = _failed_install(done, plan)
            if failed is None:
                break
            url, why = failed
            known = hook_repo(url)
            plan[url] = {"fail": f"{CANNOT} {why}", "manifest": {h["id"]: h for h in known.hooks} if known else {}}
            cannot[url] = (why, next(r["hooks"] for r in described["repos"] if r["repo"] == url))
        else:
            raise SglpatchError(f"{CONFIG_NAME}: pre-commit could not install its hooks: {_tail(done)}")
        if done.returncode not in (0, 1):
            raise SglpatchError(f"{CONFIG_NAME}: pre-commit failed: {_tail(done)}")
        results = parse_run(done.stdout)
        findings, elsewhere = _findings(results, clone, targets)
    version = PRE_COMMIT.split("==")[1]
    wall = round(time.monotonic() - started, 1)
    return _summary(results, findings, elsewhere, cannot, len(targets), version, wall)


def _plan(repos: list[dict]) -> tuple[dict, dict]:
    """Per hook repository URL the config names: where pre-commit finds it here, or why it
    cannot (and the ids of the config's hooks from it)."""
    plan, cannot = {}, {}
    for entry in repos:
        url = entry["repo"]
        if url in ("local", "meta") or url in plan:
            continue
        known = hook_repo(url)
        missing = [i for i in entry["hooks"] if known and i not in {h["id"] for h in known.hooks}]
        if known is not None and known.package and not missing:
            plan[url] = {"repo": str(local_hook_repo(known, entry["rev"]))}
            continue
        why = (known.why_not if known and not known.package
               else f"its hook {missing[0]} is not among the definitions known here" if missing
               else "only its git repository defines its hooks, and it is out of reach here")
        plan[url] = {"fail": f"{CANNOT} {why}", "manifest": {h["id"]: h for h in known.hooks} if known else {}}
        cannot[url] = (why, entry["hooks"])
    return plan, cannot


def _pre_commit(env_dir: Path, clone: Path, config: Path, files: list[str]) -> subprocess.CompletedProcess:
    env = pip_env({"PRE_COMMIT_HOME": str(precommit_home())})
    env["PATH"] = f"{env_dir / 'bin'}:{env.get('PATH', '/usr/bin:/bin')}"
    return run_tool([str(env_dir / "bin" / "pre-commit"), "run", "--config", str(config), "--color", "never",
                     "--verbose", "--files", *files], "pre-commit run", RUN_TIMEOUT_S, cwd=clone, env=env)


def _failed_install(done: subprocess.CompletedProcess, plan: dict) -> tuple[str, str] | None:
    """The hook repository whose environment pre-commit could not install, and why; None when
    the run got past installing."""
    text = done.stdout + done.stderr
    if "An unexpected error has occurred" not in text:
        return None
    installing = re.findall(r"Installing environment for (\S+?)\.?$", text, re.M)
    for url, change in plan.items():
        if installing and change.get("repo") == installing[-1]:
            return url, f"its tools did not install from the package index ({_tail(done)})"
    raise SglpatchError(f"{CONFIG_NAME}: pre-commit failed: {_tail(done)}")


def _tail(done: subprocess.CompletedProcess) -> str:
    lines = [line for line in (done.stdout + done.stderr).strip().splitlines() if line.strip()]
    return " | ".join(lines[-3:])[-400:]


def parse_run(stdout: str) -> list[HookResult]:
    """pre-commit's ``--verbose`` report: one result per hook, its output lines and whether it
    rewrote files."""
    results: list[HookResult] = []
    for line in stdout.splitlines():
        status = _STATUS_RE.match(line)
        if status and not line.startswith(" "):
            results.append(HookResult("", status["name"], "Skipped" if status["none"] else status["status"]))
            continue
        if not results:
            continue
        current = results[-1]
        if line.startswith("- hook id: "):
            current.id = line.removeprefix("- hook id: ").strip()
        elif line.startswith("- files were modified by this hook"):
            current.modified = True
        elif line.startswith(("- duration: ", "- exit code: ")):
            continue
        elif line.strip():
            current.output.append(line)
    return results


def _findings(results: list[HookResult], clone: Path, targets: dict) -> tuple[list, set[str]]:
    """The findings on the pull request's lines, and the hooks that found something elsewhere only."""
    mine = {path: (lambda n, lines=lines: lines is None or n in lines) for path, lines in targets.items()}
    findings, elsewhere = [], set()
    rewriters = [r for r in results if r.modified]
    blamed = set()
    for path in git_out(["diff", "--name-only"], clone).splitlines():
        # The hooks that say they rewrote this file ("Fixing PATH", "reformatted PATH"), else all that rewrote any.
        which = [r.id for r in rewriters if any(path in line for line in r.output)] or [r.id for r in rewriters]
        lines = sorted(n for n in rewritten_lines(git_out(["diff", "-U0", "--", path], clone))
                       if path in mine and mine[path](n))
        findings += [Finding("/".join(which), path, n, "would change this line") for n in lines]
        blamed.update(which if lines else ())
    elsewhere.update(r.id for r in rewriters if r.id not in blamed)
    for result in results:
        if result.status != "Failed" or result.modified or _cannot(result):
            continue
        located = [m for m in map(_AT_LINE_RE.match, result.output) if m and m["path"] in mine]
        if located:
            own = [m for m in located if mine[m["path"]](int(m["line"]))]
            findings += [Finding(result.id, m["path"], int(m["line"]), m["what"][:200]) for m in own]
            if not own:
                elsewhere.add(result.id)
            continue
        named = next((p for p in targets if any(p in line for line in result.output)), "")
        findings.append(Finding(result.id, named, 0, (result.output or ["failed"])[-1][:200]))
    return findings, elsewhere


def rewritten_lines(diff: str) -> set[int]:
    """The lines of the original file a ``git diff -U0`` changes; an insertion counts at the
    lines either side of it."""
    touched: set[int] = set()
    for match in re.finditer(r"^@@ -(\d+)(?:,(\d+))? \+\d+(?:,\d+)? @@", diff, re.M):
        start, count = int(match[1]), int(match[2] if match[2] is not None else 1)
        touched.update(range(start, start + count) if count else (start, start + 1))
    return touched


def _cannot(result: HookResult) -> bool:
    return any(CANNOT in line for line in result.output)


def _summary(results, findings, elsewhere, cannot: dict, files: int, version: str, wall: float) -> CloneHooks:
    """``cannot``: URL -> (why, the config's hook ids from it) for the repositories not had here."""
    why_of = {hook_id: why for why, ids in cannot.values() for hook_id in ids}
    not_run = [r for r in results if r.status == "Failed" and _cannot(r)]
    skipped_cannot = [r for r in results if r.status == "Skipped" and r.id in why_of]
    passed = [r for r in results if r.status == "Passed"]
    skipped = [r for r in results if r.status == "Skipped" and r.id not in why_of]
    said = (f"the repository's `{CONFIG_NAME}`, every hook it lists, run with pre-commit {version} "
            f"(`pre-commit run --files` on the {files} files this PR adds and changes): {len(passed)} passed, "
            f"{len(skipped)} had no file of their kind")
    if elsewhere:
        said += f"; {', '.join(sorted(elsewhere))} found only lines this PR leaves alone"
    for group, words in ((skipped_cannot, "could not be installed here and had no file of their kind"),
                         (not_run, "NOT RUN, could not be installed here")):
        if group:
            reasons = sorted({why_of.get(r.id, "") for r in group} - {""})
            said += f"; {', '.join(r.id for r in group)} {words} ({'; '.join(reasons)})"
    complete = not not_run
    state = "clean" if not findings and complete else "incomplete" if not findings else "findings"
    console = (f"{state} (the clone's {CONFIG_NAME} with pre-commit {version}: {len(passed)} passed, "
               f"{len(skipped) + len(skipped_cannot)} no files to check"
               + (f", not run: {', '.join(r.id for r in not_run)}" if not_run else "") + f"; {wall:.0f} s)")
    return CloneHooks(findings, said, complete, console, wall)
