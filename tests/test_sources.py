"""Pristine trees: the artifact's files in upstream's layout, checked, cached and reproducible."""

from __future__ import annotations

import dataclasses
import multiprocessing
import tarfile
from pathlib import Path

import pytest

from conftest import BASE_FILES, git, make_sdist, make_wheel, pin_entry, sha256
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources import pristine_tree
from sglpatch.sources.pins import load_pins


def _pristine(project, version):
    pins = project.project.pins()
    return pristine_tree.pristine_from_index(pins.select([version])[0])


def _tree_listing(repo: Path, commit: str) -> set[str]:
    return set(git(repo, "ls-tree", "-r", "--name-only", commit).split())


def test_sdist_tree_is_in_upstream_layout_without_generated_files(fake_project):
    pristine = _pristine(fake_project, "0.1.0")
    files = _tree_listing(pristine.repo, pristine.commit)
    assert "python/sglang/__init__.py" in files
    assert "python/pyproject.toml" in files
    assert not any("egg-info" in f or f.endswith(("PKG-INFO", "setup.cfg", "_version.py")) for f in files)


def test_wheel_tree_leaves_out_compiled_modules_metadata_and_version_file(fake_project):
    pristine = _pristine(fake_project, "0.2.0")
    files = _tree_listing(pristine.repo, pristine.commit)
    assert "python/sglang/srt/layers/example.py" in files
    assert not any(f.endswith(".so") or "dist-info" in f or f.endswith("_version.py") for f in files)


def test_pristine_commit_is_identical_across_separate_caches(fake_project, tmp_path, monkeypatch):
    first = _pristine(fake_project, "0.1.0").commit
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(tmp_path / "other-cache"))
    second = _pristine(fake_project, "0.1.0").commit
    assert first == second
    log = git(_pristine(fake_project, "0.1.0").repo, "log", "-1", "--format=%an <%ae> %ad", "--date=iso-strict", second)
    assert log.strip() == "sglpatch <sglpatch@localhost> 2026-01-02T03:04:05+00:00"


@pytest.mark.parametrize("version", ["0.1.0", "0.2.0"])
def test_release_files_hold_the_pristine_blobs_of_just_the_files_asked_for(fake_project, version):
    pin = fake_project.project.pins().select([version])[0]
    assert pristine_tree.cached_pristine(pin) is None
    asked = ["python/sglang/srt/layers/example.py", "python/sglang/not_in_the_release.py"]
    repo = pristine_tree.release_files(pin, asked)
    assert pristine_tree.cached_pristine(pin) is None  # the whole tree was not imported
    assert _tree_listing(repo, "HEAD") == {asked[0]}
    pristine = _pristine(fake_project, version)
    assert pristine_tree.cached_pristine(pin) == pristine.repo
    assert git(repo, "rev-parse", f"HEAD:{asked[0]}") == git(pristine.repo, "rev-parse", f"{pristine.commit}:{asked[0]}")


def test_tampered_artifact_is_refused_by_its_hash_and_not_cached(fake_project, cache_dir):
    artifact = fake_project.index / "sglang-0.1.0.tar.gz"
    artifact.write_bytes(artifact.read_bytes() + b"tampered")
    with pytest.raises(SglpatchError, match=r"sglang-0.1.0.tar.gz .*sha256 .* does not match"):
        _pristine(fake_project, "0.1.0")
    assert not (cache_dir / "artifacts" / "sglang-0.1.0.tar.gz").exists()
    assert not list((cache_dir / "artifacts").glob(".download-*"))


def test_damaged_cached_artifact_is_fetched_again(fake_project, cache_dir):
    good = _pristine(fake_project, "0.1.0").commit
    cached = cache_dir / "artifacts" / "sglang-0.1.0.tar.gz"
    cached.write_bytes(b"garbage")
    for entry in (cache_dir / "pristine").iterdir():
        if entry.is_dir():
            (entry / "sglpatch-complete.json").unlink()
    assert _pristine(fake_project, "0.1.0").commit == good
    assert sha256(cached) == sha256(fake_project.index / "sglang-0.1.0.tar.gz")


@pytest.mark.parametrize("damage", ["marker", "pack"])
def test_damaged_pristine_entry_is_detected_and_rebuilt(fake_project, cache_dir, damage):
    good = _pristine(fake_project, "0.1.0")
    if damage == "marker":
        (good.repo / "sglpatch-complete.json").unlink()
    else:
        pack = next((good.repo / "objects" / "pack").glob("*.pack"))
        pack.write_bytes(pack.read_bytes()[:100])
    rebuilt = _pristine(fake_project, "0.1.0")
    assert rebuilt.commit == good.commit
    git(rebuilt.repo, "fsck", "--no-dangling")


