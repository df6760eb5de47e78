"""Probe for the ``upstream-test`` witness: run a patch's regression tests, written in sglang's own
layout (``test/registered/unit/...``), against the tree's sglang.

Runs in the pin's CPU Python under ``runner.py`` (a child of the fork server, on the emulated
MI355X box of ``rocm_box``, with the stand-ins for the GPU-only packages), in a child of its own:
no other probe has touched sglang's global state first. Spec::

    {"tests": [{"name": "test/registered/unit/.../test_x.py", "path": "/abs/path/test_x.py"}, ...]}

Each file is first parsed by the tree's own CI collector (``sglang.test.ci.ci_register``, as
upstream's suite runner does): a file it would refuse (no ``register_cpu_ci`` call, no
``if __name__ == "__main__"`` block that runs something) is answered ``refused``. Then the file
is imported as a module of its own and its ``unittest`` cases run, hermetic (``hermetic``): an
empty ``HOME``, temporary folder and working folder of its own, and no network (the child leaves
the machine's network namespace where the kernel lets it, and refuses every non-local socket in
any case), with ``os.environ`` restored afterwards. The answer, per file: ``tests`` (the id of
every test that started), ``tests_run``, ``failures`` (a failed assertion, also one that sglang's
``CustomTestCase`` re-raised as its retry's error), ``errors`` (any other exception: test id and
the last lines of the traceback), ``skipped`` (test id and reason), ``expected_failures`` and
``unexpected_successes`` (``@expectedFailure``), ``tree_changed`` (the tree's files the tests
added, removed or wrote to: a test must leave the tree it judges as it found it),
``registrations`` (what the collector read), ``output`` (the runner's text, its tail), or
``unavailable`` (why the file could not be run at all: the collector is missing, the file does
not import). ``hermetic`` says how the child was cut off.

No sglpatch imports: this file runs in the pin's interpreter, not ours.
"""

from __future__ import annotations

import ctypes
import importlib
import importlib.util
import io
import os
import socket
import sys
import tempfile
import traceback
import unittest

import tree_state

TAIL = 1500


def _collector(path: str) -> tuple[list[str], bool | None]:
    """What sglang's own collector reads in the file: its CPU registrations and whether it has a
    main block (None where the release's collector does not say)."""
    from sglang.test.ci import ci_register

    parsed = ci_register.ut_parse_one_file(path)
    registries, has_main = parsed if isinstance(parsed, tuple) else (parsed, None)
    found = []
    for registry in registries:
        backend = getattr(getattr(registry, "backend", None), "name", "?")
        suite = getattr(registry, "effective_suite", None) or getattr(registry, "suite", None)
        found.append(f"{backend}:{suite}")
    return found, has_main


def _short(text: str) -> str:
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return "\n".join(lines[-6:])[-TAIL:]


class _Result(unittest.TextTestResult):
    """Also tells, for each error, whether an assertion failed underneath it: sglang's
    ``CustomTestCase`` retries a test and reports a failed assertion as the retry's exception."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.asserted: set[str] = set()
        self.started: list[str] = []

    def startTest(self, test):
        self.started.append(test.id())
        super().startTest(test)

    def addError(self, test, err):
        exc, seen = err[1], set()
        while exc is not None and id(exc) not in seen:
            seen.add(id(exc))
            if isinstance(exc, AssertionError):
                self.asserted.add(test.id())
                break
            exc = exc.__cause__ or exc.__context__
        super().addError(test, err)


def _assertion(text: str) -> str:
    """The exception's own lines (the first traceback of a chain: the retry's wrapper comes
    after it)."""
    first = text.split("\nDuring handling of the above exception")[0]
    return _short(first)


# -- hermetic: what a test may not reach ---------------------------------------------------------

CLONE_NEWUSER, CLONE_NEWNET = 0x10000000, 0x40000000
SIOCGIFFLAGS, SIOCSIFFLAGS, IFF_UP = 0x8913, 0x8914, 0x1
NO_NETWORK = "no network in a regression test's run: sglpatch runs the tests hermetic"
_CUT_OFF: list[str] = []  # how this child left the network, once


def _loopback_up() -> None:
    """Bring up ``lo`` in a fresh network namespace: local sockets stay local tests' to use."""
    import fcntl
    import struct

    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        request = struct.pack("16sH", b"lo", 0)
        flags = struct.unpack("16sH", fcntl.ioctl(probe, SIOCGIFFLAGS, request))[1]
        fcntl.ioctl(probe, SIOCSIFFLAGS, struct.pack("16sH", b"lo", flags | IFF_UP))


def _is_local(address) -> bool:
    host = address[0] if isinstance(address, tuple) and address else address
    return isinstance(host, str) and (host in ("localhost", "", "::1") or host.startswith("127."))


def _refuse_non_local_sockets() -> None:
    """Every connection or datagram to a non-local address, and every name lookup but the local
    one, raises ``OSError`` naming why; Unix sockets and loopback stay."""

    def guarded(method):
        def refuse_the_network(self, address, *args):
            if self.family in (socket.AF_INET, socket.AF_INET6) and not _is_local(address):
                raise OSError(101, f"{NO_NETWORK} ({method.__name__} to {address!r})")
            return method(self, address, *args)

        return refuse_the_network

    for name in ("connect", "connect_ex"):
        setattr(socket.socket, name, guarded(getattr(socket.socket, name)))
    sendto = socket.socket.sendto

    def refuse_sendto(self, data, *args):
        if self.family in (socket.AF_INET, socket.AF_INET6) and args and not _is_local(args[-1]):
            raise OSError(101, f"{NO_NETWORK} (sendto {args[-1]!r})")
        return sendto(self, data, *args)

    socket.socket.sendto = refuse_sendto
    lookup = socket.getaddrinfo

    def refuse_lookup(host, *args, **kwargs):
        if not _is_local((host,)):
            raise socket.gaierror(-2, f"{NO_NETWORK} (lookup of {host!r})")
        return lookup(host, *args, **kwargs)

    socket.getaddrinfo = refuse_lookup


