"""The project's two exception types, so the CLI can print them plainly and tell them apart."""


class SglpatchError(Exception):
    """A refusal with a message that names the file, patch, hunk or pin at fault."""


class Unavailable(SglpatchError):
    """A check, environment or engine that cannot run here; the message says why.

    Never a pass: a witness that raises it answers "unavailable", a matrix part is skipped, and
    where the check is required that is a failure."""
