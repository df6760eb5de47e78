"""Shared fixtures: small sglang-shaped artifacts and projects made in the test, and the real cache.

Machinery tests use tiny artifacts built here (a file:// folder stands in for the package index),
so they are fast and exact; tests marked ``network`` use the real sglang artifacts of every pin.
"""

from __future__ import annotations

import functools
import getpass
import json
import hashlib
import io
import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
import textwrap
import zipfile
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from sglpatch.apply.apply_pins import apply_series
from sglpatch.apply.checkouts import checkout_commit
from sglpatch.plumbing import cache
from sglpatch.plumbing.project import Project
from sglpatch.series.patches import load_series
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import load_pins
from sglpatch.witnesses import answer_cache, registry
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult

REPO_ROOT = Path(__file__).resolve().parent.parent
# CI sets this: there a witness that could not run (no toolchain, no CPU environment) is a failure,
# not a skip, because CI installs both itself.
REQUIRE_WITNESSES = os.environ.get("SGLPATCH_REQUIRE_WITNESSES") == "1"


def skip_unless_required(message: str) -> None:
    """Skip with ``message`` where a check could not run here; fail instead where CI requires it."""
    if REQUIRE_WITNESSES:
        pytest.fail(message)
    pytest.skip(message)


def require_witness(result: WitnessResult) -> WitnessResult:
    """``result`` when the witness ran; otherwise skip with its reason (fail where CI requires it)."""
    if result.state == UNAVAILABLE:
        skip_unless_required(f"witness {result.witness} could not run here: {result.detail}")
    return result


def pytest_configure(config):
    """pytest keeps the last runs' temporary folders (``tmp_path_retention_count``, 3) and, as a
    run starts and before any test, deletes the older ones one by one. Here that is a whole run's
    checkouts (2.8 GB, about 200,000 files), 40-90 s of a 6-minute run on a disk mounted with
    ``discard``. The folders it would delete are moved aside instead (one rename each) and removed
    by a process of their own while the tests run; what pytest keeps is unchanged, and a folder
    still locked by a run is left alone."""
    if hasattr(config, "workerinput") or config.option.basetemp:
        return
    try:
        user = getpass.getuser()
        keep = int(config.getini("tmp_path_retention_count"))
    except (OSError, KeyError, ValueError):
        return
    root = Path(os.environ.get("PYTEST_DEBUG_TEMPROOT") or tempfile.gettempdir()).resolve() / f"pytest-of-{user}"
    numbered = []
    for folder in root.glob("pytest-*"):
        number = folder.name.removeprefix("pytest-")
        if number.isdigit() and folder.is_dir() and not folder.is_symlink() and not (folder / ".lock").exists():
            numbered.append((int(number), folder))
    stale = [folder for _, folder in sorted(numbered)[: max(0, len(numbered) - (keep - 1))]]
    if not stale:
        return
    aside = Path(tempfile.mkdtemp(dir=root, prefix="sglpatch-removing-"))
    for folder in stale:
        folder.rename(aside / folder.name)
    subprocess.Popen(["rm", "-rf", str(aside)], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                     stderr=subprocess.DEVNULL, start_new_session=True)


# -- the real pins and series of this repository ------------------------------------------------

REAL_PINS = load_pins(REPO_ROOT / "upstream" / "pins.toml")


def one_pin_per_rendition(patch: str) -> list[str]:
    """The oldest pin of each rendition of ``patch`` (and of the pins it has none for): the real
    pins a test of that patch's behaviour sweeps. Every pin is proven by apply and the CPU tier,
    which CI runs on all of them; a test that repeats that proof pin by pin proves nothing more
    where the pins share a rendition."""
    series_patch = load_series(REPO_ROOT / "patches").get(patch)
    chosen: dict[object, str] = {}
    for pin in REAL_PINS.pins:
        rendition = series_patch.for_version(pin.version)
        chosen.setdefault(rendition.path.name if rendition else None, pin.version)
    return list(chosen.values())


