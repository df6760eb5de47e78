"""The release watch: releases on the index newer than the newest pin are rebased onto, and when
every patch is classified a pull request is opened with the report as its body.

The pull-request step runs against a bare git repository standing in for GitHub and a test double
of the ``gh`` CLI on PATH (``fake-gh``, a script that records its arguments): GitHub cannot be
reached from these machines."""

from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import zipfile
from pathlib import Path

import pytest

from conftest import BASE_FILES, REPO_ROOT, TextWitness, example_lines, format_patch, git, make_wheel, tree_files
from sglpatch import cli
from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import load_pins
from sglpatch.upstream import watch
from sglpatch.witnesses import registry

EXAMPLE = "python/sglang/srt/layers/example.py"
GIT_ID = ["-c", "user.name=Watch Test", "-c", "user.email=watch@example.com"]


@pytest.fixture(autouse=True)
def example_witness(monkeypatch, test_witnesses):
    known = registry.registry
    witness = TextWitness("example-20", EXAMPLE, "patched")
    monkeypatch.setattr(registry, "registry", lambda: {**known(), "example-20": witness})


def _lines(replace=None):
    return example_lines(replace)


def _release(index: Path, version: str, example: str) -> Path:
    return make_wheel(index, version, {**BASE_FILES, "sglang/srt/layers/example.py": example})


def fake_gh(folder: Path) -> Path:
    """A test double of the gh CLI: records its arguments (and the body file) and prints a URL."""
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "gh"
    script.write_text(
        textwrap.dedent(
            f"""\
            #!{sys.executable}
            # fake-gh: a test double of the GitHub CLI, which cannot reach GitHub from here.
            import json, sys
            args = sys.argv[1:]
            body = open(args[args.index("--body-file") + 1]).read() if "--body-file" in args else ""
            with open({str(folder / "calls.jsonl")!r}, "a") as out:
                out.write(json.dumps({{"args": args, "body": body}}) + "\\n")
            print("https://github.invalid/sglpatch/pull/1")
            """
        )
    )
    script.chmod(script.stat().st_mode | stat.S_IXUSR)
    return folder


def _calls(folder: Path) -> list[dict]:
    path = folder / "calls.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _git_project(root: Path, tmp_path: Path) -> Path:
    """The project as a git repository on main with a bare repository as its origin."""
    (root / ".gitignore").write_text("build/\n*.lock.lock\n")
    git(root, "init", "-q", "-b", "main")
    git(root, "add", "-A")
    git(root, *GIT_ID, "commit", "-q", "-m", "project")
    remote = tmp_path / "origin.git"
    git(tmp_path, "init", "-q", "--bare", str(remote))
    git(root, "remote", "add", "origin", str(remote))
    git(root, "push", "-q", "origin", "main")
    git(root, "config", "user.name", "Watch Test")
    git(root, "config", "user.email", "watch@example.com")
    return remote


@pytest.fixture
def watched(fake_project, tmp_path):
    patch = format_patch(tmp_path, tree_files("0.1.0"), {EXAMPLE: _lines({20: "patched\n"})}, "example: patch line 20",
                         trailers={"Witness": "example-20", "Applies-To": ">=0.1.0,<=0.2.0"})
    fake_project.set_patches([("0001-example.patch", patch)])
    return fake_project


def test_newer_releases_are_the_final_releases_after_the_newest_pin(watched):
    for version in ("0.1.5", "0.3.0rc1", "0.3.0", "0.3.0.post1", "0.4.0.dev2"):
        _release(watched.index, version, _lines())
    assert watch.newer_releases(watched.project) == ["0.3.0", "0.3.0.post1"]


def test_no_newer_release_is_a_clean_exit_with_a_report(watched, tmp_path):
    report = watch.watch(watched.project, out_dir=tmp_path / "watch")
    assert report.found == [] and report.complete and not report.written
    assert "No release on the index is newer than the newest pin, 0.2.0" in (tmp_path / "watch" / "report.md").read_text()


