"""Ctrl-C and a read-only checkout: one line, the right exit status, never a traceback, and
everything as it was.

The signals are real: SIGINT to the command's whole process group, as a terminal's Ctrl-C sends it,
while the command is working. To land it at a known step, the command's git is the real git held at
that step (a script first on PATH that marks the step reached, then waits, then runs git). The
read-only checkout is really read-only: a read-only bind mount in a mount namespace of the test's
own (root, as the tests run here, writes through file modes); where no mount namespace can be made
the test says so and skips.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from conftest import format_patch, git, tree_files
from sglpatch.apply.apply_pins import apply_series
from test_into import KERNEL, _git_checkout, guarded  # noqa: F401 - guarded is the fixture the tests take

EXAMPLE = "python/sglang/srt/layers/example.py"
HOLD_S = 120
WITNESSED = {"Witness": "rocm-guard"}  # a real witness; these runs are --no-witnesses (not what they prove)


def _git_held_at(folder: Path, step: str, hold_s: int = HOLD_S, only_in: Path | None = None) -> tuple[dict[str, str], Path]:
    """An environment whose git is the real one, held at ``git STEP`` (its first argument; run in
    ``only_in``, where given): the marker file is made when the step is reached, then the step
    waits ``hold_s`` seconds and runs git in its place (Python, not a shell: a shell would unblock
    the signals the command holds off its git)."""
    real, marker = shutil.which("git"), folder / "reached"
    folder.mkdir(parents=True, exist_ok=True)
    script = folder / "git"
    script.write_text(f"""#!{sys.executable}
import os, sys, time
if sys.argv[1:2] == [{step!r}] and {str(only_in) if only_in else None!r} in (None, os.getcwd()):
    open({str(marker)!r}, "w").close()
    time.sleep({hold_s})