def pristine_subtree(version: str, dest: Path, path: str = "python/sglang", keep=None) -> Path:
    """The pinned release's files under ``path`` as released (from its pristine commit), in ``dest``;
    ``keep(name)`` narrows them further."""
    pin = REAL_PINS.select([version])[0]
    pristine = pristine_tree.pristine_from_index(pin)
    listed = subprocess.run(["git", "ls-tree", "-r", "-z", "--name-only", pristine.commit, "--", path],
                            cwd=pristine.repo, capture_output=True, check=True).stdout.decode()
    names = [name for name in listed.split("\0") if name and (keep is None or keep(name))]
    return checkout_commit(pristine.repo, pristine.commit, dest, names)


def pin_patch(patch: str, version: str) -> bytes:
    """The series' ``patch`` as ``sglpatch apply`` applies it to ``version``: where the lock commits
    it there, the pin's own patch (the locked commit, as git format-patch writes it -- a rendition
    apply merges three-way does not apply as it is); elsewhere its rendition for the pin."""
    series_patch = load_series(REPO_ROOT / "patches").get(patch)
    locked = _locked_patches(version)
    if series_patch.name in locked:
        return locked[series_patch.name]
    rendition = series_patch.for_version(version)
    assert rendition is not None, f"{patch} has no rendition for {version}"
    return rendition.path.read_bytes()


@functools.lru_cache(maxsize=None)
def _locked_patches(version: str) -> dict[str, bytes]:
    from sglpatch.series.export import locked_patches

    return dict(locked_patches(Project(REPO_ROOT), version))


def apply_rendition(tree: Path, patch: str, version: str) -> Path:
    """``tree`` with the series' ``patch`` applied as apply applies it to ``version`` (``pin_patch``, git apply)."""
    subprocess.run(["git", "apply", "--directory=", "-"], cwd=tree, input=pin_patch(patch, version), check=True)
    return tree


def read_only_tree(version: str, patch: str | None = None) -> Path:
    """The pin's python/sglang as released, with ``patch``'s rendition for the pin applied if
    named, for the tests that only read it (the probes import from it; nothing is written there).
    It is kept in the sglpatch cache by what it holds (the pristine commit, the patch's bytes)
    and shared by every test, worker and run: a sweep over the pins then writes no tree (each is
    about 6,500 files; a run used to write and later delete 330,000 of them). A test that changes
    its tree makes its own with ``pristine_subtree``."""
    pin = REAL_PINS.select([version])[0]
    pristine = pristine_tree.pristine_from_index(pin)
    text = pin_patch(patch, version) if patch else b""
    key = hashlib.sha256(pristine.commit.encode() + b"\0" + text).hexdigest()
    folder = cache.cache_root() / "test-trees" / f"{version}-{key[:16]}"
    with cache.entry_lock(folder, on_wait=lambda message: None):
        if not (folder / ".complete").is_file():
            cache.remove(folder)
            with cache.staging(folder) as staging:
                pristine_subtree(version, staging)
                if patch:
                    apply_rendition(staging, patch, version)
                (staging / ".complete").write_text(f"{pristine.commit} {patch or ''}\n")
    return folder


def shipped_trees(version: str):
    """The pin's pristine and patched commits as ``sglpatch apply`` makes them (the shipped series,
    classified by text, in a scratch copy of the project), shared by the tests of one worker."""
    return _shipped_trees(version)


_SESSION_FOLDERS: list[Path] = []  # kept for a worker's whole session, removed at its end


@pytest.fixture(scope="session", autouse=True)
def nothing_left_behind_in_tmp():
    """A pytest-xdist worker ends past atexit: what the session started or kept is removed here."""
    yield
    from sglpatch.witnesses import probe_children

    probe_children.close_fork_servers()
    for folder in _SESSION_FOLDERS:
        shutil.rmtree(folder, ignore_errors=True)