def test_watch_pins_the_new_release_and_opens_a_pull_request_with_the_report(watched, tmp_path, monkeypatch):
    remote = _git_project(watched.root, tmp_path)
    _release(watched.index, "0.3.0", _lines({5: "upstream changed line 5\n"}))
    gh = fake_gh(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{gh}{os.pathsep}{os.environ['PATH']}")
    summary = tmp_path / "summary.md"
    monkeypatch.setenv("GITHUB_STEP_SUMMARY", str(summary))
    assert cli.main(["--root", str(watched.root), "watch", "--open-pr"]) == 0
    (call,) = _calls(gh)
    args = call["args"]
    assert args[:2] == ["pr", "create"]
    assert args[args.index("--base") + 1] == "main" and args[args.index("--head") + 1] == "sglpatch-watch/sglang-0.3.0"
    assert "Pin sglang 0.3.0" in args[args.index("--title") + 1]
    assert "### sglang 0.3.0: every patch classified" in call["body"] and "carries-over" in call["body"]
    assert call["body"] == (watched.root / "build" / "watch" / "report.md").read_text()
    assert "### sglang 0.3.0" in summary.read_text()
    # The branch holds the pin, the grown Applies-To and the lock, and was pushed.
    files = git(remote, "diff", "--name-only", "main", "sglpatch-watch/sglang-0.3.0").split()
    assert sorted(files) == ["patches/0001-example.patch", "series.lock", "upstream/pins.toml"]
    assert "0.3.0" in [pin.version for pin in load_pins(watched.root / "upstream" / "pins.toml").pins]


def test_watch_without_gh_pushes_the_branch_and_leaves_the_report_in_the_job_summary(watched, tmp_path, monkeypatch):
    remote = _git_project(watched.root, tmp_path)
    _release(watched.index, "0.3.0", _lines({5: "upstream changed line 5\n"}))
    real_which = shutil.which
    monkeypatch.setattr(watch.shutil, "which", lambda name, *a, **k: None if name == "gh" else real_which(name, *a, **k))
    report = watch.watch(watched.project)
    message = watch.open_pull_request(watched.project, report)
    assert "gh is not installed" in message and "job summary" in message
    assert git(remote, "rev-parse", "--verify", "sglpatch-watch/sglang-0.3.0").strip()


def test_watch_stops_at_the_first_release_that_is_not_settled_and_writes_nothing(watched, tmp_path):
    _release(watched.index, "0.3.0", _lines({20: "upstream rewrote line 20\n"}))
    _release(watched.index, "0.4.0", _lines({5: "upstream changed line 5\n"}))
    pins_before = (watched.root / "upstream" / "pins.toml").read_text()
    report = watch.watch(watched.project)
    assert report.found == ["0.3.0", "0.4.0"] and [port.version for port in report.ports] == ["0.3.0"]
    assert not report.complete and not report.written
    assert (watched.root / "upstream" / "pins.toml").read_text() == pins_before
    text = (watched.root / "build" / "watch" / "report.md").read_text()
    assert "NOT every patch classified" in text and "Not tried, because 0.3.0 is not settled: 0.4.0" in text
    with pytest.raises(SglpatchError, match="no pull request to open"):
        watch.open_pull_request(watched.project, report)


def test_a_branch_that_exists_is_refused_not_overwritten(watched, tmp_path):
    _git_project(watched.root, tmp_path)
    git(watched.root, "branch", "sglpatch-watch/sglang-0.3.0")
    _release(watched.index, "0.3.0", _lines({5: "upstream changed line 5\n"}))
    report = watch.watch(watched.project)
    with pytest.raises(SglpatchError, match="branch sglpatch-watch/sglang-0.3.0 already exists"):
        watch.open_pull_request(watched.project, report)


def _stand_in_release(wheel: Path, dest: Path) -> Path:
    """``wheel`` copied member for member to ``dest``, plus one file no patch or witness reads."""
    with zipfile.ZipFile(wheel) as source, zipfile.ZipFile(dest, "w") as copy:
        for info in source.infolist():
            copy.writestr(info, source.read(info))
        added = zipfile.ZipInfo("sglang/stand_in_release.txt", date_time=(2026, 1, 1, 0, 0, 0))
        added.external_attr = 0o100644 << 16
        copy.writestr(added, "STAND-IN: sglpatch's watch test made this release from 0.5.23; it does not exist.\n")
    return dest


def _tree_of(pristine) -> str:
    return git(pristine.repo, "rev-parse", f"{pristine.commit}^{{tree}}").strip()


@pytest.mark.network
def test_watch_end_to_end_on_the_real_series_with_a_stand_in_future_release(tmp_path):
    """The real series, pins and lock, and a file:// index made here holding one future release:
    STAND-IN -- the real 0.5.23 wheel re-labelled as 0.5.24 (no such release exists yet), with one
    file added that no patch or witness reads, so its tree is its own: answers are kept by tree,
    and 0.5.23's would otherwise be taken for it. The real witnesses run on it; the pull request
    goes to fake-gh. The run keeps its answers in a copy of the answer cache, so the stand-in's
    are computed in every run (never kept for the next) while the pins the port re-applies reuse
    theirs."""
    root = tmp_path / "project"
    for part in ("upstream", "patches"):
        shutil.copytree(REPO_ROOT / part, root / part)
    shutil.copy(REPO_ROOT / "series.lock", root / "series.lock")
    newest = load_pins(root / "upstream" / "pins.toml").newest
    assert newest.version == "0.5.23"
    index = tmp_path / "index"
    index.mkdir()
    stand_in = _stand_in_release(pristine_tree.fetch_artifact(newest), index / newest.artifact.replace("0.5.23", "0.5.24"))
    answers = tmp_path / "answers"
    shutil.copytree(cache.answers_root(), answers, ignore=shutil.ignore_patterns("*.lock", "*.lock.owner"))
    remote = _git_project(root, tmp_path)
    gh = fake_gh(tmp_path / "bin")
    env = {
        **os.environ,
        "PATH": f"{gh}{os.pathsep}{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}",
        "SGLPATCH_INDEX_URL": index.as_uri(),
        "PYTHONPATH": str(REPO_ROOT),
        cache.ANSWERS_ENV: str(answers),
    }
    env.pop("GITHUB_STEP_SUMMARY", None)
    done = subprocess.run(
        [sys.executable, "-m", "sglpatch", "--root", str(root), "watch", "--open-pr"],
        capture_output=True, text=True, env=env, timeout=3000,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    data = json.loads((root / "build" / "watch" / "report.json").read_text())
    (port,) = data["ports"]
    assert port["version"] == "0.5.24" and port["written"] and port["complete"]
    verdicts = {o["name"][:4]: o["verdict"] for o in port["outcomes"]}
    assert verdicts == {"0001": "already-upstream", "0002": "carries-over", "0003": "carries-over"}
    by_patch = {o["name"][:4]: o for o in port["outcomes"]}
    assert by_patch["0002"]["witness_before"].startswith("bug") and by_patch["0002"]["witness_after"].startswith("clean")
    pin = load_pins(root / "upstream" / "pins.toml").select(["0.5.24"])[0]
    assert pin.artifact == stand_in.name and pin.sha256 == pristine_tree.file_sha256(stand_in)
    # The witnesses ran on the stand-in's own trees in this run: their answers are in this run's
    # answer folder and were not in the cache it was copied from. On the patched tree the
    # compile guard's answer comes from the release's CPU build cell, which the port must pass.
    pristine = _tree_of(pristine_tree.pristine_from_index(pin, index.as_uri()))
    patched = json.loads((root / "series.lock").read_text())["pins"]["0.5.24"]["tree"]
    assert pristine != _tree_of(pristine_tree.pristine_from_index(newest))
    assert [cell.split()[-1] for cell in port["cells"]] == ["passed"] * 8, port["cells"]
    for tree in (pristine, patched):
        # The patches' own witnesses, and the regression tests of those that go upstream: the
        # release is the newest, so its renditions are the ones the tests judge.
        asked = ["mtp-quark-exclude", "rocm-flags", "rocm-guard",
                 "upstream-test:0002-quark-keep-mtp-draft-excluded-modules-unquantized",
                 "upstream-test:0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default"]
        assert sorted({entry.parent.name for entry in answers.rglob(f"{tree}-*.json")}) == asked, tree
        assert not list(cache.answers_root().rglob(f"{tree}-*.json")), tree
    (call,) = _calls(gh)
    assert call["args"][call["args"].index("--head") + 1] == "sglpatch-watch/sglang-0.5.24"
    assert "### sglang 0.5.24: every patch classified" in call["body"]
    assert "series.lock" in git(remote, "diff", "--name-only", "main", "sglpatch-watch/sglang-0.5.24")


def test_the_daily_workflow_runs_the_watch_session_and_keeps_the_report():
    import yaml

    workflow = yaml.safe_load((REPO_ROOT / ".github" / "workflows" / "watch.yml").read_text())
    triggers = workflow[True]  # YAML reads the bare key `on` as True
    assert triggers["schedule"][0]["cron"].split()[2:] == ["*", "*", "*"]  # every day
    assert workflow["permissions"] == {"contents": "write", "pull-requests": "write"}
    steps = workflow["jobs"]["watch"]["steps"]
    run = next(step for step in steps if "nox -s watch" in step.get("run", ""))
    assert "--open-pr" in run["run"] and run["env"]["GH_TOKEN"]
    upload = next(step for step in steps if step.get("uses", "").startswith("actions/upload-artifact"))
    assert upload["if"] == "always()" and upload["with"]["path"] == "build/watch/"
