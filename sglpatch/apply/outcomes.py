"""What became of a patch: on a pin, as ``apply`` classifies it (the status in the report and in
``series.lock``), and on a new release, as ``rebase`` classifies it (the verdict in its report).

One vocabulary for both, the values being the words written to JSON, reports and the lock.
"""

from __future__ import annotations

import enum


class Outcome(enum.StrEnum):
    # apply, on a pin
    APPLIED = "applied"
    APPLIED_WITH_OFFSET = "applied-with-offset"
    # git's three-way apply from the blobs the rendition was made on (a neighbouring pin's tree)
    APPLIED_THREE_WAY = "applied-three-way"
    ALREADY_UPSTREAM = "already-upstream"  # also rebase's: a rendition reverse-applies on the release
    CONFLICT = "conflict"
    MISSING_FILE = "missing-file"
    NOT_APPLICABLE = "not-applicable"
    NOT_NEEDED = "not-needed"
    WITNESS_FAILED = "witness-failed"
    WITNESS_UNAVAILABLE = "witness-unavailable"  # also rebase's: nothing can confirm a port
    # The patch's proof cannot stand: its tests pass on the pristine release the fix was written for,
    # or they and its own witness disagree on a tree (``witnesses.agreement``).
    WITNESS_REFUSED = "witness-refused"
    # rebase, on a release that is not pinned
    CARRIES_OVER = "carries-over"
    NEW_RENDITION = "new-rendition"
    FIXED_UPSTREAM = "fixed-upstream"
    NEEDS_HAND_PORT = "needs-hand-port"


# The statuses of a patch committed on the pin.
APPLIED_STATES = (Outcome.APPLIED, Outcome.APPLIED_WITH_OFFSET, Outcome.APPLIED_THREE_WAY)
# The statuses that fail a pin.
FAILURES = (Outcome.CONFLICT, Outcome.MISSING_FILE, Outcome.WITNESS_FAILED, Outcome.WITNESS_UNAVAILABLE,
            Outcome.WITNESS_REFUSED)
# The rebase verdicts that settle a patch on the release; any other leaves it to a person.
CLASSIFIED = (Outcome.CARRIES_OVER, Outcome.NEW_RENDITION, Outcome.ALREADY_UPSTREAM, Outcome.FIXED_UPSTREAM)
