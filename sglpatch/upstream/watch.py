"""The release watch (``sglpatch watch``, ``nox -s watch``, ``.github/workflows/watch.yml``).

Finds the sglang releases on the package index newer than the newest pin and rebases the series
onto each, oldest first (``sglpatch.rebase``): each is pinned, with its renditions and lock, only
when every patch is classified and the staged apply succeeds; the watch stops at the first release
that is not, because the next one would be ported from it. The report goes to
``build/watch/report.md`` and ``report.json`` (and to the GitHub job summary where
``$GITHUB_STEP_SUMMARY`` is set). With ``--open-pr`` the written files are committed on a branch
``sglpatch-watch/sglang-<version>``, pushed, and a pull request is opened with ``gh`` and the
report as its body; without ``gh`` the report stays in the summary and the artifact.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.apply.outcomes import Outcome
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.processes import run_tool, user_git_env
from sglpatch.rebase.onto import rebase_onto
from sglpatch.rebase.report import RebaseOutcome, RebaseReport
from sglpatch.sources import index_listing

GIT_TIMEOUT_S = 300
GH_TIMEOUT_S = 300
SUMMARY_ENV = "GITHUB_STEP_SUMMARY"


@dataclass
class WatchReport:
    newest_pin: str
    found: list[str]  # releases on the index newer than the newest pin, oldest first
    ports: list[RebaseReport] = field(default_factory=list)
    report_path: Path | None = None

    @property
    def complete(self) -> bool:
        """Every release found was ported with every patch classified (none found: nothing to do)."""
        return len(self.ports) == len(self.found) and all(port.complete for port in self.ports)

    @property
    def written(self) -> list[RebaseReport]:
        return [port for port in self.ports if port.written]

    def markdown(self) -> str:
        if not self.found:
            return f"## sglang release watch\n\nNo release on the index is newer than the newest pin, {self.newest_pin}.\n"
        lines = [
            "## sglang release watch",
            "",
            f"Releases on the index newer than the newest pin ({self.newest_pin}): {', '.join(self.found)}.",
            "",
        ]
        for port in self.ports:
            lines.append(port.markdown())
        skipped = self.found[len(self.ports) :]
        if skipped:
            lines.append(f"Not tried, because {self.ports[-1].version} is not settled: {', '.join(skipped)}.\n")
        lines.append(
            "Every patch was classified and the staged apply (with witnesses) recorded the lock; review the "
            "new renditions before merging.\n"
            if self.complete
            else "Not every patch is classified: a person must port the patches marked above (each under "
            "`build/port/<release>/`, ready for `sglpatch patch refresh <release>`); nothing was written for that release.\n"
        )
        return "\n".join(lines)

    def text(self) -> str:
        if not self.found:
            return f"no release on the index is newer than {self.newest_pin}"
        lines = [f"newer than {self.newest_pin} on the index: {', '.join(self.found)}"]
        lines += [port.text() for port in self.ports]
        if self.report_path:
            lines.append(f"report: {self.report_path}")
        return "\n".join(lines)


def newer_releases(project, index=None) -> list[str]:
    """Final releases on the index newer than the newest pin, oldest first (pre-releases and
    development releases are not pinned)."""
    newest = project.pins().newest.parsed_version
    return [str(version) for version in index_listing.released_versions(index) if version > newest]


def watch(project, *, write: bool = True, out_dir: Path | None = None) -> WatchReport:
    """Rebase onto every newer release, oldest first, stopping at the first that is not settled."""
    report = WatchReport(project.pins().newest.version, newer_releases(project))
    for version in report.found:
        port = rebase_onto(project, version, write=write)
        report.ports.append(port)
        if write and not port.written:
            break
    folder = out_dir or project.build_dir / "watch"
    folder.mkdir(parents=True, exist_ok=True)
    report.report_path = folder / "report.md"
    report.report_path.write_text(report.markdown())
    (folder / "report.json").write_text(
        json.dumps(
            {"newest_pin": report.newest_pin, "found": report.found, "complete": report.complete, "ports": [p.to_dict() for p in report.ports]},
            indent=2,
        )
        + "\n"
    )
    summary = os.environ.get(SUMMARY_ENV)
    if summary:
        with open(summary, "a") as handle:
            handle.write(report.markdown())
    return report


def _run(command: list[str], cwd: Path, what: str, timeout: int) -> str:
    done = run_tool(command, f"{what} ({' '.join(command[:3])})", timeout, cwd=cwd, env=user_git_env())
    if done.returncode != 0:
        raise SglpatchError(f"{what} failed: {(done.stderr or done.stdout).strip()[-500:]}")
    return done.stdout.strip()


def hand_ports(report: WatchReport) -> list[tuple[str, RebaseOutcome]]:
    """(release, outcome) of every patch the watch could not port by itself."""
    return [(port.version, o) for port in report.ports for o in port.outcomes if o.verdict == Outcome.NEEDS_HAND_PORT]


def open_hand_port_issue(project, report: WatchReport) -> str:
    """Where a patch needs a hand port: an issue opened with ``gh``, the report as its body (which
    names the patch, the candidate, why the judge refused it and where the prepared tree is)."""
    left = hand_ports(report)
    if not left:
        raise SglpatchError("no patch needs a hand port; there is no issue to open")
    version = left[0][0]
    names = ", ".join(outcome.name for _, outcome in left)
    title = f"sglang {version}: {names} need{'s' if len(left) == 1 else ''} a hand port"
    body = report.report_path.read_text() if report.report_path else report.markdown()
    gh = shutil.which("gh")
    if gh is None:
        return f"{title}; gh is not installed, so the report is in the job summary and {report.report_path}"
    body_file = (report.report_path or project.root / "build" / "watch" / "report.md").with_name("issue-body.md")
    body_file.write_text(body)
    url = _run([gh, "issue", "create", "--title", title, "--body-file", str(body_file)], project.root, "gh issue create", GH_TIMEOUT_S)
    return f"issue opened: {url}"


def open_pull_request(project, report: WatchReport, *, base: str = "main", remote: str = "origin") -> str:
    """Commit what the watch wrote on ``sglpatch-watch/sglang-<version>`` (from HEAD of the project's
    git repository, with the user's git identity), push it to ``remote`` and open a pull request
    to ``base`` with ``gh``, the report as its body. Refuses an existing branch; returns what
    happened, in one line."""
    ports = report.written
    if not ports or not report.complete:
        raise SglpatchError("the watch wrote nothing complete; there is no pull request to open")
    root = project.root
    newest = ports[-1].version
    branch = f"sglpatch-watch/sglang-{newest}"

    def git(*args: str) -> str:
        return _run(["git", *args], root, f"git {args[0]}", GIT_TIMEOUT_S)

    exists = run_tool(["git", "rev-parse", "--verify", "--quiet", f"refs/heads/{branch}"], "git rev-parse", GIT_TIMEOUT_S, cwd=root,
                      env=user_git_env())
    if exists.returncode == 0:
        raise SglpatchError(f"{root}: branch {branch} already exists; delete it or merge it first")
    files = sorted({name for port in ports for name in port.files})
    versions = ", ".join(port.version for port in ports)
    title = f"Pin sglang {versions}: the series ported by the release watch"
    body = report.report_path.read_text() if report.report_path else report.markdown()
    git("switch", "--quiet", "-c", branch)
    git("add", "-A", "--", *files)  # -A: a rendition whose text moved to the main file is removed
    git("commit", "--quiet", "-m", f"{title}\n\n" + "\n".join(port.text() for port in ports))
    git("push", "--quiet", remote, f"{branch}:{branch}")
    gh = shutil.which("gh")
    if gh is None:
        return f"branch {branch} pushed to {remote}; gh is not installed, so the report is in the job summary and {report.report_path}"
    body_file = (report.report_path or root / "build" / "watch" / "report.md").with_name("pr-body.md")
    body_file.write_text(body)
    url = _run(
        [gh, "pr", "create", "--base", base, "--head", branch, "--title", title, "--body-file", str(body_file)],
        root, "gh pr create", GH_TIMEOUT_S,
    )
    return f"pull request opened: {url}"
