"""Building the CPU Python the witnesses' probes run in: a pinned base plus each pin's own
requirements.

sglang's Python code (ServerArgs, the Quark config, the layers and their weight loaders) is
imported and run on CPU (``sglpatch.witnesses.probe_runs``), so the answers come from the pin's real code.
Two layers, both in the cache:

- the **base**: a venv with torch 2.13.0 (CPU build) and the exact set of packages in
  ``witnesses/requirements-cpu.txt``, installed with ``--no-deps`` so the file *is* the
  environment; it is keyed by the file's hash.
- the **overlay** for a pin: a venv whose ``site-packages`` sees the base's through a ``.pth`` file
  and holds the versions the pin's own metadata pins for ``OVERLAY_PACKAGES`` (transformers,
  xgrammar, apache-tvm-ffi) where the base's do not satisfy them. Pins that agree share one overlay.

Building either is done once, under a lock, in a staging folder renamed into place; a failure
raises ``EnvUnavailable`` naming the pip command and its last output lines, and leaves nothing.
``env_fingerprint`` is what a cached witness answer must be keyed by: the environment a probe ran
in. ``probe_runs.cpu_python`` hands out a pin's interpreter, building what it lacks.
"""

from __future__ import annotations

import functools
import hashlib
import json
import platform
import re
import shutil
import sys
import venv
from importlib import metadata as importlib_metadata
from pathlib import Path

from packaging.requirements import Requirement
from packaging.version import Version

from sglpatch.plumbing import cache, processes, progress
from sglpatch.plumbing.errors import SglpatchError, Unavailable
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import Pin

REQUIREMENTS = Path(__file__).parent / "requirements-cpu.txt"
# Packages whose version changes what sglang's code does on the paths the witnesses take: the
# model config classes (transformers), the grammar backend sglang imports at server-args time
# (xgrammar), and the JIT loader (apache-tvm-ffi). Everything else comes from the base.
OVERLAY_PACKAGES = ("transformers", "xgrammar", "apache-tvm-ffi")
BASE_LAYOUT = "sglpatch-pyenv-1"  # bump when the way the base is built changes
PIP_TIMEOUT_S = 1800


class EnvUnavailable(Unavailable):
    """The CPU environment cannot be built here; the reason says which step failed."""


def pin_requirements(pin: Pin, index: str | None = None, only: tuple[str, ...] | None = None) -> list[Requirement]:
    """The pin's own runtime requirements, from its artifact's core metadata (wheel or sdist);
    with ``only``, just those of the packages it names (parsing all of a release's hundred-odd
    requirements for three is most of what a warm run spends on them)."""
    requirements = []
    for line in pristine_tree.pin_metadata(pin, index).splitlines():
        if not line.startswith("Requires-Dist:"):
            continue
        text = line.partition(":")[2].strip()
        if only is not None and _canonical(re.split(r"[\s;<>=!~(\[]", text, maxsplit=1)[0]) not in only:
            continue
        requirement = Requirement(text)
        if requirement.marker is None or requirement.marker.evaluate({"extra": ""}):
            requirements.append(requirement)
    return requirements


def overlay_requirements(pin: Pin, index: str | None, base_versions: dict[str, str]) -> dict[str, str]:
    """name -> specifier the pin needs and the base does not satisfy, for ``OVERLAY_PACKAGES``."""
    return _unsatisfied(pin_requirements(pin, index, only=OVERLAY_PACKAGES), base_versions)


def _unsatisfied(requirements, base_versions: dict[str, str]) -> dict[str, str]:
    """name -> specifier of each overlay package whose requirement the base's version does not
    satisfy (the overlay an environment is built with, and named by)."""
    wanted = {}
    for requirement in requirements:
        name = _canonical(requirement.name)
        if name not in OVERLAY_PACKAGES or not str(requirement.specifier):
            continue
        have = base_versions.get(name)
        if have is None or not requirement.specifier.contains(Version(have), prereleases=True):
            wanted[name] = str(requirement.specifier)
    return dict(sorted(wanted.items()))


