"""sglpatch works from anywhere: the project around the current folder, else the clone sglpatch
was installed from (an editable install, or pip's record of the folder it installed from);
``--root`` wins over both."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import REAL_PINS


def _sglpatch(*args, cwd):
    return subprocess.run([sys.executable, "-m", "sglpatch", "-q", *args], capture_output=True, text=True, cwd=cwd)


def test_sglpatch_run_from_another_folder_finds_the_series_of_the_clone_it_was_installed_from(tmp_path):
    # The test environment installs this clone (pip install -e .): from a folder outside any
    # project, sglpatch takes this clone's series.
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _sglpatch("pins", cwd=elsewhere)
    assert done.returncode == 0, done.stderr
    header, *rows = done.stdout.splitlines()
    assert header.split()[0] == "version"
    assert [line.split()[0] for line in rows] == [pin.version for pin in REAL_PINS.pins]


def test_root_and_the_project_around_the_current_folder_still_win_over_the_installed_clone(fake_project, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for args, cwd in ((["--root", str(fake_project.root)], elsewhere), ([], fake_project.root / "patches")):
        done = _sglpatch(*args, "pins", cwd=cwd)
        assert done.returncode == 0, done.stderr
        assert [line.split()[0] for line in done.stdout.splitlines()[1:]] == ["0.1.0", "0.2.0"]


def test_an_install_from_a_clone_knows_the_clone_by_its_recorded_source(fake_project, tmp_path):
    # pip records where a package was installed from (PEP 610's direct_url.json), for a plain
    # install from a clone as for an editable one: that clone's series is the one to use.
    from importlib.metadata import PathDistribution

    from sglpatch.plumbing.project import installed_clone

    info = tmp_path / "site" / "sglpatch-0.1.0.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: sglpatch\nVersion: 0.1.0\n")
    (info / "direct_url.json").write_text(json.dumps({"url": fake_project.root.as_uri(), "dir_info": {}}))
    assert installed_clone(PathDistribution(info), package_dir=tmp_path / "site" / "sglpatch") == fake_project.root
    (info / "direct_url.json").write_text(json.dumps({"url": "https://example.invalid/sglpatch.tar.gz", "archive_info": {}}))
    assert installed_clone(PathDistribution(info), package_dir=tmp_path / "site" / "sglpatch") is None
