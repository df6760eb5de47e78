"""``sglpatch cpu-env``: build (or reuse) the CPU Python the witnesses' probes run in."""

from __future__ import annotations

from sglpatch import exitcodes, pyenv
from sglpatch.cli_options import add, jobs_flag, say


def register(sub) -> None:
    parser = add(sub, "cpu-env", run, "build (or reuse) the CPU Python the witnesses' probes run in")
    parser.add_argument("pins", nargs="*", help="pin versions (default: all)")
    jobs_flag(parser, "build distinct environments")


def run(project, args) -> int:
    pins = project.pins().select(args.pins)
    for pin, python in zip(pins, pyenv.cpu_pythons(pins, args.jobs)):
        overlay = " ".join(f"{name}{spec}" for name, spec in python.overlay.items()) or "(the base alone)"
        say(args, f"{pin.version}: {python.python}  {overlay}")
    return exitcodes.OK