@functools.lru_cache(maxsize=None)
def _shipped_trees(version: str):
    root = Path(tempfile.mkdtemp(prefix=f"sglpatch-shipped-{version}-"))
    _SESSION_FOLDERS.append(root)
    for part in ("upstream", "patches"):
        shutil.copytree(REPO_ROOT / part, root / part)
    shutil.copy(REPO_ROOT / "series.lock", root / "series.lock")
    from sglpatch.apply.apply_pins import apply_series

    result = apply_series(Project(root), [version], run_witnesses=False, record=False, out_dir=root / "build").results[0]
    assert result.commit, result.error
    return result


def witnessed(witness, version: str, patched: bool, dest: Path) -> WitnessResult:
    """``witness``'s answer on the pin's pristine or patched tree, exactly as ``apply`` asks for it
    (``answer_cache.run_cached``: the same tree hash and fingerprint), so a test and an apply share
    one run; a change to the witness's code or environment changes its key and runs it again."""
    result = shipped_trees(version)
    tree_repo = Path(result.tree_path)
    commit = result.commit if patched else result.pristine
    tree_hash = git(tree_repo, "rev-parse", f"{commit}^{{tree}}").strip()
    pin = REAL_PINS.select([version])[0]
    return answer_cache.run_cached(witness, tree_hash, pin, lambda: checkout_commit(tree_repo, commit, dest))


@pytest.fixture
def project_copy(tmp_path) -> Project:
    """The repository's pins, patches and lock, copied so a test can never rewrite the real lock."""
    root = tmp_path / "project"
    for part in ("upstream", "patches"):
        shutil.copytree(REPO_ROOT / part, root / part)
    shutil.copy(REPO_ROOT / "series.lock", root / "series.lock")
    return Project(root)


def numbered_module(lines: list[str]) -> str:
    """The fake pins' numbered lines as a Python module: one string literal holding them, opened on
    the first line and closed on a line after the last, so each line keeps its number and text and
    the rebase's judge reads the file as the Python it is named as."""
    return '"""' + "".join(lines) + '"""\n'


BASE_FILES = {
    "sglang/__init__.py": "from sglang.version import __version__\n",
    "sglang/version.py": '__version__ = "{version}"\n',
    "sglang/srt/layers/example.py": numbered_module([f"line {n}\n" for n in range(1, 41)]),
    "sglang/jit_kernel/csrc/kernel.cuh": "#pragma once\n#include <algorithm>\n#include <cuda_runtime.h>\n\nvoid f();\n",
}


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def make_sdist(folder: Path, version: str, files: dict[str, str], extra: list[tarfile.TarInfo] | None = None) -> Path:
    """An sdist shaped like sglang's: sglang-<v>/ holding the package, PKG-INFO, egg-info."""
    path = folder / f"sglang-{version}.tar.gz"
    top = f"sglang-{version}"
    members = {
        **{name: text.format(version=version) for name, text in files.items()},
        "PKG-INFO": f"Metadata-Version: 2.1\nName: sglang\nVersion: {version}\n",
        "sglang.egg-info/SOURCES.txt": "sglang/__init__.py\n",
        "setup.cfg": "[egg_info]\ntag_build = \ntag_date = 0\n\n",
        "pyproject.toml": '[project]\nname = "sglang"\n',
        "sglang/_version.py": f'__version__ = "{version}"\n',
    }
    with tarfile.open(path, "w:gz") as archive:
        for name, text in sorted(members.items()):
            data = text.encode()
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(data)
            info.mode = 0o644
            archive.addfile(info, io.BytesIO(data))
        for info in extra or []:
            archive.addfile(info, io.BytesIO(b"x" * info.size) if info.isfile() else None)
    return path


