"""Running the tools the project starts (pip, gh, git in a user's checkout, clang): always under a
timeout, and a hang or a failure to start is an error that names what hung, never a traceback.
(``gitcmd`` runs our own git, with its fixed environment, the same way.)

Every child gets a declared environment (``declared_env``), never the caller's whole shell: a
ROCm image or a user's shell carries ``SGLANG_*``, ``HIP_*``, ``HSA_*``, ``CPATH`` and the like,
which change what sglang resolves or what a compiler finds, and no cached answer's key covers
them. What a tool needs to run (its PATH, HOME, temporary folder, locale) and, per kind of tool,
the configuration that is the user's by our rules (pip's, the network's, gh's) is kept; nothing else.
"""

from __future__ import annotations

import os
import signal
import subprocess
import threading

from sglpatch.plumbing.errors import SglpatchError, Unavailable

# What any tool needs to run: where programs are, the home and temporary folders, the locale.
RUNNING = ("PATH", "HOME", "TMPDIR", "USER", "LOGNAME", "LANG", "LANGUAGE", "TZ")
RUNNING_PREFIXES = ("LC_",)
# How this machine reaches the network: proxies and certificate stores (pip, gh, git remotes).
NETWORK = ("http_proxy", "https_proxy", "no_proxy", "all_proxy", "HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY",
           "ALL_PROXY", "SSL_CERT_FILE", "SSL_CERT_DIR", "REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE")
# pip's configuration is the user's (docs/install.md): its variables, and where it finds its files.
PIP = (*NETWORK, "XDG_CONFIG_HOME", "XDG_CONFIG_DIRS", "XDG_CACHE_HOME", "NETRC")
PIP_PREFIXES = ("PIP_",)
# git and gh in the user's own checkout: their configuration and credentials, no GIT_DIR-style
# redirections (a GIT_DIR of the caller's would point the command at another repository).
USER_GIT = (*NETWORK, "XDG_CONFIG_HOME", "SSH_AUTH_SOCK", "GIT_SSH", "GIT_SSH_COMMAND", "GIT_ASKPASS")
GH = (*USER_GIT, "GH_TOKEN", "GITHUB_TOKEN", "GH_HOST", "GH_ENTERPRISE_TOKEN", "GH_CONFIG_DIR", "GH_REPO")


def declared_env(keep: tuple[str, ...] = (), prefixes: tuple[str, ...] = (),
                 extra: dict[str, str] | None = None) -> dict[str, str]:
    """The environment a child gets: of the caller's, only ``RUNNING`` and what ``keep`` and
    ``prefixes`` name, then ``extra`` (the variables the caller declares, such as a launch
    profile's)."""
    names, starts = {*RUNNING, *keep}, (*RUNNING_PREFIXES, *prefixes)
    env = {key: value for key, value in os.environ.items() if key in names or key.startswith(starts)}
    env.update(extra or {})
    return env


def pip_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """For pip: the running basics and pip's own configuration, nothing else of the caller's."""
    return declared_env(PIP, PIP_PREFIXES, extra)


def user_git_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    """For git and gh in the user's own repository: their configuration, credentials and gh's login."""
    return declared_env(GH, (), extra)


def run_tool(command: list[str], what: str, timeout: float, *, unavailable: bool = False, **kwargs):
    """``subprocess.run(command)`` with its output captured (text unless ``input`` is bytes);
    ``SglpatchError`` (or ``Unavailable`` where a check cannot run without the tool) when it hangs
    past ``timeout`` seconds or cannot start. The exit status is the caller's to judge. Without an
    ``env`` the tool gets ``declared_env()``, never the caller's whole environment."""
    error = Unavailable if unavailable else SglpatchError
    kwargs.setdefault("text", not isinstance(kwargs.get("input"), bytes))
    if kwargs.get("env") is None:
        kwargs["env"] = declared_env()
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
    if kwargs.get("env") is None:
        kwargs["env"] = declared_env()
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
