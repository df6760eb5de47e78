"""upstream/pins.toml: the pins we ship, the refusals for a malformed pins file, and the file
written with a pin added or removed."""

from __future__ import annotations

import dataclasses

import pytest

from conftest import REPO_ROOT
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources.pins import load_pins, with_pin, without_pin


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
        (GOOD.format(sha="a" * 64).replace("[[pin]]", "[pin]"), r"array of tables, written \[\[pin\]\]"),
        (GOOD.format(sha="a" * 64).replace('sha256 = "' + "a" * 64 + '"', "sha256 = 12345"), "sha256 must be a string"),
        (GOOD.format(sha="a" * 64).replace("2026-01-01T00:00:00Z", "2026-13-01T00:00:00Z"), "released .* is not a real time"),
        (GOOD.format(sha="a" * 64).replace("2026-01-01T00:00:00Z", "last tuesday"), "released .* must be a UTC time"),
        (GOOD.format(sha="a" * 64) + 'commit_verified = "yes"\n', "commit_verified must be true or false"),
        (GOOD.format(sha="a" * 64).replace('"sglang-0.1.0.tar.gz"', '"../sglang-0.1.0.tar.gz"'), "must be a plain file name"),
        ('index_url = "file:///somewhere"\n' + GOOD.format(sha="a" * 64), "index_url is not read here"),
    ],
)
def test_malformed_pins_file_is_refused_naming_the_file(tmp_path, body, message):
    path = _pins_file(tmp_path, body)
    with pytest.raises(SglpatchError, match=message) as error:
        load_pins(path)
    assert str(path) in str(error.value) and "\n" not in str(error.value)


def test_a_field_error_names_the_line_of_its_pin(tmp_path):
    body = GOOD.format(sha="a" * 64).replace('"0.1.0"', '"0.2.0"').replace("v0.1.0", "v0.2.0")
    body = body.replace("sglang-0.1.0", "sglang-0.2.0") + GOOD.format(sha="bad")
    path = _pins_file(tmp_path, body)
    second = body.splitlines().index("[[pin]]", 2) + 1
    with pytest.raises(SglpatchError, match=rf"{path}:{second}: pin #2 \(0.1.0\): sha256"):
        load_pins(path)


def test_the_cli_refuses_a_bad_pins_file_in_one_line_and_changes_nothing(tmp_path):
    import shutil
    import subprocess
    import sys

    root = tmp_path / "project"
    shutil.copytree(REPO_ROOT / "patches", root / "patches")
    (root / "upstream").mkdir()
    pins = root / "upstream" / "pins.toml"
    pins.write_text(GOOD.format(sha="a" * 64).replace("[[pin]]", "[pin]"))
    before = sorted(p.relative_to(root) for p in root.rglob("*"))
    for command in (["pins"], ["apply"], ["check"]):
        run = subprocess.run([sys.executable, "-m", "sglpatch", "--root", str(root), *command],
                             capture_output=True, text=True, cwd=tmp_path)
        assert run.returncode == 2, (command, run.stdout, run.stderr)
        assert run.stderr.strip().count("\n") == 0 and str(pins) in run.stderr, run.stderr
        assert "Traceback" not in run.stderr
    assert sorted(p.relative_to(root) for p in root.rglob("*")) == before


def test_unknown_pin_is_refused_with_the_pinned_list(tmp_path):
    pins = load_pins(_pins_file(tmp_path, GOOD.format(sha="a" * 64)))
    with pytest.raises(SglpatchError, match=r"unknown pin 0.9.9; pinned: 0.1.0"):
        pins.select(["0.9.9"])
    assert pins.select(["v0.1.0"])[0].version == "0.1.0"


def test_a_pin_written_in_goes_in_version_order_and_out_again_leaving_the_file_as_it_was(tmp_path):
    text = (REPO_ROOT / "upstream" / "pins.toml").read_text()
    shipped = load_pins(REPO_ROOT / "upstream" / "pins.toml")
    new = dataclasses.replace(shipped.pins[1], version="0.5.10.post2", tag="v0.5.10.post2",
                              artifact="sglang-0.5.10.post2.tar.gz", commit_evidence='a "quoted" word')
    written = with_pin(text, new, note="the newest file time inside the artifact")
    assert written.startswith(text[: text.index("[[pin]]")])  # the file's own comments are kept
    assert '[[pin]]\n# released: the newest file time inside the artifact\nversion = "0.5.10.post2"\n' in written
    pins = load_pins(_pins_file(tmp_path, written))
    assert [pin.version for pin in pins.pins][1:4] == ["0.5.10.post1", "0.5.10.post2", "0.5.11"]
    assert pins.select(["0.5.10.post2"])[0] == new
    assert without_pin(written, "0.5.10.post2") == text
    appended = with_pin(text, dataclasses.replace(new, version="9.0", artifact="sglang-9.0.tar.gz"))
    assert appended.startswith(text.rstrip("\n") + '\n\n[[pin]]\nversion = "9.0"\n')
    assert load_pins(_pins_file(tmp_path, appended)).newest.version == "9.0"
    with pytest.raises(SglpatchError, match="9.9 is not pinned"):
        without_pin(text, "9.9")
