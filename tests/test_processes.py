"""Every tool the project starts runs under a timeout; a hang is an error naming what hung."""

from __future__ import annotations

import sys
import time

import pytest

from sglpatch.plumbing import gitcmd
from sglpatch.plumbing.errors import SglpatchError, Unavailable
from sglpatch.plumbing.processes import run_tool, run_tool_lines


def test_a_tool_that_hangs_is_named_not_a_traceback():
    with pytest.raises(SglpatchError, match=r"pip config list \(a test\) did not finish within 0.2 s"):
        run_tool([sys.executable, "-c", "import time; time.sleep(30)"], "pip config list (a test)", 0.2)


def test_a_witness_tool_that_hangs_or_is_missing_is_unavailable():
    with pytest.raises(Unavailable, match="clang\\+\\+ did not finish"):
        run_tool([sys.executable, "-c", "import time; time.sleep(30)"], "clang++", 0.2, unavailable=True)
    with pytest.raises(Unavailable, match="no-such-tool could not start"):
        run_tool(["/nonexistent/no-such-tool"], "no-such-tool", 5, unavailable=True)


def test_a_git_that_hangs_is_named_with_its_folder(tmp_path, monkeypatch):
    # A git that waits on its input forever stands for one stuck on a lock or a prompt.
    with pytest.raises(SglpatchError, match=rf"git hash-object --stdin in {tmp_path} did not finish within 0.3 s"):
        import subprocess

        real = subprocess.run

        def stalled(command, **kwargs):
            kwargs.pop("input", None)
            return real([sys.executable, "-c", "import time; time.sleep(30)"], **kwargs)

        monkeypatch.setattr(gitcmd.subprocess, "run", stalled)
        gitcmd.run_git(["hash-object", "--stdin"], tmp_path, input=b"x", timeout=0.3)


def test_a_watched_tool_hands_over_each_line_as_it_comes():
    seen = []
    script = "import time\nprint('one', flush=True)\ntime.sleep(0.5)\nprint('two', flush=True)\n"
    started = time.monotonic()
    done = run_tool_lines([sys.executable, "-c", script], "a talker", 30, lambda line: seen.append((line, time.monotonic() - started)))
    assert [line for line, _ in seen] == ["one", "two"] and done.stdout == "one\ntwo\n" and done.returncode == 0
    # The first line was handed over before the tool ended, not all at the end.
    assert seen[1][1] - seen[0][1] > 0.3


def test_a_watched_tool_that_hangs_is_killed_with_what_it_started_and_named():
    # The child it starts keeps the pipe open: killing only the tool would leave the read waiting.
    script = "import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\ntime.sleep(600)\n"
    started = time.monotonic()
    with pytest.raises(SglpatchError, match=r"pip \(a test\) did not finish within 0.5 s"):
        run_tool_lines([sys.executable, "-c", script], "pip (a test)", 0.5, lambda line: None)
    assert time.monotonic() - started < 20
