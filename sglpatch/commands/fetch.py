"""``sglpatch fetch``: build (or reuse) the pristine commit of pins."""

from __future__ import annotations

from sglpatch import exitcodes
from sglpatch.cli_options import add, say
from sglpatch.sources import pristine_tree


def register(sub) -> None:
    parser = add(sub, "fetch", run, "build (or reuse) the pristine commit of pins")
    parser.add_argument("pins", nargs="*", help="pin versions (default: all)")
    parser.add_argument("--git-url", help="fetch from this git remote or mirror and check the SHA")


def run(project, args) -> int:
    for pin in project.pins().select(args.pins):
        pristine = pristine_tree.pristine_from_git(pin, args.git_url) if args.git_url else pristine_tree.pristine_from_index(pin)
        say(args, f"{pin.version}: {pristine.commit} ({pristine.source}) in {pristine.repo}")
    return exitcodes.OK
