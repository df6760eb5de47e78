"""The sglpatch command line: one verb per file in sglpatch/commands/, each a door onto the library.

A verb's module is imported only when that verb runs or its own help is asked for: the list of
verbs (``sglpatch``, ``sglpatch --help``) and a light verb (``sglpatch pins``) do not pay for
importing the heavy ones (``parser()`` with no verb named builds them all, for the command
reference and the tests)."""

from __future__ import annotations

import argparse
import difflib
import importlib
import os
import sys
from pathlib import Path

from sglpatch import __version__
from sglpatch import exitcodes
from sglpatch.plumbing import interrupts, progress
from sglpatch.plumbing.errors import SglpatchError, Unavailable
from sglpatch.plumbing.project import Project

# Each verb's one line, in the order --help lists them; its module is sglpatch.commands.<name with _>.
# tests/test_cli.py keeps each line equal to the one the verb's own parser registers.
VERBS = {
    "apply": "apply the series to pinned sglang releases",
    "witness": "run each patch's witness on pins, pristine and patched (records nothing)",
    "check": "lint the series, patches, trailers and renditions; judge each patch's tests where its fix was written",
    "pins": "list the pinned releases",
    "fetch": "build (or reuse) the pristine commit of pins",
    "cpu-env": "build (or reuse) the CPU Python the witnesses' probes run in",
    "patch": "write patches on a pin's tree: start, refresh (quilt and git habits)",
    "export": "a pin's applied series as a quilt folder or an mbox for git am",
    "image": "build the pin's patched image FROM its released ROCm image (docker)",
    "upstream": "prepare one patch as upstream pull requests",
    "rebase": "rebase the series onto a new sglang release",
    "status": "the last apply's Upstream-Status suggestions; --write puts them in the patches",
    "watch": "rebase the series onto every release on the index newer than the newest pin",
    "series": "series versions: bump, diff",
    "profile": "print a launch profile as a command line",
    "quark-mtp-exclude": "copy a Quark checkpoint's MTP exclude entries under sglang's decoder names (config.json only)",
    "matrix": "the test matrix: run a cell, list cells, render the table, plan CI",
    "bench": "the bench: run a workload, the accuracy gate, MoE tuning, report, compare",
    "rehearse": "the ROCm job's checks against each pin's real sglang server on CPU (records no verdict)",
}
ALL = "*"

DESCRIPTION = """\
Reproducible fixes for sglang on AMD ROCm: a versioned patch series applied to
pinned sglang releases, each patch proven by a witness, with a test matrix and
upstream pull requests. `sglpatch COMMAND --help` tells more of each command."""


def main(argv: list[str] | None = None) -> int:
    """Run one command; every way it can stop ends in one line and an exit status of
    ``exitcodes``: a refusal (``SglpatchError``, or an ``OSError`` such as a read-only file system,
    naming its file) exits 2, a check that cannot run here 4, and Ctrl-C 130, saying what was
    changed before it stopped, or that nothing was. (Any other exception is a bug of ours, and its
    traceback is what to report.)"""
    argv = sys.argv[1:] if argv is None else list(argv)
    interrupts.forget()
    try:
        return _run(argv)
    except KeyboardInterrupt:
        _say(f"interrupted: {interrupts.said()}")
        return exitcodes.INTERRUPTED
    except Unavailable as exc:
        _say(f"cannot run here: {exc}")
        return exitcodes.UNAVAILABLE
    except SglpatchError as exc:
        _say(f"error: {exc}")
        return exitcodes.USAGE
    except BrokenPipeError:
        # The reader of the output went away (`sglpatch pins | head -1`): nobody is left to tell.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return exitcodes.READER_GONE
    except OSError as exc:
        _say(f"error: {os_error(exc)}")
        return exitcodes.USAGE
    finally:
        progress.stop()


def _run(argv: list[str]) -> int:
    verb = verb_in(argv)
    if verb is not None and verb not in VERBS:
        print(f"sglpatch: error: {unknown_verb(verb)}", file=sys.stderr)
        return exitcodes.USAGE
    top = parser(verb)
    wrong = verb and unknown_action(top, verb, argv[argv.index(verb) + 1:])
    if wrong:
        print(f"sglpatch {verb}: error: {wrong}", file=sys.stderr)
        return exitcodes.USAGE
    try:
        args, extra = top.parse_known_args(argv)
    except SystemExit as exc:  # argparse has said it (help, version, or a usage error in one line)
        return exc.code if isinstance(exc.code, int) else exitcodes.USAGE
    if extra:
        print(f"sglpatch{f' {verb}' if verb else ''}: error: {unknown_arguments(extra, verb)}", file=sys.stderr)
        return exitcodes.USAGE
    if getattr(args, "run", None) is None:
        print(verb_list(), file=sys.stderr)
        return exitcodes.USAGE
    progress.configure("quiet" if args.quiet else "auto")
    project = Project.find(args.root) if args.needs_project else None
    return args.run(project, args)


