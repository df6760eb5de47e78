"""sglang's files as the package index lists them: name, URL, sha256 and upload time, read from
every index pip is configured with (``sglpatch.sources.package_index``) -- for the download of a pin's
artifact, ``watch`` and the pin a rebase adds.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

from packaging.utils import InvalidSdistFilename, InvalidWheelFilename, parse_sdist_filename, parse_wheel_filename
from packaging.version import Version

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources import package_index
from sglpatch.sources.package_index import IndexConfig


def index_entries(index: IndexConfig | str | None = None) -> dict[str, dict]:
    """sglang's files on the index: file name -> {"url", "sha256" (when the index says), "released"}.

    Every configured index is read; where two list the same file, the first one's entry wins."""
    config = package_index.resolve(index)
    entries: dict[str, dict] = {}
    errors = []
    for url in config.urls + config.find_links:
        try:
            for name, entry in _index_entries_at(config, url).items():
                entries.setdefault(name, entry)
        except SglpatchError as exc:
            errors.append(str(exc))
    if not entries and errors:
        raise SglpatchError("; ".join(errors))
    return entries


def released_versions(index: IndexConfig | str | None = None) -> list[Version]:
    """Every final or post release of sglang that the index has a file for, oldest first
    (pre-releases and development releases are not pinned): what the release watch looks for and
    a rebase looks up before it starts.

    Only the files' names are read, so it is cheaper than ``index_entries``: a folder of files is
    listed without hashing them, and a JSON project page (PEP 691) is JSON, its ``files`` each with
    a ``filename``; pypi-simple reads an HTML page. So ``nox -s rebase`` can ask it in nox's own
    Python, which has none of sglpatch's dependencies, before it installs anything."""
    config = package_index.resolve(index)
    names: set[str] = set()
    errors = []
    for url in config.urls + config.find_links:
        try:
            names.update(_file_names_at(config, url))
        except SglpatchError as exc:
            errors.append(str(exc))
    if not names and errors:
        raise SglpatchError("; ".join(errors))
    versions = set()
    for name in names:
        try:
            version = parse_wheel_filename(name)[1] if name.endswith(".whl") else parse_sdist_filename(name)[1]
        except (InvalidWheelFilename, InvalidSdistFilename):
            continue
        if not version.is_prerelease and not version.is_devrelease:
            versions.add(version)
    return sorted(versions)


def _file_names_at(config: IndexConfig, url: str) -> list[str]:
    folder = package_index.local_folder(url)
    if folder is not None and not (folder / "sglang" / "index.html").is_file():
        return [path.name for path in _artifacts_in(url, folder)]
    body, content_type, page_url = _project_page(config, url)
    if "json" not in content_type:
        return list(_project_entries(body, content_type, page_url))
    try:
        return [str(file["filename"]) for file in json.loads(body)["files"]]
    except (ValueError, KeyError, TypeError) as exc:
        raise SglpatchError(f"{page_url}: not a PEP 691 or PEP 503 project page: {type(exc).__name__}: {exc}") from None


def _artifacts_in(url: str, folder: Path) -> list[Path]:
    """sglang's files in a plain folder of them (pip's find-links)."""
    if not folder.is_dir():
        raise SglpatchError(f"{url}: no such folder")
    return [path for path in sorted(folder.iterdir()) if path.name.startswith("sglang-")]


def _index_entries_at(config: IndexConfig, url: str) -> dict[str, dict]:
    folder = package_index.local_folder(url)
    if folder is not None and not (folder / "sglang" / "index.html").is_file():
        return {path.name: {"url": path.as_uri(), "sha256": file_sha256(path), "released": ""}
                for path in _artifacts_in(url, folder)}
    return _project_entries(*_project_page(config, url))


def _project_page(config: IndexConfig, url: str) -> tuple[bytes, str, str]:
    """(body, content type, URL) of sglang's project page on the index at ``url``: a PEP 503 page
    on disk, or what the index sends, JSON (PEP 691) where it can."""
    folder = package_index.local_folder(url)
    if folder is not None:
        project = folder / "sglang" / "index.html"
        return project.read_bytes(), "text/html", project.as_uri()
    project_url = url.rstrip("/") + "/sglang/"
    accept = "application/vnd.pypi.simple.v1+json, text/html;q=0.1"
    try:
        with config.open(project_url, accept=accept, timeout=60) as response:
            body = response.read()
            content_type = response.headers.get("Content-Type", "")
    except (SglpatchError, OSError) as exc:
        raise SglpatchError(f"cannot read the package index at {project_url}: {exc}") from None
    return body, content_type, project_url


def _project_entries(body: bytes, content_type: str, page_url: str) -> dict[str, dict]:
    """sglang's files on one project page, as ``index_entries`` gives them: pypi-simple reads the
    JSON (PEP 691) and the HTML (PEP 503) page, its hashes and upload times. It is imported here,
    not at the top: with pydantic it is about 0.3 s, which every sglpatch command would pay at
    start, and only a listing of the index needs it."""
    from pypi_simple import ProjectPage

    try:
        if "json" in content_type:
            page = ProjectPage.from_json_data(json.loads(body), page_url)
        else:
            page = ProjectPage.from_html("sglang", body, page_url)
    except (ValueError, KeyError, TypeError) as exc:
        # pydantic's ValidationError (a ValueError) spans lines, one per field: its first says what.
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise SglpatchError(f"{page_url}: not a PEP 691 or PEP 503 project page: {first}") from None
    return {
        package.filename: {
            "url": package.url,
            "sha256": package.digests.get("sha256", ""),
            "released": package.upload_time.isoformat().replace("+00:00", "Z") if package.upload_time else "",
        }
        for package in page.packages
    }


def file_sha256(path: Path) -> str:
    """The sha256 of a file's content, as an index lists it and a pin records it."""
    with path.open("rb") as handle:
        return hashlib.file_digest(handle, "sha256").hexdigest()
