"""``sglpatch profile``: a launch profile as the command line it stands for."""

from __future__ import annotations

from sglpatch import exitcodes
from sglpatch.cli_options import add, say
from sglpatch.serving.profile import load_profile


def register(sub) -> None:
    parser = add(sub, "profile", run, "print a launch profile as a command line", needs_project=False)
    parser.add_argument("name", nargs="?", default="glm-5.2-mxfp4-mi355x")
    parser.add_argument("--depth", type=int, help="speculative depth d: d steps, top-k 1, d+1 draft tokens")
    parser.add_argument("--model", help="model folder (default: the profile's, or $SGLPATCH_MODEL)")


def run(project, args) -> int:
    profile = load_profile(args.name)
    if args.depth is not None:
        profile = profile.with_depth(args.depth)
    say(args, f"# {profile.name} v{profile.version}: {profile.description}")
    say(args, profile.command(args.model))
    return exitcodes.OK