def _evil_project(fake_project, member: tarfile.TarInfo) -> None:
    index = fake_project.index
    artifact = make_sdist(index, "0.3.0", BASE_FILES, extra=[member])
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.3.0", artifact))


def _member(name, kind=tarfile.REGTYPE, linkname=""):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = linkname
    info.size = 3 if kind == tarfile.REGTYPE else 0
    return info


@pytest.mark.parametrize(
    "member, message",
    [
        (_member("sglang-0.3.0/../escape.py"), "unsafe member path"),
        (_member("/etc/evil.py"), "unsafe member path"),
        (_member("sglang-0.3.0/sglang/link", tarfile.SYMTYPE, "../../../etc/passwd"), "points outside the tree"),
        (_member("sglang-0.3.0/sglang/abs", tarfile.SYMTYPE, "/etc/passwd"), "points outside the tree"),
        (_member("other-top/file.py"), "outside the sglang-0.3.0/ folder"),
    ],
)
def test_unsafe_archive_members_are_refused(fake_project, cache_dir, member, message):
    _evil_project(fake_project, member)
    with pytest.raises(SglpatchError, match=message):
        _pristine(fake_project, "0.3.0")
    assert not [p for p in (cache_dir / "pristine").iterdir() if p.name.startswith("0.3.0") and p.suffix != ".lock"]


def test_unsafe_wheel_member_is_refused(fake_project):
    artifact = make_wheel(fake_project.index, "0.4.0", BASE_FILES, extra={"../../evil.py": b"x"})
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.4.0", artifact))
    with pytest.raises(SglpatchError, match="unsafe member path"):
        _pristine(fake_project, "0.4.0")


def test_symlink_inside_the_tree_is_kept_as_a_link(fake_project):
    _evil_project(fake_project, _member("sglang-0.3.0/sglang/alias.py", tarfile.SYMTYPE, "__init__.py"))
    pristine = _pristine(fake_project, "0.3.0")
    entry = git(pristine.repo, "ls-tree", pristine.commit, "python/sglang/alias.py")
    assert entry.startswith("120000 ")


def _build_in_process(args):
    cache, root = args
    import os

    os.environ["SGLPATCH_CACHE_DIR"] = cache
    from sglpatch.plumbing.project import Project

    pins = Project(Path(root)).pins()
    return pristine_tree.pristine_from_index(pins.pins[0]).commit


def test_concurrent_builders_share_one_cache_entry(fake_project, cache_dir):
    context = multiprocessing.get_context("spawn")
    with context.Pool(4) as pool:
        commits = pool.map(_build_in_process, [(str(cache_dir), str(fake_project.root))] * 4)
    assert len(set(commits)) == 1
    entries = [p for p in (cache_dir / "pristine").iterdir() if p.is_dir()]
    assert len(entries) == 1


def _upstream_repo(tmp_path: Path) -> tuple[Path, str]:
    repo = tmp_path / "upstream-sglang"
    (repo / "python" / "sglang").mkdir(parents=True)
    (repo / "python" / "sglang" / "__init__.py").write_text("# sglang\n")
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-q", "-m", "release")
    git(repo, "tag", "v0.1.0")
    (repo / "python" / "sglang" / "later.py").write_text("# after the tag\n")
    git(repo, "add", "-A")
    git(repo, "-c", "user.name=u", "-c", "user.email=u@e", "commit", "-q", "-m", "later")
    return repo, git(repo, "rev-parse", "v0.1.0").strip()


def _git_pin(fake_project, commit: str):
    pins_file = fake_project.root / "upstream" / "pins.toml"
    text = pins_file.read_text().replace('commit = ""', f'commit = "{commit}"', 1)
    pins_file.write_text(text)
    return load_pins(pins_file).select(["0.1.0"])[0]


def test_git_source_fetches_the_pinned_commit_and_checks_its_sha(fake_project, tmp_path):
    repo, tagged = _upstream_repo(tmp_path)
    pin = _git_pin(fake_project, tagged)
    pristine = pristine_tree.pristine_from_git(pin, str(repo))
    assert pristine.commit == tagged
    assert git(pristine.repo, "ls-tree", "-r", "--name-only", tagged).split() == ["python/sglang/__init__.py"]


def test_git_source_refuses_a_commit_other_than_the_pinned_one(fake_project, tmp_path):
    repo, tagged = _upstream_repo(tmp_path)
    pin = _git_pin(fake_project, "0" * 40)
    with pytest.raises(SglpatchError, match="cannot fetch 0{40} or tag v0.1.0|gave commit"):
        pristine_tree.pristine_from_git(pin, str(repo))


def test_git_source_needs_a_recorded_commit(fake_project, tmp_path):
    repo, _ = _upstream_repo(tmp_path)
    pin = load_pins(fake_project.root / "upstream" / "pins.toml").select(["0.1.0"])[0]
    with pytest.raises(SglpatchError, match="no commit is recorded"):
        pristine_tree.pristine_from_git(pin, str(repo))


