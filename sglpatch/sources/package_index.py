"""Where packages come from: the package index exactly as pip on this machine is configured.

Users behind a mirror or a proxy configure pip (``pip.conf``, ``PIP_INDEX_URL``,
``PIP_EXTRA_INDEX_URL``, ``PIP_FIND_LINKS``, ``PIP_CERT``, ``PIP_PROXY``); sglpatch reads that
configuration through ``pip config list`` and uses it for every download it makes itself. Where
pip names no index, pip's own built-in default is asked of pip, so this repository names no
registry host. ``SGLPATCH_INDEX_URL`` overrides everything with one index (a URL, a ``file://``
folder of artifacts, or a local path).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import json
import os
import re
import shlex
import ssl
import sys
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from sglpatch.plumbing.cache import Memo
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.plumbing.processes import pip_env, run_tool

INDEX_ENV = "SGLPATCH_INDEX_URL"
PIP_TIMEOUT_S = 60
# pip's option sections, most specific first: ``pip download`` is what we stand for.
_SECTIONS = (":env:", "download", "global")


@dataclass(frozen=True)
class IndexConfig:
    """The indexes to look in (in order), pip's find-links, and how to reach them."""

    urls: tuple[str, ...]
    find_links: tuple[str, ...] = ()
    cert: str | None = None
    proxy: str | None = None
    source: str = ""  # where this configuration came from, for messages

    @classmethod
    def of(cls, url: str) -> "IndexConfig":
        """One index, given explicitly (a URL, ``file://`` folder or local path)."""
        return cls(urls=(url,), source="given")

    def describe(self) -> str:
        places = ", ".join(self.urls + self.find_links)
        return f"{places} (from {self.source})"

    def open(self, url: str, *, accept: str | None = None, timeout: float = 120):
        """``urlopen`` with pip's certificate bundle and proxy; a failure names the URL."""
        headers = {"User-Agent": "sglpatch"}
        if accept:
            headers["Accept"] = accept
        request = urllib.request.Request(url, headers=headers)
        handlers: list = []
        if self.proxy:
            handlers.append(urllib.request.ProxyHandler({"http": self.proxy, "https": self.proxy}))
        if self.cert and url.startswith("https:"):
            handlers.append(urllib.request.HTTPSHandler(context=ssl.create_default_context(cafile=self.cert)))
        opener = urllib.request.build_opener(*handlers)
        try:
            return opener.open(request, timeout=timeout)
        except OSError as exc:
            raise SglpatchError(f"cannot download {url}: {exc}") from None


def resolve(index: "IndexConfig | str | None" = None) -> IndexConfig:
    """``index`` as an ``IndexConfig``: given, else ``SGLPATCH_INDEX_URL``, else pip's own."""
    if isinstance(index, IndexConfig):
        return index
    if index:
        return IndexConfig.of(index)
    return configured()


def configured() -> IndexConfig:
    """The index configuration in force here (cached per ``SGLPATCH_INDEX_URL`` and pip env)."""
    override = os.environ.get(INDEX_ENV)
    if override:
        return IndexConfig(urls=(override,), source=INDEX_ENV)
    pip_env = tuple(sorted((k, v) for k, v in os.environ.items() if k.startswith("PIP_")))
    return _from_pip(pip_env)


@functools.lru_cache(maxsize=8)
def _from_pip(pip_env: tuple[tuple[str, str], ...]) -> IndexConfig:
    settings = pip_settings()
    index = settings.get("index-url")
    urls = [index] if index else [_pip_default_index()]
    urls += shlex.split(settings.get("extra-index-url", ""))
    links = tuple(shlex.split(settings.get("find-links", "")))
    source = "pip configuration" if index or len(urls) > 1 or links else "pip's default index"
    return IndexConfig(
        urls=tuple(dict.fromkeys(urls)),
        find_links=links,
        cert=settings.get("cert") or None,
        proxy=settings.get("proxy") or None,
        source=source,
    )