# -- building -----------------------------------------------------------------------------------


def _base_digest() -> str:
    return hashlib.sha256(REQUIREMENTS.read_bytes() + BASE_LAYOUT.encode()).hexdigest()[:16]


def _base_path() -> Path:
    return cache.cache_root() / "pyenv" / f"base-{_base_digest()}"


def base_env() -> Path:
    path = _base_path()

    def build(staging: Path) -> None:
        _make_venv(staging)
        _pip(staging, ["install", "--no-deps", "-r", str(REQUIREMENTS)], "base")

    return _cached_env(path, build)


def _overlay_path(base: Path, wanted: dict[str, str]) -> Path:
    key = json.dumps({"base": base.name, "wanted": wanted}, sort_keys=True)
    return cache.cache_root() / "pyenv" / f"overlay-{hashlib.sha256(key.encode()).hexdigest()[:16]}"


def overlay_env(base: Path, wanted: dict[str, str]) -> Path:
    path = _overlay_path(base, wanted)

    def build(staging: Path) -> None:
        _make_venv(staging)
        # The base's packages are importable (and seen by pip as installed) through this .pth;
        # the overlay's own site-packages comes first, so its versions win.
        sees_base(staging, base)
        # torch stays the base's: a requirement that asked pip for another torch would pull a
        # multi-GB CUDA build.
        constraints = staging / "constraints.txt"
        constraints.write_text(f"torch=={installed_versions(base)['torch'].split('+')[0]}\n")
        specs = [f"{name}{spec}" for name, spec in wanted.items()]
        _pip(staging, ["install", "-c", str(constraints), *specs], f"overlay {' '.join(specs)}")

    return _cached_env(path, build)


# The release's own torch and torchvision, for running a pull request's test as a reviewer runs
# it (``python3 test/...py``): sglang's model configs import torchvision, and the index's
# torchvision wheels are CUDA builds that do not load beside the base's CPU torch ("operator
# torchvision::nms does not exist"). The release's CUDA build of torch runs on a machine with no GPU.
RELEASE_TORCH = ("torch", "torchvision")


def release_torch_specs(pin: Pin, index: str | None = None) -> list[str]:
    """The pin's own requirements for ``RELEASE_TORCH`` (``torch==2.14.1``, ``torchvision``)."""
    named = {_canonical(r.name): f"{_canonical(r.name)}{r.specifier}" for r in pin_requirements(pin, index, only=RELEASE_TORCH)}
    return [named.get(name, name) for name in RELEASE_TORCH]


def release_torch_env(base: Path, specs: list[str]) -> Path:
    """A venv holding ``specs`` and what they need beyond the base (the CUDA libraries, triton),
    shared by every pin that asks for the same; it sees the base through a ``.pth`` only while
    pip resolves, so that the base's packages count as installed."""
    key = json.dumps({"base": base.name, "specs": specs})
    path = cache.cache_root() / "pyenv" / f"torch-{hashlib.sha256(key.encode()).hexdigest()[:16]}"

    def build(staging: Path) -> None:
        _make_venv(staging)
        seen_base = sees_base(staging, base)
        _pip(staging, ["install", *specs], f"the release's {' '.join(specs)}", "a test run as shown")
        seen_base.unlink()

    return _cached_env(path, build)


def layered_env(kind: str, layers: list[Path], *key: str) -> Path:
    """A venv with nothing installed of its own that sees ``layers``' site-packages, in that
    order, through one ``.pth``: the first layer's versions win. Named ``kind-<hash>`` by the
    layers (and ``key``)."""
    digest = hashlib.sha256(json.dumps({"key": list(key), "layers": [layer.name for layer in layers]}).encode())
    path = cache.cache_root() / "pyenv" / f"{kind}-{digest.hexdigest()[:16]}"

    def build(staging: Path) -> None:
        _make_venv(staging)
        (site_packages(staging) / "zz_sglpatch_layers.pth").write_text(
            "".join(f"{site_packages(layer)}\n" for layer in layers))

    return _cached_env(path, build)


