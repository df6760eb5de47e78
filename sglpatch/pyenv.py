"""The CPU Python the witnesses' probes run in: a pinned base plus each pin's own requirements.

sglang's Python code (ServerArgs, the Quark config, the layers and their weight loaders) is
imported and run on CPU here, so the answers come from the pin's real code. Two layers, both in
the cache:

- the **base**: a venv with torch 2.13.0 (CPU build) and the exact set of packages in
  ``witnesses/requirements-cpu.txt``, installed with ``--no-deps`` so the file *is* the
  environment; it is keyed by the file's hash.
- the **overlay** for a pin: a venv whose ``site-packages`` sees the base's through a ``.pth`` file
  and holds the versions the pin's own metadata pins for ``OVERLAY_PACKAGES`` (transformers,
  xgrammar, apache-tvm-ffi) where the base's do not satisfy them. Pins that agree share one overlay.

Building either is done once, under a lock, in a staging folder renamed into place; a failure
raises ``EnvUnavailable`` naming the pip command and its last output lines, and leaves nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import venv
from dataclasses import dataclass, field
from importlib import metadata as importlib_metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from sglpatch import cache, sources
from sglpatch.errors import SglpatchError
from sglpatch.pins import Pin

PACKAGE = Path(__file__).parent
REQUIREMENTS = PACKAGE / "witnesses" / "requirements-cpu.txt"
PROBES = PACKAGE / "witnesses" / "probes"
# Packages whose version changes what sglang's code does on the paths the witnesses take: the
# model config classes (transformers), the grammar backend sglang imports at server-args time
# (xgrammar), and the JIT loader (apache-tvm-ffi). Everything else comes from the base.
OVERLAY_PACKAGES = ("transformers", "xgrammar", "apache-tvm-ffi")
BASE_LAYOUT = "sglpatch-pyenv-1"  # bump when the way the base is built changes
PIP_TIMEOUT_S = 1800


class EnvUnavailable(SglpatchError):
    """The CPU environment cannot be built here; the reason says which step failed."""


@dataclass(frozen=True)
class CpuPython:
    """One pin's interpreter: ``run`` starts it with the tree's package and the probes importable."""

    python: Path
    overlay: dict[str, str] = field(default_factory=dict)

    def run(
        self,
        args: list[str],
        *,
        tree: Path,
        env: dict[str, str] | None = None,
        timeout: float = 600,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run ``python args`` with ``<tree>/python`` and the probes folder first on the path."""
        child_env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTHON", "VIRTUAL_ENV"))}
        child_env.update(
            PYTHONPATH=os.pathsep.join([str(tree / "python"), str(PROBES)]),
            PYTHONDONTWRITEBYTECODE="1",  # the tree is a checkout; leave no __pycache__ in it
            HF_HUB_OFFLINE="1",  # nothing is fetched from a hub: the probes build their own configs
            TRANSFORMERS_OFFLINE="1",
            TOKENIZERS_PARALLELISM="false",
            PYTHONWARNINGS="ignore",
        )
        child_env.update(env or {})
        return subprocess.run(
            [str(self.python), *args],
            env=child_env,
            cwd=cwd,
            capture_output=True,
            text=True,
            timeout=timeout,
        )


def cpu_python(pin: Pin, index: str | None = None) -> CpuPython:
    """The pin's CPU interpreter, building the base and the pin's overlay on first use."""
    base = _base_env()
    wanted = overlay_requirements(pin, index, _installed_versions(base))
    if not wanted:
        return CpuPython(_python(base))
    return CpuPython(_python(_overlay_env(base, wanted)), overlay=wanted)


def pin_requirements(pin: Pin, index: str | None = None) -> list[Requirement]:
    """The pin's own runtime requirements, from its artifact's core metadata (wheel or sdist)."""
    artifact = sources.fetch_artifact(pin, index)
    requirements = []
    for line in sources.artifact_metadata(artifact).splitlines():
        if line.startswith("Requires-Dist:"):
            requirement = Requirement(line.partition(":")[2].strip())
            if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
                requirements.append(requirement)
    return requirements


