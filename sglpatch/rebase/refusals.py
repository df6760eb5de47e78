"""What ``sglpatch rebase V`` refuses before it starts, in a second or two: a ``V`` that is not a
version, a release already pinned, one older than every pin (unless ported backwards on
purpose), one the package index does not have.

Light on purpose: ``nox -s rebase`` asks it in nox's own Python, before it installs sglpatch or
builds the witnesses' toolchain, so it imports none of the rebase's machinery (and none of
sglpatch's dependencies but ``packaging``, which nox has too).
"""

from __future__ import annotations

from packaging.version import InvalidVersion, Version

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources import index_listing, package_index
from sglpatch.sources.pins import Pins

BACKWARDS_FLAG = "--backwards"


def release_to_port(pins: Pins, given: str, *, backwards: bool = False) -> str:
    """``given`` as the release a rebase takes (a leading ``v`` dropped), or refused in one line:
    not a version, already pinned, or older than every pin without ``backwards``. Reads nothing
    but the pins."""
    version = given.removeprefix("v")
    try:
        parsed = Version(version)
    except InvalidVersion:
        raise SglpatchError(f"'{given}' is not a version: rebase takes an sglang release, such as one newer than "
                            f"the newest pin ({pins.newest.version})") from None
    if any(pin.parsed_version == parsed for pin in pins.pins):
        raise SglpatchError(f"{pins.path}: {version} is already pinned")
    oldest = min(pins.pins, key=lambda pin: pin.parsed_version)
    if parsed < oldest.parsed_version and not backwards:
        raise SglpatchError(
            f"sglang {version} is older than every pin (the oldest is {oldest.version}): rebase ports the series "
            f"forward, onto a newer release or one between two pins; {BACKWARDS_FLAG} ports it back anyway (an "
            "older release may hold bugs the series does not fix)"
        )
    return version


def refuse_unless_on_the_index(version: str, index=None) -> None:
    """Refused in one line, naming the index, where it has no file of sglang ``version``."""
    released = index_listing.released_versions(index)
    if Version(version) not in released:
        where = package_index.resolve(index).describe()
        newest = f"; the newest there is {released[-1]}" if released else ""
        raise SglpatchError(f"sglang {version} is not on the package index {where}{newest}")


def refuse_before_porting(pins: Pins, given: str, *, backwards: bool = False, index=None) -> str:
    """``release_to_port``, then the index asked: the release a rebase can start on, or a refusal."""
    version = release_to_port(pins, given, backwards=backwards)
    refuse_unless_on_the_index(version, index)
    return version
