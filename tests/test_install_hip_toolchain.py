"""ci/install-hip-toolchain.sh: the Debian mirror comes from apt's own configuration (or our
override variables), and a failed or hung download names its URL.

apt reads its sources from the folders ``Dir::Etc`` names; the tests point ``APT_CONFIG`` at a
configuration made here, so the script reads sources files written by the test, exactly as apt
itself would.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest

from conftest import REPO_ROOT

SCRIPT = REPO_ROOT / "ci" / "install-hip-toolchain.sh"
MIRROR = "http://mirror.example.test/debian"

pytestmark = pytest.mark.skipif(shutil.which("apt-config") is None, reason="apt-config (apt) is not installed")


def apt_etc(tmp_path: Path, sources_list: str | None = None, parts: dict[str, str] | None = None) -> dict[str, str]:
    """An environment whose apt configuration reads sources only from files made in ``tmp_path``."""
    etc = tmp_path / "etc-apt"
    (etc / "sources.list.d").mkdir(parents=True)
    (etc / "apt.conf.d").mkdir()
    if sources_list is not None:
        (etc / "sources.list").write_text(sources_list)
    for name, text in (parts or {}).items():
        (etc / "sources.list.d" / name).write_text(text)
    conf = tmp_path / "apt.conf"
    conf.write_text(f'Dir::Etc "{etc}/";\n')
    env = {k: v for k, v in os.environ.items() if k not in ("SGLPATCH_DEBIAN_MIRROR", "DEBIAN_MIRROR")}
    return {**env, "APT_CONFIG": str(conf)}


def print_mirror(env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", str(SCRIPT), "--print-mirror"], env=env, capture_output=True, text=True, timeout=60)


DEB822 = f"""\
Types: deb
URIs: http://security.example.test/debian-security
Suites: bookworm-security
Components: main

# the archive itself
Types: deb deb-src
URIs: {MIRROR}/
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg
"""


def test_mirror_is_the_debian_archive_of_a_deb822_sources_file(tmp_path):
    run = print_mirror(apt_etc(tmp_path, parts={"debian.sources": DEB822}))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == MIRROR


def test_mirror_from_one_line_sources_list_with_options(tmp_path):
    sources = (
        "# deb http://old.example.test/debian bookworm main\n"
        "deb-src http://src.example.test/debian bookworm main\n"
        "deb http://security.example.test/debian-security bookworm-security main\n"
        f"deb [arch=amd64 signed-by=/usr/share/keyrings/debian.gpg] {MIRROR} bookworm main contrib\n"
    )
    run = print_mirror(apt_etc(tmp_path, sources_list=sources))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == MIRROR


def test_disabled_and_foreign_sources_are_not_taken_for_the_debian_archive(tmp_path):
    parts = {
        "a-disabled.sources": "Enabled: no\nTypes: deb\nURIs: http://off.example.test/debian\nSuites: bookworm\n",
        "b-vendor.list": "deb https://vendor.example.test/apt cloud-sdk main\n",
        "c-debian.list": f"deb {MIRROR} trixie main\n",
        "d-not-a-source.list.disabled": "deb http://never.example.test/debian bookworm main\n",
    }
    run = print_mirror(apt_etc(tmp_path, parts=parts))
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == MIRROR


def test_override_variables_win_over_apt(tmp_path):
    env = apt_etc(tmp_path, parts={"debian.sources": DEB822})
    assert print_mirror({**env, "DEBIAN_MIRROR": "http://legacy.example.test/debian"}).stdout.strip() == "http://legacy.example.test/debian"
    both = {**env, "DEBIAN_MIRROR": "http://legacy.example.test/debian", "SGLPATCH_DEBIAN_MIRROR": "file:///srv/debian/"}
    assert print_mirror(both).stdout.strip() == "file:///srv/debian"


def test_no_debian_archive_in_apt_sources_is_a_clear_error(tmp_path):
    run = print_mirror(apt_etc(tmp_path, parts={"vendor.list": "deb https://vendor.example.test/apt stable-ish main\n"}))
    assert run.returncode != 0
    assert "no Debian archive in apt's sources" in run.stderr and "SGLPATCH_DEBIAN_MIRROR" in run.stderr


def _install(tmp_path: Path, mirror: str, timeout: str = "600") -> subprocess.CompletedProcess:
    env = {**apt_etc(tmp_path), "SGLPATCH_DEBIAN_MIRROR": mirror, "SGLPATCH_HIP_TOOLCHAIN": str(tmp_path / "tc"),
           "HIP_TOOLCHAIN_TIMEOUT": timeout}
    return subprocess.run(["bash", str(SCRIPT)], env=env, capture_output=True, text=True, timeout=120)


def test_a_failed_download_names_its_url_and_leaves_no_install(tmp_path):
    run = _install(tmp_path, f"file://{tmp_path}/no-mirror-here")
    assert run.returncode != 0
    assert f"download failed or took over 600s: file://{tmp_path}/no-mirror-here/pool/main/l/llvm-toolchain-22/clang-22_" in run.stderr
    assert not (tmp_path / "tc" / "clang-22").exists()


def test_a_hung_download_is_given_up_and_names_its_url(tmp_path):
    # A server that accepts the connection and never answers.
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(4)
    held = []
    stop = threading.Event()

    def accept():
        server.settimeout(0.2)
        while not stop.is_set():
            try:
                held.append(server.accept()[0])
            except OSError:
                continue

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    try:
        started = time.monotonic()
        mirror = f"http://127.0.0.1:{server.getsockname()[1]}/debian"
        run = _install(tmp_path, mirror, timeout="2")
        assert run.returncode != 0
        assert f"took over 2s: {mirror}/pool/main/l/llvm-toolchain-22/clang-22_" in run.stderr
        assert time.monotonic() - started < 60
    finally:
        stop.set()
        thread.join()
        for conn in held:
            conn.close()
        server.close()
