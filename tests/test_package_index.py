"""The package index is pip's own configuration here (or SGLPATCH_INDEX_URL), never ours."""

from __future__ import annotations

import contextlib
import hashlib
import http.server
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from conftest import REPO_ROOT, pip_default_index_host
from sglpatch.apply.apply_pins import apply_series
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources import index_listing
from sglpatch.sources import package_index as index

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
    for name in list(os.environ):
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


_URL_HOST = re.compile(r"[a-z][a-z0-9+.-]*://(?:[^@/\s]*@)?([a-z0-9.-]+)", re.IGNORECASE)


def _pip_hosts() -> set[str]:
    """The hosts pip here reaches: its configured indexes and find-links (``pip config list``,
    PIP_* variables included), and its own default index and file host, asked of pip itself."""
    settings = index.pip_settings()
    urls = [url for name in ("index-url", "extra-index-url", "find-links") for url in shlex.split(settings.get(name, ""))]
    code = "from pip._internal.models.index import PyPI; print(PyPI.simple_url); print('https://' + PyPI.file_storage_domain)"
    urls += subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    return {match.group(1).lower() for url in urls for match in _URL_HOST.finditer(url)}


def _apt_hosts() -> set[str]:
    """Every host apt's sources files name, where apt-config says they are (one-line and deb822,
    disabled entries and comments too: a mirror commented out is still a registry)."""
    places = {"list": "/etc/apt/sources.list", "parts": "/etc/apt/sources.list.d/"}
    if shutil.which("apt-config"):
        shown = subprocess.run(["apt-config", "shell", "list", "Dir::Etc::sourcelist/f", "parts", "Dir::Etc::sourceparts/d"],
                               capture_output=True, text=True).stdout
        places.update((name, value) for name, value in re.findall(r"^(list|parts)='([^']*)'", shown, re.MULTILINE) if value)
    parts = Path(places["parts"])
    files = [Path(places["list"]), *(sorted(parts.iterdir()) if parts.is_dir() else [])]
    hosts = set()
    for path in files:
        if path.is_file():
            hosts.update(match.group(1).lower() for match in _URL_HOST.finditer(path.read_text(errors="replace")))
    for name in ("SGLPATCH_DEBIAN_MIRROR", "DEBIAN_MIRROR"):
        hosts.update(match.group(1).lower() for match in _URL_HOST.finditer(os.environ.get(name, "")))
    return hosts


def _registry_names(hosts: set[str]) -> set[str]:
    """Each host and, where it is a name under a registry's own domain, that domain: a file
    naming the archive's security host is caught by its main mirror's domain."""
    names = set()
    for host in hosts:
        labels = host.strip(".").split(".")
        # Addresses and single labels (a local mirror at 127.0.0.1, "localhost") name no registry.
        if len(labels) < 2 or all(label.isdigit() for label in labels):
            continue
        names.add(".".join(labels))
        if len(labels) >= 3:
            names.add(".".join(labels[1:]))
    return names


def _naming(text: str, name: str) -> bool:
    return re.search(rf"(?<![\w-]){re.escape(name)}(?![\w-])", text, re.IGNORECASE) is not None


