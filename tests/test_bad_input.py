"""Bad input gets a one-line error naming the file (and line), and changes nothing.

Each case here gave a Python traceback before: a series entry outside patches/, a lock that is not
an object, an artifact without core metadata, a malformed launch profile, a bad pins.toml under
`nox -l`. (pins.toml's own cases are in test_pins.py.)
"""

from __future__ import annotations

import io
import shutil
import subprocess
import sys
import tarfile
import zipfile

import pytest

from conftest import REPO_ROOT
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.series import lock
from sglpatch.series.patches import series_entries
from sglpatch.serving import profile
from sglpatch.sources import pristine_tree


@pytest.mark.parametrize("entry", ["/etc/passwd", "../outside.patch", "sub/../../x.patch", "renditions/0001-x/0.5.19.patch"])
def test_a_series_entry_outside_patches_is_refused_with_its_line(tmp_path, entry):
    (tmp_path / "series").write_text(f"# series\n0001-ok.patch\n{entry}\n")
    with pytest.raises(SglpatchError, match=rf"{tmp_path / 'series'}:3: .* must name a patch file inside"):
        series_entries(tmp_path)


@pytest.mark.parametrize(
    "text, message",
    [
        ("[1, 2]", "not a format-1 sglpatch lock file"),
        ('"a string"', "not a format-1 sglpatch lock file"),
        ('{"format": 1, "pins": []}', "not a format-1 sglpatch lock file"),
        ('{"format": 1, "pins": {"0.5.14": "x"}}', "the entry for 0.5.14 is not an object"),
        ('{"format": 1, "pins": {"0.1.0": {"patches": "x"}}}', "the entry for 0.1.0 has patches that are not a list"),
        ('{"format": 1, "pins": {"0.1.0": {"patches": [{"status": "applied"}]}}}', "not a list of objects with a name"),
        ("{not json", "not valid JSON"),
    ],
)
def test_a_lock_that_is_not_a_lock_is_refused_and_left_alone(tmp_path, text, message):
    path = tmp_path / "series.lock"
    path.write_text(text)
    with pytest.raises(SglpatchError, match=message) as error:
        lock.check_entry(path, "0.1.0", {"pristine": "x"}, update=True)
    assert str(path) in str(error.value) and "\n" not in str(error.value)
    assert path.read_text() == text


def test_an_artifact_without_core_metadata_is_refused_naming_it(tmp_path):
    wheel = tmp_path / "sglang-0.9.0-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        archive.writestr("sglang/__init__.py", "")
    with pytest.raises(SglpatchError, match=rf"{wheel}: the wheel holds no .dist-info/METADATA"):
        pristine_tree.artifact_metadata(wheel)
    sdist = tmp_path / "sglang-0.9.0.tar.gz"
    with tarfile.open(sdist, "w:gz") as archive:
        info = tarfile.TarInfo("sglang-0.9.0/setup.py")
        archive.addfile(info, io.BytesIO(b""))
    with pytest.raises(SglpatchError, match=rf"{sdist}: the sdist holds no top-level PKG-INFO"):
        pristine_tree.artifact_metadata(sdist)
    broken = tmp_path / "sglang-0.9.1.tar.gz"
    broken.write_bytes(b"not a tar")
    with pytest.raises(SglpatchError, match="cannot read its metadata"):
        pristine_tree.artifact_metadata(broken)


GOOD_PROFILE = """
name = "p"
version = 1
model = "/m"
architecture = "GlmMoeDsaForCausalLM"
[server]
tp-size = 8
"""


@pytest.mark.parametrize(
    "text, message",
    [
        (GOOD_PROFILE.replace("version = 1", 'version = "one"'), "version must be a whole number"),
        (GOOD_PROFILE.replace("version = 1", "version = 0"), "version must be a whole number"),
        (GOOD_PROFILE.replace("version = 1", "version = true"), "version must be a whole number"),
        (GOOD_PROFILE.replace('name = "p"', 'name = "q"'), "name 'q' must be the file's name"),
        (GOOD_PROFILE.replace('name = "p"', "name = 3"), "name 3 must be the file's name"),
        (GOOD_PROFILE.replace('model = "/m"', "model = 5"), "model must be a string"),
        (GOOD_PROFILE + "[env]\n", None),
        (GOOD_PROFILE.replace("tp-size = 8", "tp-size = [8]"), "server flag tp-size must be"),
        ("name = ", "not valid TOML"),
    ],
)
def test_a_malformed_profile_is_refused_naming_its_file(tmp_path, monkeypatch, text, message):
    monkeypatch.setattr(profile, "PROFILES_DIR", tmp_path)
    (tmp_path / "p.toml").write_text(text)
    if message is None:
        assert profile.load_profile("p").server_args() == ["--model-path", "/m", "--tp-size", "8"]
        return
    with pytest.raises(SglpatchError, match=message) as error:
        profile.load_profile("p")
    assert str(tmp_path / "p.toml") in str(error.value)


@pytest.mark.parametrize("name", ["../glm-5.2-mxfp4-mi355x", "/etc/x", "", "a b"])
def test_a_profile_name_that_is_not_a_name_is_refused(name):
    with pytest.raises(SglpatchError, match="is not a profile name"):
        profile.load_profile(name)


def test_the_profile_command_refuses_a_bad_name_in_one_line():
    run = subprocess.run([sys.executable, "-m", "sglpatch", "profile", "../x"], capture_output=True, text=True)
    assert run.returncode == 2 and run.stderr.count("\n") == 1 and "Traceback" not in run.stderr


def test_nox_lists_its_sessions_and_names_the_file_when_pins_toml_is_bad(tmp_path):
    if shutil.which("nox") is None:
        pytest.skip("nox is not on PATH")
    root = tmp_path / "project"
    shutil.copytree(REPO_ROOT, root, ignore=shutil.ignore_patterns(".git", ".nox", "build", "__pycache__"))
    pins = root / "upstream" / "pins.toml"
    pins.write_text("[pin]\nversion = 1\n")
    run = subprocess.run(["nox", "-l"], cwd=root, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "apply" in run.stdout and "tests" in run.stdout
    assert f"{pins}" in run.stderr and "Traceback" not in run.stdout + run.stderr
