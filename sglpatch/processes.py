"""Running the tools the project starts (pip, gh, git in a user's checkout, clang): always under a
timeout, and a hang or a failure to start is an error that names what hung, never a traceback.
(``gitcmd`` runs our own git, with its fixed environment, the same way.)"""

from __future__ import annotations

import subprocess

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