def make_wheel(folder: Path, version: str, files: dict[str, str], extra: dict[str, bytes] | None = None) -> Path:
    path = folder / f"sglang-{version}-cp311-cp311-manylinux_2_34_x86_64.whl"
    with zipfile.ZipFile(path, "w") as archive:
        for name, text in sorted(files.items()):
            archive.writestr(name, text.format(version=version))
        archive.writestr("sglang/srt/_kernels.cpython-311-x86_64-linux-gnu.so", b"\x7fELF")
        archive.writestr("sglang/_version.py", f'__version__ = "{version}"\n')
        archive.writestr(f"sglang-{version}.dist-info/METADATA", "Name: sglang\n")
        for name, data in (extra or {}).items():
            archive.writestr(name, data)
    return path


def pin_entry(version: str, artifact: Path, released: str = "2026-01-02T03:04:05Z") -> str:
    return textwrap.dedent(
        f"""
        [[pin]]
        version = "{version}"
        tag = "v{version}"
        commit = ""
        commit_verified = false
        artifact = "{artifact.name}"
        sha256 = "{sha256(artifact)}"
        released = "{released}"
        rocm_image = "lmsysorg/sglang:v{version}-rocm720-mi35x"
        """
    )


def git(cwd: Path, *args: str, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1", **(env or {})}
    return subprocess.run(["git", *args], cwd=cwd, env=full_env, check=True, capture_output=True, text=True).stdout


AUTHOR_ENV = {
    "GIT_AUTHOR_NAME": "Patch Author",
    "GIT_AUTHOR_EMAIL": "author@example.com",
    "GIT_AUTHOR_DATE": "2026-11-01T10:00:00+00:00",
    "GIT_COMMITTER_NAME": "Patch Author",
    "GIT_COMMITTER_EMAIL": "author@example.com",
    "GIT_COMMITTER_DATE": "2026-11-01T10:00:00+00:00",
}

DEFAULT_TRAILERS = {
    "Upstream-Status": "Pending",
    "Origin": "sglpatch, written for this test",
    "Witness": "fixture-unwitnessed",
    "Applies-To": ">=0.1",
}


def format_patch(
    tmp: Path,
    files: dict[str, str],
    edits: dict[str, str | None],
    subject: str,
    trailers: dict[str, str] | None = None,
    body: str = "Problem, cause and fix, in a few words.",
) -> str:
    """A real `git format-patch` of ``edits`` (path -> new text, None deletes) on ``files``."""
    tmp.mkdir(parents=True, exist_ok=True)
    repo = Path(tempfile.mkdtemp(dir=tmp, prefix="patch-src-"))
    git(repo, "init", "-q")
    for name, text in files.items():
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "base", env=AUTHOR_ENV)
    for name, text in edits.items():
        target = repo / name
        if text is None:
            target.unlink()
        else:
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_text(text)
    git(repo, "add", "-A")
    trailer_text = "\n".join(f"{key}: {value}" for key, value in {**DEFAULT_TRAILERS, **(trailers or {})}.items())
    git(repo, "commit", "-q", "-m", f"{subject}\n\n{body}\n\n{trailer_text}\n", env=AUTHOR_ENV)
    return git(repo, "format-patch", "-1", "--stdout", "--zero-commit")


def tree_files(version: str) -> dict[str, str]:
    """BASE_FILES as they sit in a pristine tree (python/...)."""
    return {f"python/{name}": text.format(version=version) for name, text in BASE_FILES.items()}


@dataclass
class FakeProject:
    root: Path
    index: Path
    versions: list[str]
    patches: list[tuple[str, str]] = field(default_factory=list)

    @property
    def project(self) -> Project:
        return Project(self.root)

    def set_patches(self, patches: list[tuple[str, str]], renditions: dict[str, list[tuple[str, str]]] | None = None) -> None:
        patches_dir = self.root / "patches"
        for old in patches_dir.rglob("*.patch"):
            old.unlink()
        (patches_dir / "series").write_text("# test series\n" + "".join(f"{name}\n" for name, _ in patches))
        for name, text in patches:
            (patches_dir / name).write_text(text)
        for stem, files in (renditions or {}).items():
            folder = patches_dir / "renditions" / stem
            folder.mkdir(parents=True, exist_ok=True)
            for name, text in files:
                (folder / name).write_text(text)


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> Path:
    path = tmp_path / "cache"
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(path))
    monkeypatch.delenv(cache.ANSWERS_ENV, raising=False)
    monkeypatch.delenv("SGLPATCH_INDEX_URL", raising=False)
    monkeypatch.delenv("SGLPATCH_OUT_DIR", raising=False)
    return path