def leave_the_network() -> str:
    """Cut this child off the network, once: a network namespace of its own where the kernel lets
    it (as root, or through a user namespace), with only loopback up; and non-local sockets
    refused in Python in any case. Says how."""
    if _CUT_OFF:
        return _CUT_OFF[0]
    how = []
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        for flags, what in ((CLONE_NEWNET, "a network namespace of its own"),
                            (CLONE_NEWUSER | CLONE_NEWNET, "a user and network namespace of its own")):
            if libc.unshare(flags) == 0:
                try:
                    _loopback_up()
                    how.append(f"{what}, loopback only")
                except OSError as exc:
                    how.append(f"{what}, no interface up ({exc})")
                break
        else:
            how.append(f"no namespace ({os.strerror(ctypes.get_errno())})")
    except (OSError, AttributeError) as exc:
        how.append(f"no namespace ({exc})")
    _refuse_non_local_sockets()
    how.append("non-local sockets and name lookups refused")
    _CUT_OFF.append("; ".join(how))
    return _CUT_OFF[0]


def _own_folders(workdir: str) -> str:
    """An empty home, temporary folder and working folder of the file's own (``os.environ`` is
    restored by the caller); the folder that holds them."""
    root = tempfile.mkdtemp(prefix="test-run-", dir=workdir)
    folders = {name: os.path.join(root, name) for name in ("home", "tmp", "cwd")}
    for folder in folders.values():
        os.mkdir(folder)
    for name in [key for key in os.environ if key.startswith("XDG_")]:
        del os.environ[name]
    os.environ.update(HOME=folders["home"], TMPDIR=folders["tmp"], TMP=folders["tmp"], TEMP=folders["tmp"])
    tempfile.tempdir = None  # read TMPDIR again
    os.chdir(folders["cwd"])
    return root


def run_file(name: str, path: str, workdir: str | None = None) -> dict:
    answer: dict = {"name": name}
    try:
        registrations, has_main = _collector(path)
    except ImportError as exc:
        answer["unavailable"] = f"the release has no CI collector (sglang.test.ci.ci_register): {exc}"
        return answer
    except SyntaxError as exc:
        answer["unavailable"] = f"the file does not parse: {exc}"
        return answer
    answer["registrations"] = registrations
    refused = []
    if not any(r.startswith("CPU:") for r in registrations):
        refused.append("no register_cpu_ci(...) call at the top")
    if has_main is False or "if __name__ ==" not in open(path, encoding="utf-8").read():
        refused.append('no `if __name__ == "__main__": unittest.main()` block')
    if refused:
        answer["refused"] = "sglang's CI collector would refuse it: " + "; ".join(refused)
        return answer
    module_name = "sglpatch_upstream_test_" + os.path.splitext(os.path.basename(path))[0]
    environ, cwd, tempdir = dict(os.environ), os.getcwd(), tempfile.tempdir
    try:
        _own_folders(workdir or tempfile.mkdtemp(prefix="sglpatch-test-run-"))
        spec = importlib.util.spec_from_file_location(module_name, path)
        module = importlib.util.module_from_spec(spec)
        sys.modules[module_name] = module
        try:
            spec.loader.exec_module(module)
        except BaseException as exc:  # noqa: BLE001 - the file cannot be run here: say why
            if isinstance(exc, KeyboardInterrupt):
                raise
            answer["unavailable"] = f"the test file does not import: {type(exc).__name__}: {exc}"
            answer["traceback"] = traceback.format_exc(limit=-6)[-TAIL:]
            return answer
        suite = unittest.defaultTestLoader.loadTestsFromModule(module)
        stream = io.StringIO()
        result = unittest.TextTestRunner(stream=stream, verbosity=2, resultclass=_Result).run(suite)
    finally:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        tempfile.tempdir = tempdir
        sys.modules.pop(module_name, None)
    answer.update(
        tests=result.started,
        tests_run=result.testsRun,
        failures=[{"test": test.id(), "detail": _assertion(text)} for test, text in result.failures]
        + [{"test": test.id(), "detail": _assertion(text)} for test, text in result.errors if test.id() in result.asserted],
        # The first exception of a chain: what went wrong, not CustomTestCase's retry wrapper.
        errors=[{"test": test.id(), "detail": _assertion(text)} for test, text in result.errors
                if test.id() not in result.asserted],
        unexpected_successes=[test.id() for test in result.unexpectedSuccesses],
        expected_failures=[{"test": test.id(), "detail": _assertion(text)} for test, text in result.expectedFailures],
        skipped=[{"test": test.id(), "reason": reason} for test, reason in result.skipped],
        output=stream.getvalue()[-4000:],
    )
    return answer


def run(spec: dict, context) -> dict:
    files = {}
    hermetic = leave_the_network()
    # The tree's checkout (the parent of its python/ folder): what the tests must leave as they found it.
    tree = os.path.dirname(os.path.abspath(context.tree)) if getattr(context, "tree", None) else None
    states = tree_state.file_states(tree) if tree else None
    for test in spec.get("tests", []):
        context.phase(f"test {test['name']}")
        files[test["name"]] = run_file(test["name"], test["path"], context.workdir)
        if states is not None:
            after = tree_state.file_states(tree)
            files[test["name"]]["tree_changed"] = tree_state.differences(states, after)[:50]
            states = after
    return {"files": files, "hermetic": f"own empty HOME, temporary and working folders per file; network: {hermetic}"}
