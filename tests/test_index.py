"""The package index is pip's own configuration here (or SGLPATCH_INDEX_URL), never ours."""

from __future__ import annotations

import hashlib
import re
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from sglpatch import index
from sglpatch.project import apply_series

REGISTRY_HOSTS = ("pypi.org", "pythonhosted.org", "deb.debian.org", "security.debian.org", "ftp.debian.org",
                  "snapshot.debian.org", "registry.npmjs.org", "download.pytorch.org", "repo.radeon.com")


def _simple_index(folder, artifacts):
    """A PEP 503 index on disk, as a mirror (devpi, a file:// mirror) serves it."""
    project = folder / "sglang"
    project.mkdir(parents=True)
    links = "".join(
        f'<a href="{artifact.as_uri()}#sha256={hashlib.sha256(artifact.read_bytes()).hexdigest()}">{artifact.name}</a>\n'
        for artifact in artifacts
    )
    (project / "index.html").write_text(f"<html><body>\n{links}</body></html>\n")
    return folder


def _only_pip_config(monkeypatch, tmp_path, text):
    """pip configured through its own config file alone: no PIP_* variable, no SGLPATCH_INDEX_URL."""
    for name in list(__import__("os").environ):
        if name.startswith("PIP_"):
            monkeypatch.delenv(name)
    monkeypatch.delenv("SGLPATCH_INDEX_URL", raising=False)
    config = tmp_path / "pip.conf"
    config.write_text(text)
    monkeypatch.setenv("PIP_CONFIG_FILE", str(config))
    index._from_pip.cache_clear()


def test_apply_takes_its_artifacts_from_the_index_pip_is_configured_with(fake_project, tmp_path, monkeypatch):
    mirror = _simple_index(tmp_path / "mirror" / "simple", sorted(fake_project.index.glob("sglang-*")))
    moved = tmp_path / "moved-away"
    fake_project.index.rename(moved)  # only the mirror's links can reach the artifacts now
    mirror_links = (mirror / "sglang" / "index.html").read_text().replace(fake_project.index.as_uri(), moved.as_uri())
    (mirror / "sglang" / "index.html").write_text(mirror_links)
    _only_pip_config(monkeypatch, tmp_path, f"[global]\nindex-url = {mirror.as_uri()}\n")
    assert index.configured().urls[0] == mirror.as_uri() and index.configured().source == "pip configuration"
    report = apply_series(fake_project.project, run_witnesses=False)
    assert report.ok, report.to_json()


def test_pip_environment_variables_win_over_its_files(tmp_path, monkeypatch):
    _only_pip_config(monkeypatch, tmp_path, "[global]\nindex-url = file:///from/the/file\n[download]\nextra-index-url = file:///extra\n")
    monkeypatch.setenv("PIP_INDEX_URL", "file:///from/the/environment")
    config = index.configured()
    assert config.urls == ("file:///from/the/environment", "file:///extra")


def test_sglpatch_index_url_overrides_pip(tmp_path, monkeypatch):
    _only_pip_config(monkeypatch, tmp_path, "[global]\nindex-url = file:///from/pip\n")
    monkeypatch.setenv("SGLPATCH_INDEX_URL", "file:///ours")
    assert index.configured().urls == ("file:///ours",) and index.configured().source == "SGLPATCH_INDEX_URL"


def test_without_any_configuration_the_index_is_pips_own_default(tmp_path, monkeypatch):
    _only_pip_config(monkeypatch, tmp_path, "")
    monkeypatch.setenv("PIP_CONFIG_FILE", "/dev/null")  # pip reads no file at all
    index._from_pip.cache_clear()
    config = index.configured()
    asked = subprocess.run([sys.executable, "-c", "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"],
                           capture_output=True, text=True, check=True).stdout.strip()
    assert config.urls == (asked,) and config.source == "pip's default index"


def test_the_repository_names_no_registry_host():
    tracked = subprocess.run(["git", "ls-files"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout.split()
    found = []
    for name in tracked:
        path = REPO_ROOT / name
        if name == "tests/test_index.py" or not path.is_file():
            continue
        text = path.read_text(errors="replace")
        found += [f"{name}: {host}" for host in REGISTRY_HOSTS if re.search(rf"(?<![\w.-]){re.escape(host)}", text)]
    assert found == []


@pytest.mark.network
def test_the_configured_index_lists_the_pinned_artifacts():
    from sglpatch import sources
    from sglpatch.pins import load_pins

    entries = sources.index_entries()
    for pin in load_pins(REPO_ROOT / "upstream" / "pins.toml").pins:
        assert pin.artifact in entries, pin.artifact