def test_the_repository_names_no_registry_host_that_pip_or_apt_here_use():
    names = _registry_names(_pip_hosts() | _apt_hosts())
    # pip's own default index is always among them, so the scan below always has something to find.
    default = pip_default_index_host()
    assert default in names, names
    assert all(_naming(f"see https://{name}/simple", name) and not _naming(f"x{name}", name) for name in names)
    tracked = subprocess.run(["git", "ls-files", "-z"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout
    found = []
    for name in filter(None, tracked.split("\0")):
        path = REPO_ROOT / name
        if not path.is_file() or path.is_symlink():
            continue
        text = path.read_text(errors="replace")
        found += [f"{name}: {host}" for host in sorted(names) if _naming(text, host)]
    assert found == []


@pytest.mark.network
def test_the_configured_index_lists_the_pinned_artifacts():
    from sglpatch.sources import index_listing
    from sglpatch.sources.pins import load_pins

    entries = index_listing.index_entries()
    for pin in load_pins(REPO_ROOT / "upstream" / "pins.toml").pins:
        assert pin.artifact in entries, pin.artifact


@contextlib.contextmanager
def _index_serving(kind: str, body: str, asked: list):
    """An index server on a free local port answering every request with ``body``; yields its URL."""

    class Index(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            asked.append((self.path, self.headers.get("Accept", "")))
            self.send_response(200)
            self.send_header("Content-Type", kind)
            self.end_headers()
            self.wfile.write(body.encode())

        def log_message(self, *args):
            pass

    server = http.server.HTTPServer(("127.0.0.1", 0), Index)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/simple"
    finally:
        server.shutdown()


@pytest.mark.parametrize("page", ["json", "html"])
def test_an_index_served_over_http_is_read_as_pep_691_json_or_pep_503_html(tmp_path, page):
    """The project page as an index server sends it, JSON when asked for it or HTML: file names,
    absolute URLs, the sha256 and (JSON only) the upload time."""
    digest = "ab" * 32
    bodies = {
        "json": ("application/vnd.pypi.simple.v1+json", json.dumps({
            "meta": {"api-version": "1.1"}, "name": "sglang",
            "files": [{"filename": "sglang-0.5.24.tar.gz", "url": "../../files/sglang-0.5.24.tar.gz",
                       "hashes": {"sha256": digest}, "upload-time": "2026-11-30T10:20:30.123456Z"}],
        })),
        "html": ("text/html", f'<html><body><a href="../../files/sglang-0.5.24.tar.gz#sha256={digest}">sglang-0.5.24.tar.gz</a></body></html>'),
    }
    asked = []
    with _index_serving(*bodies[page], asked) as url:
        entries = index_listing.index_entries(url)
    port = url.split(":")[2].split("/")[0]
    assert asked[0][0] == "/simple/sglang/" and "application/vnd.pypi.simple.v1+json" in asked[0][1]
    entry = entries["sglang-0.5.24.tar.gz"]
    assert entry["url"] == f"http://127.0.0.1:{port}/files/sglang-0.5.24.tar.gz"
    assert entry["sha256"] == digest
    assert entry["released"] == ("2026-11-30T10:20:30.123456Z" if page == "json" else "")


@pytest.mark.parametrize("body", ["{not json", '{"files": 3}', '{"name": "sglang", "files": [{"url": "x"}]}'])
def test_a_broken_json_project_page_is_a_one_line_error_naming_the_page(body):
    with _index_serving("application/vnd.pypi.simple.v1+json", body, []) as url:
        with pytest.raises(SglpatchError) as refused:
            index_listing.index_entries(url)
    message = str(refused.value)
    assert "\n" not in message and message.startswith(f"{url}/sglang/: not a PEP 691 or PEP 503 project page: "), message


@pytest.mark.parametrize("page", ["json", "html"])
def test_the_releases_on_an_index_are_read_from_its_file_names(page):
    """What rebase looks up before it starts: the final and post releases the index has a file of,
    from a JSON page as JSON (nox's own Python has no pypi-simple) and from an HTML page by pypi-simple."""
    names = ["sglang-0.5.23-cp311-cp311-manylinux_2_34_x86_64.whl", "sglang-0.5.10.post1.tar.gz", "sglang-0.5.24rc1.tar.gz",
             "sglang-0.5.9.tar.gz", "not-a-distribution.txt"]
    bodies = {
        "json": ("application/vnd.pypi.simple.v1+json", json.dumps({
            "meta": {"api-version": "1.1"}, "name": "sglang",
            "files": [{"filename": name, "url": f"../../files/{name}", "hashes": {}} for name in names]})),
        "html": ("text/html", "<html><body>" + "".join(f'<a href="../../files/{n}">{n}</a>' for n in names) + "</body></html>"),
    }
    with _index_serving(*bodies[page], []) as url:
        assert [str(v) for v in index_listing.released_versions(url)] == ["0.5.9", "0.5.10.post1", "0.5.23"]


def test_pips_configuration_is_asked_of_pip_again_when_a_file_it_reads_changes(tmp_path, monkeypatch, cache_dir):
    """pip's answer is remembered with what it read: asked once, it is not asked again while its
    files and variables stay as they were, and asked again when one changes."""
    _only_pip_config(monkeypatch, tmp_path, "[global]\nindex-url = file:///first\n")
    asked = []
    real = index.run_tool
    monkeypatch.setattr(index, "run_tool", lambda command, *a, **k: asked.append(command[3:]) or real(command, *a, **k))
    assert index.pip_settings()["index-url"] == "file:///first" and ["config", "list"] in asked
    asked.clear()
    assert index.pip_settings()["index-url"] == "file:///first" and asked == []
    (tmp_path / "pip.conf").write_text("[global]\nindex-url = file:///second\n")
    assert index.pip_settings()["index-url"] == "file:///second" and ["config", "list"] in asked
    asked.clear()
    monkeypatch.setenv("PIP_INDEX_URL", "file:///from/the/environment")
    assert index.pip_settings()["index-url"] == "file:///from/the/environment" and ["config", "list"] in asked