BASE_PTH = "zz_sglpatch_base.pth"  # how an environment built on the base sees it (``base_of``)


def sees_base(env: Path, base: Path) -> Path:
    """The ``.pth`` through which ``env`` imports the base's packages (and pip counts them as
    installed), written."""
    pth = site_packages(env) / BASE_PTH
    pth.write_text(f"{site_packages(base)}\n")
    return pth


_FAILED_BUILDS: dict[Path, EnvUnavailable] = {}  # in this process: each tree's probes ask again


def _cached_env(path: Path, build) -> Path:
    """``path`` built by ``build`` once, under its lock; a build that failed in this process is
    not tried again by it (its error is raised again), one that failed in another is."""
    if path in _FAILED_BUILDS:
        raise _FAILED_BUILDS[path]
    marker = path / "sglpatch-complete.json"
    with cache.entry_lock(path):
        if marker.exists() and venv_python(path).exists():
            return path
        staging = path.with_name(path.name + ".staging")
        shutil.rmtree(staging, ignore_errors=True)
        shutil.rmtree(path, ignore_errors=True)
        try:
            build(staging)
            # A venv's scripts name their own folder; build in place of the final path instead
            # of renaming would leave a half-built env visible, so venvs are made relocatable
            # by always calling their python by path (``venv_python``), never their scripts.
            marker_tmp = staging / "sglpatch-complete.json"
            marker_tmp.write_text(json.dumps({"packages": installed_versions(staging)}, sort_keys=True, indent=1))
            staging.rename(path)
        except BaseException as exc:
            shutil.rmtree(staging, ignore_errors=True)
            if isinstance(exc, EnvUnavailable):
                _FAILED_BUILDS[path] = exc
            raise
    return path


def _make_venv(path: Path) -> None:
    # Without pip inside: the builder's pip installs into it with --python, which is faster and
    # needs no network for pip itself.
    venv.EnvBuilder(with_pip=False, symlinks=True).create(path)


def _pip(env: Path, args: list[str], what: str, purpose: str = "the witnesses") -> None:
    # --no-compile: the probes compile what they import into their content-keyed bytecode cache
    # (probes/bytecode.py); pip's compile of every file was half of the base's install.
    command = [sys.executable, "-m", "pip", "--python", str(venv_python(env)), *args]
    command += ["--no-compile", "--disable-pip-version-check", "--progress-bar", "off"]
    with progress.step(f"CPU Python for {purpose}: {what}") as shown:
        try:
            done = processes.run_tool_lines(command, f"pip ({what})", PIP_TIMEOUT_S, _pip_progress(shown),
                                            env=processes.pip_env())
        except SglpatchError as exc:
            raise EnvUnavailable(f"CPU witness environment ({what}): {exc}") from None
        if done.returncode != 0:
            tail = "\n".join(done.stdout.strip().splitlines()[-8:])
            raise EnvUnavailable(f"CPU witness environment ({what}): pip failed:\n{tail}")


def _pip_progress(shown):
    """pip's own lines, cut down to which package it is on: a build of several minutes says
    what it is doing instead of nothing."""

    def on_line(line: str) -> None:
        words = line.split()
        if line.startswith("Collecting ") and len(words) > 1:
            shown.update(f"collecting {words[1]}")
        elif line.lstrip().startswith("Downloading ") and len(words) > 1:
            size = " ".join(words[2:]).strip("()")
            shown.update(f"downloading {words[1].rsplit('/', 1)[-1]}" + (f" ({size})" if size else ""))
        elif line.startswith("Processing ") and len(words) > 1:
            shown.update(f"unpacking {words[1].rsplit('/', 1)[-1]}")
        elif line.startswith("Installing collected packages:"):
            count = len(line.split(":", 1)[1].split(","))
            shown.update(f"installing {count} package{'s' if count != 1 else ''}")

    return on_line