@pytest.fixture
def fake_project(tmp_path, cache_dir, monkeypatch) -> FakeProject:
    """A project with two small pins: 0.1.0 (sdist) and 0.2.0 (wheel), and an empty series."""
    root = tmp_path / "project"
    index = tmp_path / "index"
    index.mkdir()
    (root / "upstream").mkdir(parents=True)
    (root / "patches").mkdir()
    sdist = make_sdist(index, "0.1.0", BASE_FILES)
    wheel = make_wheel(index, "0.2.0", BASE_FILES)
    (root / "upstream" / "pins.toml").write_text(
        pin_entry("0.1.0", sdist) + pin_entry("0.2.0", wheel)
    )
    # The fake project's artifacts come from its own index folder, as a user's mirror would.
    monkeypatch.setenv("SGLPATCH_INDEX_URL", index.as_uri())
    (root / "patches" / "series").write_text("# empty\n")
    (root / "patches" / "CHANGELOG.md").write_text("# changelog\n\n## v1 — 2026-11-30\n\n- test\n")
    return FakeProject(root=root, index=index, versions=["0.1.0", "0.2.0"])


class TextWitness:
    """A test witness: the bug is "fixed" when ``needle`` is in ``path`` of the tree (in any of
    them, for a tuple: a file the release moved)."""

    version = "1"

    def __init__(self, name: str, path: str | tuple[str, ...], needle: str):
        self.name, self.path, self.needle = name, path, needle
        self.runs: list[Path] = []

    def run(self, tree: Path, pin) -> WitnessResult:
        self.runs.append(tree)
        paths = (self.path,) if isinstance(self.path, str) else self.path
        found = any(self.needle in (tree / path).read_text() for path in paths if (tree / path).exists())
        return WitnessResult(self.name, CLEAN if found else BUG, "text", f"{self.needle!r} in {' or '.join(paths)}")


class UnwitnessedFixture:
    """The default witness of test patches that test the text machinery only: it cannot tell."""

    name = "fixture-unwitnessed"
    version = "1"

    def run(self, tree: Path, pin) -> WitnessResult:
        return WitnessResult(self.name, UNAVAILABLE, detail="a test patch without a real witness")


TEST_WITNESSES = {
    "fixture-unwitnessed": UnwitnessedFixture(),
    "guard-text": TextWitness("guard-text", "python/sglang/jit_kernel/csrc/kernel.cuh", "#ifndef USE_ROCM"),
}
_real_registry = registry.registry


@pytest.fixture(autouse=True)
def test_witnesses(monkeypatch):
    """The real witnesses plus the test ones, for projects made in the tests."""
    for witness in TEST_WITNESSES.values():
        if hasattr(witness, "runs"):
            witness.runs.clear()
    monkeypatch.setattr(registry, "registry", lambda: {**_real_registry(), **TEST_WITNESSES})
    return TEST_WITNESSES


# Test double: a rebase's CPU matrix cells on the fake releases. They are no sglang (no CPU Python
# of their own, no ServerArgs to resolve), so the real cells could only say unavailable there; the
# double answers every cell a release has, passed unless a test names it in FAKE_CELL_FAILURES.
# Real releases (tests marked network) run the real cells.
FAKE_CELL_FAILURES: dict[str, str] = {}


def _fake_release_cells(staged, version):
    from sglpatch.matrix.cells import cells
    from sglpatch.matrix.records import FAILED, PASSED, CellRecord

    series = staged.series()
    records = []
    for cell in cells([version], ("cpu",)):
        record = CellRecord(cell.tier, cell.check, cell.pin, cell.depth, series.version, series.digest(), PASSED,
                            gpu="none: test double for a fake release")
        if record.cell_id in FAKE_CELL_FAILURES:
            record.outcome, record.reason = FAILED, FAKE_CELL_FAILURES[record.cell_id]
        records.append(record)
    return records