os.execv({real!r}, [{real!r}, *sys.argv[1:]])
""")
    script.chmod(0o755)
    return {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}, marker


def _interrupted(command: list[str], env: dict[str, str], marker: Path, group: bool = True) -> subprocess.CompletedProcess:
    """Run ``command``, and press Ctrl-C once it reaches the held step (or, not ``group``, send
    SIGINT to its first process alone, as ``kill -INT PID`` does)."""
    # SIGINT as a terminal's foreground job has it: a shell's background job (pytest started with
    # `&` from a script) starts with SIGINT ignored, and a child keeps an ignored signal ignored.
    process = subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               start_new_session=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + HOLD_S
    while not marker.exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.02)
    if not marker.exists() or process.poll() is not None:
        process.kill()
        pytest.fail(f"the command ended before it reached the held step: {process.communicate()}")
    if group:
        os.killpg(process.pid, signal.SIGINT)  # what the terminal sends the whole foreground group
    else:
        os.kill(process.pid, signal.SIGINT)
    stdout, stderr = process.communicate(timeout=60)
    return subprocess.CompletedProcess(command, process.returncode, stdout, stderr)


def _one_line(done: subprocess.CompletedProcess, status: int, says: str) -> None:
    assert done.returncode == status, done.stdout + done.stderr
    assert "Traceback" not in done.stderr and done.stderr.strip().splitlines() == [says], done.stderr


def _state(tree: Path) -> tuple[str, str, list[str]]:
    return (git(tree, "rev-parse", "HEAD").strip(), git(tree, "status", "--porcelain").strip(),
            sorted(p.name for p in (tree / ".git").iterdir() if p.name.startswith("sglpatch-")))


IN_WORKERS = ("sglpatch: interrupted: stopped in a worker process: sglang 0.1.0's tree and lock entry are as they "
              "were, or applied whole; sglang 0.2.0's tree and lock entry are as they were, or applied whole; "
              "nothing else was changed")


@pytest.mark.parametrize("pins, group, says", [
    (["0.1.0"], True, "sglpatch: interrupted: nothing was changed"),
    # Two pins in two worker processes: what each had done when it stopped stays in it, so the line
    # says what it can have changed (a pin's tree and lock entry move whole or not at all).
    (["-j", "2"], True, IN_WORKERS),
    (["-j", "2"], False, IN_WORKERS),  # SIGINT to the first process alone: passed on to its workers
])
def test_ctrl_c_while_apply_builds_the_commits_exits_130_saying_what_was_changed(fake_project, tmp_path, pins, group, says):
    files = tree_files("0.1.0")
    guard = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    fake_project.set_patches([("0001-guard.patch", format_patch(tmp_path, files, {KERNEL: guard}, "kernel: guard", trailers=WITNESSED))])
    assert apply_series(fake_project.project, run_witnesses=False).ok
    trees, lock = [fake_project.root / "build" / "trees" / pin for pin in fake_project.versions], fake_project.root / "series.lock"
    before, lock_before = [_state(tree) for tree in trees], lock.read_bytes()
    example = files[EXAMPLE].replace("line 20\n", "line twenty\n")
    fake_project.set_patches([("0001-guard.patch", format_patch(tmp_path, files, {KERNEL: guard}, "kernel: guard", trailers=WITNESSED)),
                              ("0002-example.patch", format_patch(tmp_path, files, {EXAMPLE: example}, "example: line 20",
                                                                          trailers=WITNESSED))])
    env, marker = _git_held_at(tmp_path / "held", "apply")
    done = _interrupted([sys.executable, "-m", "sglpatch", "-q", "--root", str(fake_project.root), "apply", *pins,
                         "--no-witnesses", "--update-lock"], env, marker, group)
    _one_line(done, 130, says)
    assert [_state(tree) for tree in trees] == before and lock.read_bytes() == lock_before


def test_ctrl_c_while_apply_into_commits_in_the_checkout_exits_130_and_leaves_it_as_it_was(guarded, tmp_path):  # noqa: F811
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    before = _state(checkout)
    # update-index runs in the checkout's own git, on a private index, while the commits are made.
    env, marker = _git_held_at(tmp_path / "held", "update-index")
    done = _interrupted([sys.executable, "-m", "sglpatch", "-q", "--root", str(guarded.root), "apply", "--into",
                         str(checkout)], env, marker)
    _one_line(done, 130, "sglpatch: interrupted: nothing was changed")
    assert _state(checkout) == before
    assert git(checkout, "rev-parse", "main").strip() == before[0]


def test_ctrl_c_while_apply_into_moves_the_branch_finishes_that_step_and_says_what_changed(guarded, tmp_path):  # noqa: F811
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    head = git(checkout, "rev-parse", "HEAD").strip()
    # The work tree is moved, then the branch: Ctrl-C between them would leave the two apart, so
    # that step finishes first (the held git holds the signal off too), then the command stops.
    env, marker = _git_held_at(tmp_path / "held", "update-ref", hold_s=3, only_in=checkout)
    done = _interrupted([sys.executable, "-m", "sglpatch", "-q", "--root", str(guarded.root), "apply", "--into",
                         str(checkout)], env, marker)
    _one_line(done, 130, f"sglpatch: interrupted: changed before it stopped: {checkout}: 2 commits added on main; "
                         "nothing else was changed")
    assert git(checkout, "rev-list", "--count", f"{head}..main").strip() == "2"
    assert git(checkout, "status", "--porcelain").strip() == ""


def _read_only(path: Path, command: list[str]) -> subprocess.CompletedProcess:
    """``command`` run where ``path`` is a read-only bind mount of itself (in a mount namespace of
    its own: nothing outside it sees the mount)."""
    if shutil.which("unshare") is None:
        pytest.skip("no unshare(1) here to make a read-only mount namespace")
    probe = subprocess.run(["unshare", "-m", "--propagation", "private", "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        pytest.skip(f"cannot make a mount namespace here (not root, or no CAP_SYS_ADMIN): {probe.stderr.strip()}")
    quoted = " ".join(f"'{part}'" for part in command)
    script = f"mount --bind '{path}' '{path}' && mount -o remount,bind,ro '{path}' && exec {quoted}"
    return subprocess.run(["unshare", "-m", "--propagation", "private", "sh", "-c", script],
                          capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize("kind", ["git", "plain"])
def test_a_read_only_checkout_is_refused_in_one_line_naming_it_and_left_as_it_was(guarded, tmp_path, kind):  # noqa: F811
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    if kind == "plain":
        shutil.rmtree(checkout / ".git")
    touched = checkout / KERNEL
    kernel_before = touched.read_bytes()
    head_before = git(checkout, "rev-parse", "HEAD").strip() if kind == "git" else ""
    done = _read_only(checkout, [sys.executable, "-m", "sglpatch", "-q", "--root", str(guarded.root), "apply",
                                 "--into", str(checkout), "0.1.0"])
    assert done.returncode == 2, done.stdout + done.stderr
    [line] = done.stderr.strip().splitlines()
    assert line.startswith(f"sglpatch: error: {checkout}") and "read-only file system" in line, line
    assert "nothing was changed" in line and "Traceback" not in done.stderr
    assert touched.read_bytes() == kernel_before
    if kind == "git":
        assert git(checkout, "rev-parse", "HEAD").strip() == head_before
        assert not [p for p in (checkout / ".git").iterdir() if p.name.startswith("sglpatch-")]


def test_an_os_error_a_command_meets_is_one_line_naming_the_file(tmp_path, capsys, monkeypatch):
    from sglpatch import cli

    def read_only(*args, **kwargs):
        raise OSError(30, "Read-only file system", str(tmp_path / "series.lock"))

    monkeypatch.setattr(cli, "_run", read_only)
    assert cli.main(["pins"]) == 2
    assert capsys.readouterr().err == f"sglpatch: error: {tmp_path / 'series.lock'}: Read-only file system\n"