def overlay_requirements(pin: Pin, index: str | None, base_versions: dict[str, str]) -> dict[str, str]:
    """name -> specifier the pin needs and the base does not satisfy, for ``OVERLAY_PACKAGES``."""
    wanted = {}
    for requirement in pin_requirements(pin, index):
        name = _canonical(requirement.name)
        if name not in OVERLAY_PACKAGES or not str(requirement.specifier):
            continue
        have = base_versions.get(name)
        if have is None or not requirement.specifier.contains(Version(have), prereleases=True):
            wanted[name] = str(requirement.specifier)
    return dict(sorted(wanted.items()))


# -- building -----------------------------------------------------------------------------------


def _base_env() -> Path:
    digest = hashlib.sha256(REQUIREMENTS.read_bytes() + BASE_LAYOUT.encode()).hexdigest()[:16]
    path = cache.cache_root() / "pyenv" / f"base-{digest}"

    def build(staging: Path) -> None:
        _make_venv(staging)
        _pip(staging, ["install", "--no-deps", "-r", str(REQUIREMENTS)], "base")

    return _cached_env(path, build)


def _overlay_env(base: Path, wanted: dict[str, str]) -> Path:
    key = json.dumps({"base": base.name, "wanted": wanted}, sort_keys=True)
    path = cache.cache_root() / "pyenv" / f"overlay-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def build(staging: Path) -> None:
        _make_venv(staging)
        # The base's packages are importable (and seen by pip as installed) through this .pth;
        # the overlay's own site-packages comes first, so its versions win.
        (_site_packages(staging) / "zz_sglpatch_base.pth").write_text(f"{_site_packages(base)}\n")
        # torch stays the base's: a requirement that asked pip for another torch would pull a
        # multi-GB CUDA build.
        constraints = staging / "constraints.txt"
        constraints.write_text(f"torch=={_installed_versions(base)['torch'].split('+')[0]}\n")
        specs = [f"{name}{spec}" for name, spec in wanted.items()]
        _pip(staging, ["install", "-c", str(constraints), *specs], f"overlay {' '.join(specs)}")

    return _cached_env(path, build)


def _cached_env(path: Path, build) -> Path:
    marker = path / "sglpatch-complete.json"
    with cache.entry_lock(path):
        if marker.exists() and _python(path).exists():
            return path
        staging = path.with_name(path.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        try:
            build(staging)
            # A venv's scripts name their own folder; build in place of the final path instead
            # of renaming would leave a half-built env visible, so venvs are made relocatable
            # by always calling their python by path (``_python``), never their scripts.
            marker_tmp = staging / "sglpatch-complete.json"
            marker_tmp.write_text(json.dumps({"packages": _installed_versions(staging)}, sort_keys=True, indent=1))
            staging.rename(path)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return path


def _make_venv(path: Path) -> None:
    # Without pip inside: the builder's pip installs into it with --python, which is faster and
    # needs no network for pip itself.
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)


def _pip(env: Path, args: list[str], what: str) -> None:
    command = [sys.executable, "-m", "pip", "--python", str(_python(env)), *args, "--disable-pip-version-check", "-q"]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=PIP_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise EnvUnavailable(f"CPU witness environment ({what}): {exc}") from None
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).strip().splitlines()[-8:])
        raise EnvUnavailable(f"CPU witness environment ({what}): pip failed:\n{tail}")


def _python(env: Path) -> Path:
    return env / "bin" / "python"


def _site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def _installed_versions(env: Path) -> dict[str, str]:
    found = {}
    for dist in importlib_metadata.distributions(path=[str(_site_packages(env))]):
        found[_canonical(dist.metadata["Name"])] = dist.version
    return found


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")