def _say(line: str) -> None:
    progress.stop()
    print(f"sglpatch: {line}", file=sys.stderr)


def os_error(exc: OSError) -> str:
    """An error of the operating system in one line, naming the file (both, for a rename)."""
    where = ": ".join(str(name) for name in (exc.filename, exc.filename2) if name is not None)
    what = exc.strerror or str(exc)
    return f"{where}: {what}" if where else what


def parser(verb: str | None = ALL) -> argparse.ArgumentParser:
    """sglpatch's parser: every verb's own (the default), only ``verb``'s with the others listed
    by name and line, or (None) only the list."""
    top = OneLineErrors(
        prog="sglpatch",
        description=DESCRIPTION,
        epilog=exitcodes.TABLE,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    _top_options(top)
    sub = top.add_subparsers(metavar="COMMAND")
    for name, line in VERBS.items():
        if verb in (ALL, name):
            importlib.import_module(f"sglpatch.commands.{name.replace('-', '_')}").register(sub)
        else:
            sub.add_parser(name, help=line)
    return top


class OneLineErrors(argparse.ArgumentParser):
    """argparse's parser (and its verbs' and their actions', which take its class), saying a usage
    error in one line, with where to read the arguments, instead of the usage and the error."""

    def error(self, message):
        self.exit(exitcodes.USAGE, f"{self.prog}: error: {message} (`{self.prog} --help` tells its arguments)\n")


def unknown_arguments(extra: list[str], verb: str | None) -> str:
    """Arguments no parser took, and where an option among them is another verb's, that verb's
    option and what it takes (``apply --depth 9``: the speculative depth is ``profile``'s)."""
    said = f"unrecognized arguments: {' '.join(extra)}"
    option = next((item.split("=", 1)[0] for item in extra if item.startswith("--")), None)
    if option is None:
        return said
    owners = [(name, sub._option_string_actions[option]) for name, sub in _choices(parser(ALL)).items()
              if name != verb and option in sub._option_string_actions]
    if not owners:
        return said
    name, action = owners[0]
    return f"{said}; {option} is an option of sglpatch {name}" + (f": {action.help}" if action.help else "")


def _top_options(top: argparse.ArgumentParser) -> None:
    top.add_argument("--version", action="version", version=f"sglpatch {__version__}")
    top.add_argument("--root", type=Path, default=None, help="the project folder (default: the one around the current folder, else the clone sglpatch was installed from)")
    top.add_argument("-q", "--quiet", action="store_true", help="no progress display; only results and errors")


def verb_in(argv: list[str]) -> str | None:
    """The verb ``argv`` names: its first word that is neither one of sglpatch's own options nor
    their value (None when there is none)."""
    pre = argparse.ArgumentParser(add_help=False, exit_on_error=False)
    pre.add_argument("--root")
    pre.add_argument("-q", "--quiet", action="store_true")
    pre.add_argument("verb", nargs="?")
    pre.add_argument("rest", nargs=argparse.REMAINDER)
    try:
        known, _ = pre.parse_known_args(argv)
    except argparse.ArgumentError:  # a malformed --root: the real parser says so
        return None
    return known.verb


def unknown_verb(word: str) -> str:
    """A word that is no verb, with the nearest verb where one is near (as git does)."""
    near = difflib.get_close_matches(word, VERBS, n=1, cutoff=0.6)
    if near:
        return f"'{word}' is not a command; did you mean '{near[0]}'?"
    return f"'{word}' is not a command.\n\n{verb_list()}"


def unknown_action(top: argparse.ArgumentParser, verb: str, rest: list[str]) -> str | None:
    """For a verb with actions (``matrix run``, ``patch refresh``): a word after it that is no
    action, with the nearest action where one is near."""
    actions = _choices(_choices(top)[verb])
    word = next((item for item in rest if not item.startswith("-")), None)
    if not actions or word is None or word in actions:
        return None
    near = difflib.get_close_matches(word, actions, n=1, cutoff=0.6)
    hint = f"did you mean '{near[0]}'?" if near else f"its actions: {', '.join(actions)}"
    return f"'{word}' is not an action of {verb}; {hint}"


def _choices(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    subparsers = [action for action in parser._actions if isinstance(action, argparse._SubParsersAction)]
    return subparsers[0].choices if subparsers else {}


def verb_list() -> str:
    """The verbs, one line each: what ``sglpatch`` alone prints."""
    width = max(map(len, VERBS))
    lines = [f"  {name:<{width}}  {line}" for name, line in VERBS.items()]
    return "\n".join(["usage: sglpatch [--root ROOT] [-q] COMMAND [ARGS]", "", "commands:", *lines, "",
                      "`sglpatch COMMAND --help` tells more of each command; `sglpatch --help` the exit statuses."])