@pytest.fixture(autouse=True)
def fake_release_cells(monkeypatch, request):
    FAKE_CELL_FAILURES.clear()
    if request.node.get_closest_marker("network") is None:
        import sglpatch.rebase.onto

        monkeypatch.setattr(sglpatch.rebase.onto, "pin_cells", _fake_release_cells)
    return FAKE_CELL_FAILURES


# Test double: the rebase judge's import smoke on the fake releases. They are no sglang (no CPU
# Python of their own, no server code), so the real smoke could only say unavailable there; the
# double imports each touched Python module with this interpreter, the candidate tree on the path.
# Real releases (tests marked network) run the real smoke, in the pin's CPU Python.
def _import_with_this_python(trial, commit, changed) -> list[str]:
    from sglpatch.apply.checkouts import checkout_commit

    tree = checkout_commit(trial.repo, commit, Path(tempfile.mkdtemp(dir=trial.scratch, prefix="imports-")))
    findings = []
    for path in changed:
        if path.startswith("python/") and path.endswith(".py") and (tree / path).exists():
            module = path[len("python/"):-3].replace("/", ".").removesuffix(".__init__")
            done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120,
                                  env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tree / "python")})
            if done.returncode:
                findings.append(f"{module}: {done.stderr.strip().splitlines()[-1]}")
    return findings


@pytest.fixture(autouse=True)
def fake_release_imports(monkeypatch, request):
    if request.node.get_closest_marker("network") is None:
        from sglpatch.rebase.trial import Trial

        monkeypatch.setattr(Trial, "import_smoke", _import_with_this_python)


def example_lines(replace: dict[int, str] | None = None, insert_top: int = 0) -> str:
    """The fake pins' ``example.py`` ("line 1" .. "line 40"), with lines replaced by number and
    ``insert_top`` new lines on top."""
    lines = [f"line {n}\n" for n in range(1, 41)]
    for number, text in (replace or {}).items():
        lines[number - 1] = text
    return numbered_module([f"new top {n}\n" for n in range(insert_top)] + lines)


# -- a patch apply merges three-way (git apply --3way from the blobs of another pin's tree) ----------

THREE_WAY_EXAMPLE = "python/sglang/srt/layers/example.py"
THREE_WAY_CHANGED = example_lines({17: "0.2.5 changed line 17\n"})


@pytest.fixture
def three_way(fake_project, tmp_path, monkeypatch, test_witnesses):
    """A third pin, 0.2.5, whose example.py changed line 17, in the context of a patch of line 20
    made on 0.1.0: apply merges it three-way there, from the blobs of 0.2.0's pristine tree. The
    lock proven by a witness that finds "patched" in example.py."""
    wheel = make_wheel(fake_project.index, "0.2.5", {**BASE_FILES, "sglang/srt/layers/example.py": THREE_WAY_CHANGED})
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.2.5", wheel))
    monkeypatch.setitem(test_witnesses, "example-text", TextWitness("example-text", THREE_WAY_EXAMPLE, "patched"))
    files = tree_files("0.1.0")
    patch = format_patch(tmp_path, files, {THREE_WAY_EXAMPLE: files[THREE_WAY_EXAMPLE].replace("line 20\n", "patched\n")}, "example: patch line 20",
                         trailers={"Witness": "example-text"})
    fake_project.set_patches([("0001-example.patch", patch)])
    assert apply_series(fake_project.project).ok
    locked = json.loads(fake_project.project.lock_file.read_text())["pins"]["0.2.5"]
    assert locked["patches"][0]["status"] == "applied-three-way"
    return fake_project


def pip_default_index_host() -> str:
    """pip's own default index host, asked of pip (so no file here names it)."""
    code = "from pip._internal.models.index import PyPI; print(PyPI.netloc)"
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
