"""Every tool the project starts runs under a timeout; a hang is an error naming what hung."""

from __future__ import annotations

import sys

import pytest

from sglpatch import gitcmd
from sglpatch.errors import SglpatchError, Unavailable
from sglpatch.processes import run_tool


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