def venv_python(env: Path) -> Path:
    return env / "bin" / "python"


def site_packages(env: Path) -> Path:
    return env / "lib" / f"python{sys.version_info.major}.{sys.version_info.minor}" / "site-packages"


def installed_versions(env: Path) -> dict[str, str]:
    found = {}
    for dist in importlib_metadata.distributions(path=[str(site_packages(env))]):
        found[_canonical(dist.metadata["Name"])] = dist.version
    return found


def _canonical(name: str) -> str:
    return name.lower().replace("_", "-").replace(".", "-")


def base_of(env: Path) -> list[Path]:
    """The base an overlay sees through its ``.pth`` (none for the base itself)."""
    try:
        return [Path((site_packages(env) / BASE_PTH).read_text().strip()).parent.parent.parent]
    except OSError:
        return []


@functools.lru_cache(maxsize=None)
def _pin_overlay_specs(version: str, sha256: str, pin: Pin) -> tuple[str, ...]:
    return tuple(sorted(f"{_canonical(r.name)}{r.specifier}" for r in pin_requirements(pin, only=OVERLAY_PACKAGES)
                        if _canonical(r.name) in OVERLAY_PACKAGES))


NOT_BUILT = "not built yet"  # an environment's installed versions before it is built


def env_fingerprint(pin: Pin) -> str:
    """What the pin's CPU environment is made of: the base's requirements file and layout, the
    Python it runs, the pin's own requirements for the overlay packages, and the versions pip
    installed in the base and the pin's overlay (their ``sglpatch-complete.json``): the same
    specifiers can resolve to other versions on another day or index. Computed without building
    anything; before the environment is built its installed versions are ``NOT_BUILT``, a key
    no answer is kept under (the answer is kept under the key computed once it ran)."""
    base = _base_path()
    parts = {
        "requirements": hashlib.sha256(REQUIREMENTS.read_bytes()).hexdigest(),
        "layout": BASE_LAYOUT,
        "python": env_python_version(base),
        "overlay": list(_pin_overlay_specs(pin.version, pin.sha256, pin)),
        "installed": _installed_record(pin, base),
    }
    return hashlib.sha256(json.dumps(parts, sort_keys=True).encode()).hexdigest()


def env_built(pin: Pin) -> bool:
    """Whether the pin's CPU environment (base and overlay) is built, so its fingerprint names
    the versions installed in it."""
    return _installed_record(pin, _base_path()) != NOT_BUILT


def _installed_record(pin: Pin, base: Path) -> str:
    """The base's and the pin's overlay's installed versions, as their builds recorded them."""
    try:
        base_record = (base / "sglpatch-complete.json").read_text()
        installed = json.loads(base_record)["packages"]
    except (OSError, ValueError, KeyError, TypeError):
        return NOT_BUILT
    wanted = _unsatisfied((Requirement(spec) for spec in _pin_overlay_specs(pin.version, pin.sha256, pin)), installed)
    if not wanted:
        return base_record
    try:
        return base_record + (_overlay_path(base, wanted) / "sglpatch-complete.json").read_text()
    except OSError:
        return NOT_BUILT


def env_group(pin: Pin) -> str:
    """What pins sharing a CPU Python have in common (``env_fingerprint``), for handing them to
    one worker; the pin's own version where its environment cannot be told yet."""
    try:
        return env_fingerprint(pin)
    except SglpatchError:
        return pin.version


def env_python_version(env: Path) -> str:
    """The Python version a venv was made with (its pyvenv.cfg), else the one that would make it."""
    try:
        for line in (env / "pyvenv.cfg").read_text().splitlines():
            key, _, value = line.partition("=")
            if key.strip() in ("version", "version_info"):
                return f"{platform.python_implementation().lower()}-{value.strip()}"
    except OSError:
        pass
    return f"{platform.python_implementation().lower()}-{platform.python_version()}"

