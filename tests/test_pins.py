"""upstream/pins.toml: the pins we ship, and the refusals for a malformed pins file."""

from __future__ import annotations

import pytest

from conftest import REPO_ROOT
from sglpatch.errors import SglpatchError
from sglpatch.pins import load_pins


def test_shipped_pins_span_0_5_10_to_the_newest_release_with_sdists_then_wheels():
    pins = load_pins(REPO_ROOT / "upstream" / "pins.toml")
    versions = [pin.version for pin in pins.pins]
    assert len(versions) >= 5 and versions[0] == "0.5.10" and pins.newest.version == "0.5.23"
    for pin in pins.pins:
        expected = "sdist" if pin.parsed_version <= pins.pins[1].parsed_version else "wheel"
        assert pin.artifact_kind == expected, pin
        assert pin.rocm_image == f"lmsysorg/sglang:v{pin.version}-rocm720-mi35x"
        assert pin.commit_evidence, f"{pin.version}: say where the commit came from, or that none was found"


def _pins_file(tmp_path, body):
    path = tmp_path / "pins.toml"
    path.write_text(body)
    return path


GOOD = """
[[pin]]
version = "0.1.0"
tag = "v0.1.0"
artifact = "sglang-0.1.0.tar.gz"
sha256 = "{sha}"
released = "2026-01-01T00:00:00Z"
rocm_image = "img"
"""


@pytest.mark.parametrize(
    "body, message",
    [
        (GOOD.format(sha="abc"), "sha256 must be 64 lowercase hex digits"),
        (GOOD.format(sha="a" * 64).replace('tag = "v0.1.0"\n', ""), "missing tag"),
        (GOOD.format(sha="a" * 64) * 2, "pin 0.1.0 listed more than once"),
        (GOOD.format(sha="a" * 64).replace('"sglang-0.1.0.tar.gz"', '"sglang-0.2.0.tar.gz"'), "is not of this version"),
        (GOOD.format(sha="a" * 64) + 'commit = "1234"\n', "commit must be a full 40-digit SHA"),
        ("[[pin]\n", "not valid TOML"),
    ],
)
def test_malformed_pins_file_is_refused_naming_the_file(tmp_path, body, message):
    path = _pins_file(tmp_path, body)
    with pytest.raises(SglpatchError, match=message) as error:
        load_pins(path)
    assert str(path) in str(error.value)


def test_unknown_pin_is_refused_with_the_pinned_list(tmp_path):
    pins = load_pins(_pins_file(tmp_path, GOOD.format(sha="a" * 64)))
    with pytest.raises(SglpatchError, match=r"unknown pin 0.9.9; pinned: 0.1.0"):
        pins.select(["0.9.9"])
    assert pins.select(["v0.1.0"])[0].version == "0.1.0"
