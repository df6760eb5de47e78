"""Running the tools the project starts (pip, gh, git in a user's checkout, clang): always under a
timeout, and a hang or a failure to start is an error that names what hung, never a traceback.
(``gitcmd`` runs our own git, with its fixed environment, the same way.)"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

from sglpatch.errors import SglpatchError, Unavailable


def run_tool(command: list[str], what: str, timeout: float, *, unavailable: bool = False, **kwargs):
    """``subprocess.run(command)`` with its output captured (text unless ``input`` is bytes);
    ``SglpatchError`` (or ``Unavailable`` where a check cannot run without the tool) when it hangs
    past ``timeout`` seconds or cannot start. The exit status is the caller's to judge."""
    error = Unavailable if unavailable else SglpatchError
    kwargs.setdefault("text", not isinstance(kwargs.get("input"), bytes))
    try:
        return subprocess.run(command, capture_output=True, timeout=timeout, **kwargs)
    except subprocess.TimeoutExpired:
        raise error(f"{what} did not finish within {timeout:g} s") from None
    except OSError as exc:
        raise error(f"{what} could not start: {exc}") from None


def kill_session(process: subprocess.Popen) -> None:
    """SIGKILL a process started with ``start_new_session`` and everything it started."""
    try:
        os.killpg(process.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        process.kill()


def run_tool_lines(command: list[str], what: str, timeout: float, on_line, **kwargs) -> subprocess.CompletedProcess:
    """``run_tool`` for a tool worth watching as it works (pip building an environment): each
    line of its output (stdout and stderr together) goes to ``on_line`` as it comes, and all of
    it is in the result's ``stdout``. A hang past ``timeout`` kills the tool and is named."""
    try:
        process = subprocess.Popen(
            command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1,
            start_new_session=True, **kwargs,
        )
    except OSError as exc:
        raise SglpatchError(f"{what} could not start: {exc}") from None
    # A tool that hangs silently never ends the read loop: the timer kills it and whatever it
    # started (its own session), which closes the pipe.
    expired = threading.Event()

    def give_up() -> None:
        expired.set()
        kill_session(process)

    timer = threading.Timer(timeout, give_up)
    timer.start()
    lines = []
    try:
        for line in process.stdout:
            lines.append(line)
            on_line(line.rstrip("\n"))
        process.wait()
    finally:
        timer.cancel()
        if process.poll() is None:
            kill_session(process)
            process.wait()
    if expired.is_set():
        raise SglpatchError(f"{what} did not finish within {timeout:g} s")
    return subprocess.CompletedProcess(command, process.returncode, "".join(lines), "")
