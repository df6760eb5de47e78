"""What ``sglpatch`` exits with, so scripts and CI can tell the cases apart (``TABLE``)."""

from __future__ import annotations

from sglpatch.apply.outcomes import FAILURES, Outcome

OK = 0
FAILED = 1
USAGE = 2
LOCK_MISMATCH = 3
UNAVAILABLE = 4
INTERRUPTED = 130  # as shells report a command stopped by SIGINT (128 + 2)
READER_GONE = 141  # the output's reader went away, as shells report SIGPIPE (128 + 13)

TABLE = """\
exit status:
  0  ok
  1  a patch or a check failed: a conflict, a witness that still finds the bug, lint problems,
     a failed matrix cell, a rebase that cannot classify every patch
  2  usage or bad input: a bad argument, a malformed pins.toml, patch or lock, a file that cannot
     be written (a read-only checkout); one line names it, and nothing is changed
  3  the result differs from series.lock (apply --update-lock accepts it, for review)
  4  a witness or check could not run here (no toolchain, no CPU environment; the reason is printed)
  130  interrupted (Ctrl-C): the line says what was changed before it stopped, or that nothing was
  141  the output's reader went away (a pipe into head closed early); nothing more is said
  where several apply, the first of 1, 4, 3 wins"""


def for_pins(results) -> int:
    """The exit status of an apply or witness run from its per-pin results."""
    statuses = [outcome.status for result in results for outcome in result.patches]
    if any(status in FAILURES and status != Outcome.WITNESS_UNAVAILABLE for status in statuses):
        return FAILED
    if Outcome.WITNESS_UNAVAILABLE in statuses:
        return UNAVAILABLE
    if any(result.lock == "mismatch" for result in results):
        return LOCK_MISMATCH
    return FAILED if any(not result.ok for result in results) else OK