def pip_settings() -> dict[str, str]:
    """pip's effective option values (``pip config list``), the most specific section winning.

    pip takes a second to start, which every look at the index paid (``rebase``'s refusal of a
    release the index lacks among them), so the answer is remembered with what pip read: the
    variables it is given, this Python and its pip, and the content of every file pip looks in,
    present or not, as ``pip config debug`` names them. While none of those changes, pip is not
    asked again."""
    env = pip_env()
    key = hashlib.sha256(json.dumps(["pip-config-1", sys.executable, sys.prefix, _pip_version(), sorted(env.items())])
                         .encode()).hexdigest()
    kept = _PIP_CONFIG.get(key)
    if kept and all(_file_stamp(path) == stamp for path, stamp in kept["files"].items()):
        return kept["settings"]
    files = {path: _file_stamp(path) for path in _pip_config_files(env)}  # before pip reads them
    settings = _pip_config_list(env)
    if files:  # where pip named no file, nothing says when its answer would go stale
        _PIP_CONFIG.put(key, {"files": files, "settings": settings})
    return settings


_PIP_CONFIG = Memo("pip-config")
_CONFIG_FILE_LINE = re.compile(r"^  (\S.*), exists: (?:True|False)$", re.MULTILINE)


def _pip_version() -> str:
    try:
        return importlib.metadata.version("pip")
    except importlib.metadata.PackageNotFoundError:
        return ""


def _pip_config_files(env: dict[str, str]) -> list[str]:
    """Every file pip looks in for its configuration here, as ``pip config debug`` lists them."""
    done = run_tool([sys.executable, "-m", "pip", "config", "debug"], "pip config debug (pip's configuration files)",
                    PIP_TIMEOUT_S, env=env)
    return _CONFIG_FILE_LINE.findall(done.stdout) if done.returncode == 0 else []


def _file_stamp(path: str) -> str:
    try:
        return hashlib.sha256(Path(path).read_bytes()).hexdigest()
    except FileNotFoundError:
        return "absent"
    except OSError as exc:
        return f"unreadable: {exc.strerror}"


def _pip_config_list(env: dict[str, str]) -> dict[str, str]:
    done = run_tool([sys.executable, "-m", "pip", "config", "list"], "pip config list (pip's configuration)", PIP_TIMEOUT_S,
                    env=env)
    if done.returncode != 0:
        raise SglpatchError(f"`pip config list` failed: {done.stderr.strip()[-300:]}")
    found: dict[tuple[str, str], str] = {}
    for line in done.stdout.splitlines():
        key, sep, value = line.partition("=")
        section, dot, name = key.rpartition(".")
        if not sep or not dot:
            continue
        try:
            found[(section, name)] = shlex.split(value)[0] if value.strip() else ""
        except (ValueError, IndexError):
            found[(section, name)] = value.strip("'\"")
    settings: dict[str, str] = {}
    for section in reversed(_SECTIONS):
        for (where, name), value in found.items():
            if where == section:
                settings[name] = value
    return settings


def _pip_default_index() -> str:
    """The index pip uses when none is configured, asked of the installed pip itself."""
    code = "from pip._internal.models.index import PyPI; print(PyPI.simple_url)"
    done = run_tool([sys.executable, "-c", code], "reading pip's default index from pip", PIP_TIMEOUT_S, env=pip_env())
    url = done.stdout.strip()
    if done.returncode != 0 or "://" not in url:
        raise SglpatchError(
            f"no package index is configured (pip names none, and {INDEX_ENV} is unset) and pip's "
            f"default cannot be read: {done.stderr.strip()[-200:]}"
        )
    return url


def local_folder(url: str) -> Path | None:
    """The folder a ``file://`` URL or plain path names, or None for a remote index."""
    if url.startswith("file://"):
        return Path(urllib.parse.unquote(urllib.parse.urlparse(url).path))
    if "://" not in url:
        return Path(url)
    return None
