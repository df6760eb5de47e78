"""``sglpatch profile``: a launch profile as the command line it stands for."""

from __future__ import annotations

import argparse

from sglpatch import exitcodes
from sglpatch.cli_options import add, say
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.serving.profile import DEPTHS_SAID, check_depth, load_profile


def speculative_depth(value: str) -> int:
    """``--depth``'s value, refused by the parser (one line) where it is no depth."""
    try:
        return check_depth(int(value))
    except (ValueError, SglpatchError):
        raise argparse.ArgumentTypeError(f"{value!r} is no speculative depth: a depth is {DEPTHS_SAID}") from None


def register(sub) -> None:
    parser = add(sub, "profile", run, "print a launch profile as a command line", needs_project=False)
    parser.add_argument("name", nargs="?", default="glm-5.2-mxfp4-mi355x")
    parser.add_argument("--depth", type=speculative_depth, metavar="D",
                        help=f"speculative depth D, {DEPTHS_SAID}: D steps, top-k 1, D+1 draft tokens")
    parser.add_argument("--model", help="model folder (default: the profile's, or $SGLPATCH_MODEL)")


def run(project, args) -> int:
    profile = load_profile(args.name)
    if args.depth is not None:
        profile = profile.with_depth(args.depth)
    say(args, f"# {profile.name} v{profile.version}: {profile.description}")
    say(args, profile.command(args.model))
    return exitcodes.OK