def _counting_metadata_reads(monkeypatch) -> list[Path]:
    """The artifacts whose metadata is read out of the archive from now on, with an empty
    in-process memo (as a fresh process has)."""
    opened = []
    real = pristine_tree._read_metadata

    def counting(artifact: Path) -> str:
        opened.append(artifact)
        return real(artifact)

    monkeypatch.setattr(pristine_tree, "_read_metadata", counting)
    monkeypatch.setattr(pristine_tree, "_metadata_memo", {})
    return opened


@pytest.mark.parametrize("version, first_line", [("0.1.0", "Metadata-Version: 2.1"), ("0.2.0", "Name: sglang")])
def test_artifact_metadata_is_read_once_per_artifact_hash(fake_project, cache_dir, monkeypatch, version, first_line):
    opened = _counting_metadata_reads(monkeypatch)
    pin = fake_project.project.pins().select([version])[0]
    metadata = pristine_tree.pin_metadata(pin)
    assert metadata.splitlines()[0] == first_line
    assert len(opened) == 1
    # This process answers from its memo; the next from the cache entry, without the artifact:
    # it is neither fetched, hashed nor opened.
    (cache_dir / "artifacts" / pin.artifact).unlink()
    assert pristine_tree.pin_metadata(pin) == metadata
    monkeypatch.setattr(pristine_tree, "_metadata_memo", {})
    monkeypatch.setattr(pristine_tree, "fetch_artifact", lambda *args, **kwargs: pytest.fail("the artifact was fetched"))
    assert pristine_tree.pin_metadata(pin) == metadata
    assert len(opened) == 1


def test_artifact_metadata_by_path_uses_the_digest_fetch_checked(fake_project, cache_dir, monkeypatch):
    pin = fake_project.project.pins().select(["0.2.0"])[0]
    artifact = pristine_tree.fetch_artifact(pin)
    opened = _counting_metadata_reads(monkeypatch)
    metadata = pristine_tree.artifact_metadata(artifact)
    assert (cache_dir / "metadata" / f"{pin.sha256}.json").is_file()
    monkeypatch.setattr(pristine_tree, "_metadata_memo", {})
    monkeypatch.setattr(pristine_tree, "file_sha256", lambda path: pytest.fail(f"{path} was hashed again"))
    assert pristine_tree.artifact_metadata(artifact) == pristine_tree.pin_metadata(pin) == metadata
    assert opened == [artifact]


def test_a_changed_artifact_hash_reads_the_metadata_again(fake_project, cache_dir, tmp_path, monkeypatch):
    opened = _counting_metadata_reads(monkeypatch)
    pin = fake_project.project.pins().select(["0.2.0"])[0]
    pristine_tree.pin_metadata(pin)
    # The release re-pinned to another artifact under the same name, from another index.
    other_index = tmp_path / "other-index"
    other_index.mkdir()
    rebuilt = make_wheel(other_index, "0.2.0", {**BASE_FILES, "sglang/added.py": "x = 1\n"})
    monkeypatch.setenv("SGLPATCH_INDEX_URL", other_index.as_uri())
    (cache_dir / "artifacts" / pin.artifact).unlink()
    repinned = dataclasses.replace(pin, sha256=sha256(rebuilt))
    assert repinned.sha256 != pin.sha256
    pristine_tree.pin_metadata(repinned)
    assert len(opened) == 2 and opened[1].name == pin.artifact
    assert {entry.stem for entry in (cache_dir / "metadata").glob("*.json")} == {pin.sha256, repinned.sha256}


@pytest.mark.parametrize("damage", ["truncated", "text changed", "another artifact's entry"])
def test_damaged_metadata_entry_is_read_again_from_the_artifact(fake_project, cache_dir, monkeypatch, damage):
    sdist, wheel = fake_project.project.pins().select(["0.1.0", "0.2.0"])
    monkeypatch.setattr(pristine_tree, "_metadata_memo", {})
    metadata = pristine_tree.pin_metadata(sdist)
    entry = cache_dir / "metadata" / f"{sdist.sha256}.json"
    if damage == "truncated":
        entry.write_text(entry.read_text()[:20])
    elif damage == "text changed":
        entry.write_text(entry.read_text().replace("Name: sglang", "Name: other"))
    else:
        pristine_tree.pin_metadata(wheel)
        entry.write_bytes((cache_dir / "metadata" / f"{wheel.sha256}.json").read_bytes())
    opened = _counting_metadata_reads(monkeypatch)
    assert pristine_tree.pin_metadata(sdist) == metadata
    assert len(opened) == 1
    monkeypatch.setattr(pristine_tree, "_metadata_memo", {})
    assert pristine_tree.pin_metadata(sdist) == metadata
    assert len(opened) == 1  # the entry was rebuilt whole
