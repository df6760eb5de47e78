"""`sglpatch apply --into CHECKOUT`: the series applied to a user's own sglang checkout, or refused."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest

from conftest import THREE_WAY_CHANGED, THREE_WAY_EXAMPLE, format_patch, git, tree_files
from sglpatch.apply.apply_pins import apply_series
from sglpatch.apply.into import apply_into, checkout_version, locked_proof
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.sources import pristine_tree
from sglpatch.witnesses import answer_cache

KERNEL = "python/sglang/jit_kernel/csrc/kernel.cuh"
EXAMPLE = "python/sglang/srt/layers/example.py"
USER = ["-c", "user.name=Rocm User", "-c", "user.email=user@example.com"]


@pytest.fixture
def guarded(fake_project, tmp_path):
    files = tree_files("0.1.0")
    guard = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    first = format_patch(tmp_path, files, {KERNEL: guard}, "kernel: guard the include", trailers={"Witness": "guard-text"})
    files = {**files, KERNEL: guard}
    second = format_patch(tmp_path, files, {KERNEL: guard + "// fused\n"}, "kernel: note", trailers={"Witness": "guard-text"})
    fake_project.set_patches([("0001-guard.patch", first), ("0002-note.patch", second)])
    # The lock entries --into applies, proven by the witnesses once, as CI does.
    assert apply_series(fake_project.project, ["0.1.0"]).ok
    return fake_project


def _locked(project, version="0.1.0"):
    return json.loads(project.lock_file.read_text())["pins"][version]


def _no_witness_may_run(monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("a witness ran")

    monkeypatch.setattr(answer_cache, "run_cached_many", refuse)
    monkeypatch.setattr(answer_cache, "run_cached", refuse)


def _pristine_files(project, dest):
    from sglpatch.sources import pristine_tree

    pin = project.pins().select(["0.1.0"])[0]
    pristine = pristine_tree.pristine_from_index(pin)
    archive = subprocess.run(["git", "archive", pristine.commit], cwd=pristine.repo, capture_output=True, check=True).stdout
    dest.mkdir(parents=True)
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    return dest


def _git_checkout(project, dest):
    _pristine_files(project, dest)
    git(dest, "init", "-q", "-b", "main")
    # The user's identity, which git asks for before it commits (the machine may have none).
    git(dest, "config", "user.name", "Rocm User")
    git(dest, "config", "user.email", "user@example.com")
    git(dest, "add", "-A")
    git(dest, *USER, "commit", "-q", "-m", "sglang 0.1.0 as in the image")
    git(dest, "tag", "v0.1.0")
    return dest


def _patched(project):
    tree = project.build_dir / "trees" / "0.1.0"
    return (tree / KERNEL).read_text()


def test_a_git_checkout_gets_one_commit_per_patch_on_its_branch(guarded, tmp_path):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    git(checkout, "config", "user.name", "Rocm User")
    git(checkout, "config", "user.email", "user@example.com")
    assert checkout_version(checkout) == ("0.1.0", "the git tag at HEAD")
    done = apply_into(guarded.project, checkout)
    assert done.how == "git commits" and len(done.commits) == 2
    log = git(checkout, "log", "--format=%s|%an|%cn", "main").splitlines()
    assert log[:2] == ["kernel: note|Patch Author|Rocm User", "kernel: guard the include|Patch Author|Rocm User"]
    assert (checkout / KERNEL).read_text() == _patched(guarded.project)
    assert git(checkout, "status", "--porcelain").strip() == ""


def test_a_plain_folder_gets_its_files_rewritten(guarded, tmp_path):
    folder = _pristine_files(guarded.project, tmp_path / "plain")
    (folder / "python" / "sglang" / "_version.py").write_text("__version__ = version = '0.1.0'\n")
    done = apply_into(guarded.project, folder)
    assert done.how == "files rewritten" and done.files == [KERNEL]
    assert (folder / KERNEL).read_text() == _patched(guarded.project)


def test_a_checkout_that_is_not_the_pins_release_is_refused_and_left_alone(guarded, tmp_path):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    (checkout / KERNEL).write_text((checkout / KERNEL).read_text() + "// a local fix\n")
    git(checkout, *USER, "commit", "-qam", "local fix")
    head = git(checkout, "rev-parse", "HEAD")
    git(checkout, "tag", "-f", "v0.1.0")
    with pytest.raises(SglpatchError, match=rf"{checkout / KERNEL}: differs from sglang 0.1.0's pristine file"):
        apply_into(guarded.project, checkout)
    assert git(checkout, "rev-parse", "HEAD") == head and (checkout / KERNEL).read_text().endswith("// a local fix\n")


def test_local_changes_outside_the_files_the_series_changes_are_kept(guarded, tmp_path):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    (checkout / EXAMPLE).write_text("mine\n")  # not touched by the series: fine
    (checkout / KERNEL).write_text((checkout / KERNEL).read_text())  # same bytes: fine
    done = apply_into(guarded.project, checkout)
    assert (checkout / EXAMPLE).read_text() == "mine\n" and len(done.commits) == 2


def _everything_in(checkout) -> dict:
    """What the user would see changed: every work-tree file (tracked or not) byte for byte with
    its mode, the index, HEAD and its branch, every ref, every commit reachable, the reflogs."""
    files = {}
    for path in sorted(checkout.rglob("*")):
        relative = path.relative_to(checkout)
        if relative.parts[0] == ".git" or (path.is_dir() and not path.is_symlink()):
            continue
        files[str(relative)] = (path.lstat().st_mode, path.read_bytes())
    return {
        "files": files,
        "index": git(checkout, "ls-files", "--stage", "-z"),
        "head": git(checkout, "rev-parse", "HEAD") + git(checkout, "rev-parse", "--symbolic-full-name", "HEAD"),
        "refs": git(checkout, "for-each-ref", "--format=%(refname) %(objectname)"),
        "commits": git(checkout, "rev-list", "--all", "--reflog"),
        "reflog": git(checkout, "reflog", "--all", "--format=%H %gs"),
        "status": git(checkout, "status", "--porcelain=v1", "-z", "--untracked-files=all"),
    }


def _edit(checkout):
    (checkout / KERNEL).write_text((checkout / KERNEL).read_text() + "// my local fix\n")


def _stage_then_restore(checkout):
    pristine = (checkout / KERNEL).read_bytes()
    _edit(checkout)
    git(checkout, "add", KERNEL)
    (checkout / KERNEL).write_bytes(pristine)  # the file's bytes are pristine again; the index is not


def _make_executable(checkout):
    (checkout / KERNEL).chmod(0o755)


def _delete(checkout):
    (checkout / KERNEL).unlink()


@pytest.mark.parametrize(
    "change, says",
    [
        (_edit, f"{KERNEL}: differs from sglang 0.1.0's pristine file"),
        (_stage_then_restore, f"local changes in files the series changes (MM {KERNEL} ...); commit or stash them"),
        # git status says " M"; the message strips its leading space.
        (_make_executable, f"local changes in files the series changes (M {KERNEL} ...); commit or stash them"),
        (_delete, f"{KERNEL}: missing (or not a plain file); the checkout is not sglang 0.1.0"),
    ],
    ids=["edited", "staged", "mode", "deleted"],
)
def test_local_changes_in_the_files_the_series_changes_are_refused_and_nothing_changes(guarded, tmp_path, change, says):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    git(checkout, "branch", "experiment")
    (checkout / "python" / "sglang" / "notes.txt").write_bytes(b"untracked, mine\n")
    (checkout / "scratch").mkdir()
    (checkout / "scratch" / "run.sh").write_bytes(b"#!/bin/sh\n")
    (checkout / EXAMPLE).write_text("mine, not staged\n")
    change(checkout)
    before = _everything_in(checkout)
    command = [sys.executable, "-m", "sglpatch", "-q", "--root", str(guarded.root), "apply", "--into", str(checkout)]
    refused = subprocess.run(command, capture_output=True, text=True)
    assert refused.returncode == 2, refused.stdout + refused.stderr
    assert says in refused.stderr and "Traceback" not in refused.stderr, refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    assert _everything_in(checkout) == before


def test_an_unknown_version_is_refused_until_the_pin_is_named(guarded, tmp_path):
    folder = _pristine_files(guarded.project, tmp_path / "plain")
    with pytest.raises(SglpatchError, match="cannot tell its sglang version") as refused:
        apply_into(guarded.project, folder)
    # apply takes the pin as its argument; it has no --pin flag.
    assert f"sglpatch apply --into {folder} VERSION (pinned: 0.1.0, 0.2.0)" in str(refused.value)
    assert "--pin" not in str(refused.value)
    (folder / "python" / "sglang" / "_version.py").write_text("__version__ = version = '9.9.9'\n")
    with pytest.raises(SglpatchError, match=r"sglang 9.9.9 .* is not pinned; pinned: 0.1.0, 0.2.0"):
        apply_into(guarded.project, folder)
    assert apply_into(guarded.project, folder, "0.1.0").files == [KERNEL]


def test_the_cli_applies_into_a_checkout_as_locked_without_the_tests_witnesses(guarded, tmp_path):
    # The CLI runs in its own process, where the test witness that proved the lock does not exist:
    # as locked, no witness is needed.
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    command = [sys.executable, "-m", "sglpatch", "-q", "--root", str(guarded.root), "apply", "--into", str(checkout)]
    done = subprocess.run(command, capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "2 commits added on branch main, the series for sglang 0.1.0:" in done.stdout
    assert "proof: as locked: series.lock's tree" in done.stdout
    assert git(checkout, "rev-parse", "HEAD^{tree}").strip() == _locked(guarded.project)["tree"]


def test_the_cli_refuses_a_pin_the_lock_does_not_hold_until_witnessed(fake_project, tmp_path):
    # Without the test witnesses rocm-guard finds nothing to compile in this small tree, so the
    # witnessed run must say it is unproven.
    files = tree_files("0.1.0")
    guard = files[KERNEL].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    fake_project.set_patches([("0001-guard.patch", format_patch(tmp_path, files, {KERNEL: guard}, "kernel: guard",
                                                                  trailers={"Witness": "rocm-guard"}))])
    folder = _pristine_files(fake_project.project, tmp_path / "plain")
    command = [sys.executable, "-m", "sglpatch", "-q", "--root", str(fake_project.root), "apply", "--into", str(folder), "0.1.0"]
    for extra, says in (([], "no entry for sglang 0.1.0, so nothing is locked to apply; --witness"),
                        (["--allow-unavailable"], "--allow-unavailable with --into goes with --witness"),
                        (["--witness"], "witness-unavailable")):
        refused = subprocess.run([*command, *extra], capture_output=True, text=True)
        assert refused.returncode == 2 and says in refused.stderr, refused.stderr
        assert "Traceback" not in refused.stderr and len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert (folder / KERNEL).read_text() == files[KERNEL]
    done = subprocess.run([*command, "--witness", "--allow-unavailable"], capture_output=True, text=True)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "1 file rewritten in place (not a git checkout), the series for sglang 0.1.0:" in done.stdout
    assert "proof: each patch's witness ran here" in done.stdout and "UNPROVEN" in done.stdout
    assert (folder / KERNEL).read_text() == guard
    assert not fake_project.project.lock_file.exists()  # --into proves, it does not write the lock


def test_apply_into_from_the_lock_on_a_fresh_machine_builds_no_cpu_python_and_runs_no_witness(
    guarded, tmp_path, cache_dir, monkeypatch, test_witnesses
):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    expected = _patched(guarded.project)
    # A fresh machine: no cache (no artifact, no environment, no witness answer) and no build/.
    shutil.rmtree(cache_dir)
    shutil.rmtree(guarded.project.build_dir)
    test_witnesses["guard-text"].runs.clear()
    _no_witness_may_run(monkeypatch)
    done = apply_into(guarded.project, checkout)
    assert test_witnesses["guard-text"].runs == []
    assert not (cache_dir / "pyenv").exists() and sorted(p.name for p in cache_dir.iterdir()) == ["artifacts", "pristine"]
    assert not guarded.project.build_dir.exists()
    assert done.proof.startswith("as locked (series.lock tree ")
    assert locked_proof(_locked(guarded.project)) in done.proof and "0001 applied" in done.proof
    locked = _locked(guarded.project)
    assert git(checkout, "rev-parse", "HEAD^{tree}").strip() == locked["tree"]
    assert (checkout / KERNEL).read_text() == expected and done.files == [KERNEL]


def test_the_lock_entrys_witness_levels_are_named_where_it_records_them():
    patches = [{"name": "0001-guard.patch", "status": "not-needed", "commit": ""},
               {"name": "0002-mtp.patch", "status": "applied", "commit": "abc"}]
    assert locked_proof({"patches": patches}) == (
        "the lock records no witness level, only each patch's outcome: 0001 not-needed; 0002 applied")
    patches[0]["witness"] = {"pristine": "clean [hip-compile gfx942,gfx950]", "patched": "-"}
    patches[1]["witness"] = {"pristine": "bug [cpu]", "patched": "clean [cpu]"}
    assert locked_proof({"patches": patches}) == (
        "proven in the lock by: 0001 not-needed (witness on the pristine tree clean [hip-compile gfx942,gfx950]); "
        "0002 applied (witness on the pristine tree bug [cpu], on the patched tree clean [cpu])")
    patches[1]["witness"] = {"pristine": "bug", "patched": "clean", "level": "include-graph"}
    assert locked_proof({"patches": patches[1:]}) == (
        "proven in the lock by: 0002 applied (witness on the pristine tree bug, on the patched tree clean, at include-graph)")
    patches[1]["witness"] = {"pristine": "bug", "patched": "clean"}
    assert locked_proof({"patches": patches[1:]}).startswith("the lock records the witnesses' answers but no level: ")


def _edit_the_second_patch(project) -> None:
    path = project.root / "patches" / "0002-note.patch"
    path.write_text(path.read_text().replace("+// fused\n", "+// fused, edited here\n"))


def test_a_locally_edited_patch_is_refused_without_witness_and_the_checkout_is_left_alone(guarded, tmp_path, monkeypatch):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    head, kernel = git(checkout, "rev-parse", "HEAD"), (checkout / KERNEL).read_bytes()
    _edit_the_second_patch(guarded.project)
    _no_witness_may_run(monkeypatch)
    with pytest.raises(SglpatchError, match=r"0002-note.patch: gives commit \w{12} on sglang 0\.1\.0, the lock has \w{12} "
                                            r".*refused: --witness proves the series here instead") as refused:
        apply_into(guarded.project, checkout)
    assert "\n" not in str(refused.value)
    assert git(checkout, "rev-parse", "HEAD") == head and (checkout / KERNEL).read_bytes() == kernel
    assert git(checkout, "status", "--porcelain").strip() == ""


def test_witness_proves_an_edited_series_here_and_leaves_the_lock_alone(guarded, tmp_path, test_witnesses):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    lock = guarded.project.lock_file.read_bytes()
    _edit_the_second_patch(guarded.project)
    test_witnesses["guard-text"].runs.clear()
    done = apply_into(guarded.project, checkout, witness=True)
    # The pristine tree's answer is remembered from the lock's run; the edited tree is new.
    assert len(test_witnesses["guard-text"].runs) == 1
    assert done.proof == ("witnessed here (0001 applied, witness bug [text] -> clean [text]; "
                          "0002 applied, witness bug [text] -> clean [text]; differs from series.lock, which is left as it was)")
    assert (checkout / KERNEL).read_text().endswith("// fused, edited here\n") and len(done.commits) == 2
    assert guarded.project.lock_file.read_bytes() == lock


def test_witness_proves_the_locked_series_again_here(guarded, tmp_path, cache_dir, test_witnesses):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    shutil.rmtree(cache_dir)  # a fresh machine: the answers are computed here, not remembered
    test_witnesses["guard-text"].runs.clear()
    done = apply_into(guarded.project, checkout, witness=True)
    assert len(test_witnesses["guard-text"].runs) == 2
    assert done.proof.endswith("; the same as series.lock)")
    assert git(checkout, "rev-parse", "HEAD^{tree}").strip() == _locked(guarded.project)["tree"]


def test_sglpatch_image_takes_the_series_as_locked_and_runs_no_witness(guarded, monkeypatch, capsys):
    from sglpatch import cli
    from sglpatch.rocm import containers, image

    built = []
    monkeypatch.setattr(containers, "connect", lambda url=None: object())
    monkeypatch.setattr(image, "build_image", lambda client, spec, on_log=print: built.append(spec) or "sha256:feed")
    _no_witness_may_run(monkeypatch)
    assert cli.main(["-q", "--root", str(guarded.root), "image", "0.1.0"]) == 0
    out = capsys.readouterr().out
    assert [name for name, _ in built[0].patches] == ["0001-guard.patch", "0002-note.patch"]
    assert built[0].base_image == "lmsysorg/sglang:v0.1.0-rocm720-mi35x" and "; as locked (series.lock tree" in out
    _edit_the_second_patch(guarded.project)
    assert cli.main(["-q", "--root", str(guarded.root), "image", "0.1.0"]) == 2
    assert "the lock has" in capsys.readouterr().err and len(built) == 1



# -- a patch apply merged three-way (git apply --3way from the blobs of another pin's tree) -------

def _pristine_of(project, version):
    from sglpatch.sources import pristine_tree

    return pristine_tree.pristine_from_index(project.pins().select([version])[0])


def _checkout_of(project, version, dest):
    """The user's checkout of ``version``, as in the image: its pristine files, one commit, the tag."""
    pristine = _pristine_of(project, version)
    dest.mkdir(parents=True)
    archive = subprocess.run(["git", "archive", pristine.commit], cwd=pristine.repo, capture_output=True, check=True).stdout
    subprocess.run(["tar", "-x", "-C", str(dest)], input=archive, check=True)
    git(dest, "init", "-q", "-b", "main")
    git(dest, "config", "user.name", "Rocm User")
    git(dest, "config", "user.email", "user@example.com")
    git(dest, "add", "-A")
    git(dest, *USER, "commit", "-q", "-m", f"sglang {version} as in the image")
    git(dest, "tag", f"v{version}")
    return dest


def test_a_patch_locked_as_applied_three_way_goes_into_a_checkout_as_locked(three_way, tmp_path, monkeypatch):
    from sglpatch.apply.into import locked_series

    project = three_way.project
    locked = _locked(project, "0.2.5")
    checkout = _checkout_of(project, "0.2.5", tmp_path / "sglang")
    git(checkout, "config", "user.name", "Rocm User")
    git(checkout, "config", "user.email", "user@example.com")
    head = git(checkout, "rev-parse", "HEAD").strip()
    _no_witness_may_run(monkeypatch)

    # As locked, the three-way step makes the lock's very commit again (plain git apply refuses it).
    with locked_series(project, project.pins().select(["0.2.5"])[0]) as series:
        assert series.commits == [locked["patches"][0]["commit"]] and series.tree == locked["tree"]
    done = apply_into(project, checkout)
    assert done.how == "git commits" and len(done.commits) == 1 and done.proof.startswith("as locked (series.lock tree ")
    assert "0001 applied-three-way" in done.proof
    assert git(checkout, "rev-parse", "HEAD^{tree}").strip() == locked["tree"]
    assert git(checkout, "rev-parse", "HEAD^").strip() == head
    assert (checkout / EXAMPLE).read_text() == THREE_WAY_CHANGED.replace("line 20\n", "patched\n")
    assert git(checkout, "status", "--porcelain").strip() == ""
    assert not (checkout / ".git" / "objects" / "info" / "alternates").exists()


def test_a_first_apply_into_of_a_pin_locked_three_way_imports_no_other_pins_tree(three_way, tmp_path, monkeypatch):
    project = three_way.project
    locked = _locked(project, "0.2.5")
    checkout = _checkout_of(project, "0.2.5", tmp_path / "sglang")
    _no_witness_may_run(monkeypatch)
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(tmp_path / "empty-cache"))

    apply_into(project, checkout)
    assert git(checkout, "rev-parse", "HEAD^{tree}").strip() == locked["tree"]
    others = [pin for pin in project.pins().pins if pin.version != "0.2.5"]
    # The blobs the patch was made on came from the one file it changes, not from a whole tree.
    assert [pristine_tree.cached_pristine(pin) for pin in others] == [None, None]
    lenders = list((tmp_path / "empty-cache" / "release-files").glob("*.git"))
    assert len(lenders) == 1 and git(lenders[0], "ls-tree", "-r", "--name-only", "HEAD").split() == [THREE_WAY_EXAMPLE]


def _applies_plainly(patch: bytes, project, version, dest) -> str:
    """The tree ``patch`` gives on ``version``'s pristine files with plain git apply and with GNU
    patch without fuzz, as the image's apply script runs them; "" where either refuses it."""
    trees = []
    for tool in ("git", "patch"):
        folder = _checkout_of(project, version, dest / tool)
        command = ["git", "apply", "--whitespace=nowarn", "-"] if tool == "git" else ["patch", "-p1", "--forward", "--fuzz=0", "--batch"]
        if subprocess.run(command, cwd=folder, input=patch, capture_output=True).returncode:
            return ""
        git(folder, "add", "-A")
        trees.append(git(folder, "write-tree").strip())
    assert trees[0] == trees[1]
    return trees[0]


def test_the_patched_image_carries_the_pins_own_patch_for_a_patch_applied_three_way(three_way, tmp_path, monkeypatch):
    import io
    import tarfile

    from sglpatch import cli
    from sglpatch.apply.pin_under_test import prepare_pin
    from sglpatch.rocm import containers, image
    from sglpatch.rocm.options import RocmOptions

    project = three_way.project
    locked = _locked(project, "0.2.5")
    rendition = (three_way.root / "patches" / "0001-example.patch").read_bytes()
    assert not _applies_plainly(rendition, project, "0.2.5", tmp_path / "rendition")  # why the image cannot take it

    # The matrix's image (no docker engine needed to make its build context).
    put = prepare_pin(project, "0.2.5")
    with tarfile.open(fileobj=io.BytesIO(image.patched_image(put, RocmOptions(base_image="x")).context())) as tar:
        carried = {m.name: tar.extractfile(m).read() for m in tar.getmembers() if m.name.startswith("sglpatch/patches/")}
    assert list(carried) == ["sglpatch/patches/001_0001-example.patch"]
    patch = carried["sglpatch/patches/001_0001-example.patch"]
    own = subprocess.run(["git", "format-patch", "-1", "--stdout", "--no-signature", locked["patches"][0]["commit"]],
                         cwd=put.tree_path, capture_output=True, check=True).stdout
    assert patch == own and patch != rendition
    assert _applies_plainly(patch, project, "0.2.5", tmp_path / "matrix") == locked["tree"]

    # ``sglpatch image``, from the lock.
    built = []
    monkeypatch.setattr(containers, "connect", lambda url=None: object())
    monkeypatch.setattr(image, "build_image", lambda client, spec, on_log=print: built.append(spec) or "sha256:feed")
    _no_witness_may_run(monkeypatch)
    assert cli.main(["-q", "--root", str(three_way.root), "image", "0.2.5"]) == 0
    assert [name for name, _ in built[0].patches] == ["0001-example.patch"]
    assert built[0].patches[0][1] == own



# -- the checkouts users have, and what a person reads ---------------------------------------------

def _cli_into(root, checkout, *extra, cwd=None, env=None, root_flag=True):
    """``sglpatch apply --into CHECKOUT`` as a user types it, from ``cwd`` (not the project)."""
    command = [sys.executable, "-m", "sglpatch", "-q", *(["--root", str(root)] if root_flag else []),
               "apply", "--into", str(checkout), *extra]
    return subprocess.run(command, capture_output=True, text=True, cwd=cwd, env=env)


def _one_line_refusal(done, says):
    assert done.returncode == 2, done.stdout + done.stderr
    assert says in done.stderr and "Traceback" not in done.stderr, done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_a_linked_worktree_of_a_checkout_gets_the_commits_on_its_branch(guarded, tmp_path):
    # git worktree add: the worktree's .git is a file naming the git directory elsewhere.
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    worktree = tmp_path / "serving"
    git(checkout, "worktree", "add", "-q", "-b", "serving", str(worktree), "v0.1.0")
    assert (worktree / ".git").is_file()
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    done = _cli_into(guarded.root, worktree, cwd=elsewhere)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "on branch serving" in done.stdout
    assert git(worktree, "rev-parse", "HEAD^{tree}").strip() == _locked(guarded.project)["tree"]
    assert git(checkout, "rev-parse", "main").strip() == git(checkout, "rev-parse", "v0.1.0").strip()
    assert git(worktree, "status", "--porcelain").strip() == ""
    assert not [p for p in (checkout / ".git").rglob("sglpatch-into-index*")]


def test_a_submodule_checkout_gets_the_commits(guarded, tmp_path):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    outer = tmp_path / "workspace"
    outer.mkdir()
    git(outer, "init", "-q", "-b", "main")
    git(outer, "-c", "protocol.file.allow=always", "submodule", "add", "-q", str(checkout), "sglang")
    sub = outer / "sglang"
    assert (sub / ".git").is_file()
    git(sub, "config", "user.name", "Rocm User")
    git(sub, "config", "user.email", "user@example.com")
    done = _cli_into(guarded.root, sub, "0.1.0", cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert git(sub, "rev-parse", "HEAD^{tree}").strip() == _locked(guarded.project)["tree"]


def _conflicting_branch(checkout):
    git(checkout, "switch", "-q", "-c", "other")
    (checkout / EXAMPLE).write_text("theirs\n")
    git(checkout, *USER, "commit", "-qam", "theirs")
    git(checkout, "switch", "-q", "main")
    (checkout / EXAMPLE).write_text("ours\n")
    git(checkout, *USER, "commit", "-qam", "ours")


def _in_a_merge(checkout):
    _conflicting_branch(checkout)
    subprocess.run(["git", *USER, "merge", "other"], cwd=checkout, capture_output=True)


def _in_a_rebase(checkout):
    _conflicting_branch(checkout)
    subprocess.run(["git", *USER, "rebase", "other"], cwd=checkout, capture_output=True)


def _in_a_cherry_pick(checkout):
    _conflicting_branch(checkout)
    subprocess.run(["git", *USER, "cherry-pick", "other"], cwd=checkout, capture_output=True)


def _in_an_am(checkout):
    _conflicting_branch(checkout)
    patch = git(checkout, "format-patch", "-1", "--stdout", "other")
    subprocess.run(["git", *USER, "am"], cwd=checkout, input=patch, capture_output=True, text=True)


def _in_a_bisect(checkout):
    _conflicting_branch(checkout)
    git(checkout, "bisect", "start")


@pytest.mark.parametrize(
    "operation, says",
    [(_in_a_merge, "a merge is in progress"), (_in_a_rebase, "a rebase is in progress"),
     (_in_a_cherry_pick, "a cherry-pick is in progress"), (_in_an_am, "'git am' is in progress"),
     (_in_a_bisect, "a bisect is in progress")],
    ids=["merge", "rebase", "cherry-pick", "am", "bisect"],
)
def test_a_checkout_in_the_middle_of_a_git_operation_is_refused_and_nothing_changes(guarded, tmp_path, operation, says):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    operation(checkout)
    before = _everything_in(checkout)
    done = _cli_into(guarded.root, checkout, "0.1.0", cwd=tmp_path)
    _one_line_refusal(done, says)
    assert "nothing was changed" in done.stderr
    assert _everything_in(checkout) == before


def test_a_detached_head_gets_the_commits_and_is_told_they_are_on_no_branch(guarded, tmp_path):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    git(checkout, "switch", "-q", "--detach", "v0.1.0")  # how an image's checkout of a tag stands
    done = _cli_into(guarded.root, checkout, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "detached HEAD: the commits are on no branch; `git switch -c NAME` keeps them" in done.stdout
    assert git(checkout, "rev-parse", "HEAD^{tree}").strip() == _locked(guarded.project)["tree"]
    assert git(checkout, "rev-parse", "main").strip() == git(checkout, "rev-parse", "v0.1.0").strip()


@pytest.mark.parametrize("kind", ["git", "plain"])
def test_a_second_apply_into_says_already_applied_and_changes_nothing(guarded, tmp_path, kind):
    if kind == "git":
        checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    else:
        checkout = _pristine_files(guarded.project, tmp_path / "plain")
        (checkout / "python" / "sglang" / "_version.py").write_text("__version__ = version = '0.1.0'\n")
    first = _cli_into(guarded.root, checkout, cwd=tmp_path)
    assert first.returncode == 0, first.stdout + first.stderr
    before = _everything_in(checkout) if kind == "git" else (checkout / KERNEL).read_bytes()
    again = _cli_into(guarded.root, checkout, cwd=tmp_path)
    assert again.returncode == 0, again.stdout + again.stderr
    assert "already applied: the series for sglang 0.1.0 as locked" in again.stdout
    assert (_everything_in(checkout) if kind == "git" else (checkout / KERNEL).read_bytes()) == before


@pytest.mark.parametrize(
    "flag", [["--update-lock"], ["-j", "2"], ["--jobs=1"], ["--no-witnesses"], ["--discard-local"], ["--out", "x"],
             ["--report", "r.json"], ["--git-url", "file:///nowhere"]],
    ids=lambda flag: flag[0])
def test_flags_that_mean_nothing_with_into_are_refused(guarded, tmp_path, flag):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    before = _everything_in(checkout)
    done = _cli_into(guarded.root, checkout, *flag, cwd=tmp_path)
    named = "-j/--jobs" if flag[0].startswith(("-j", "--jobs")) else flag[0]
    _one_line_refusal(done, f"{named} means nothing with --into")
    assert _everything_in(checkout) == before


def test_verbose_without_into_is_refused_rather_than_ignored(guarded, tmp_path):
    done = subprocess.run([sys.executable, "-m", "sglpatch", "-q", "--root", str(guarded.root), "apply", "-v"],
                          capture_output=True, text=True)
    _one_line_refusal(done, "-v goes with --into")


def test_without_a_git_identity_the_user_is_asked_for_one_as_git_does(guarded, tmp_path):
    import os

    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    git(checkout, "config", "--unset", "user.name")
    git(checkout, "config", "--unset", "user.email")
    home = tmp_path / "home"
    home.mkdir()
    env = {key: value for key, value in os.environ.items()
           if not key.startswith("GIT_") and key not in ("EMAIL", "HOME", "XDG_CONFIG_HOME")}
    env.update(HOME=str(home), GIT_CONFIG_NOSYSTEM="1")
    git_says = subprocess.run(["git", "var", "GIT_COMMITTER_IDENT"], cwd=checkout, env=env, capture_output=True, text=True)
    before = _everything_in(checkout)
    done = _cli_into(guarded.root, checkout, cwd=tmp_path, env=env)
    if git_says.returncode != 0:
        # git itself would refuse to commit: so does apply --into, with git's own request.
        _one_line_refusal(done, 'git config --global user.email "you@example.com"')
        assert "Please tell me who you are" in done.stderr and "nothing was changed" in done.stderr
        assert _everything_in(checkout) == before
    else:
        # git found an identity of its own (this machine's name has a domain): it is the committer.
        assert done.returncode == 0, done.stdout + done.stderr
        assert git(checkout, "log", "-1", "--format=%cn <%ce>").strip() == git_says.stdout.rsplit(">", 1)[0] + ">"
    assert "sglpatch@localhost" not in git(checkout, "log", "--format=%ce")


def test_the_output_says_what_changed_what_proved_it_and_what_to_do_next(guarded, tmp_path):
    checkout = _git_checkout(guarded.project, tmp_path / "sglang")
    head = git(checkout, "rev-parse", "HEAD").strip()
    done = _cli_into(guarded.root, checkout, cwd=tmp_path)
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    commits = git(checkout, "log", "--format=%h %s", "-2", "--abbrev=12").splitlines()[::-1]
    assert f"{checkout}: 2 commits added on branch main, the series for sglang 0.1.0:" == lines[0]
    assert [line.strip() for line in lines[1:3]] == commits
    assert lines[3] == "  patches: 0001 applied; 0002 applied"
    proof = [line for line in lines if line.startswith("proof: ")]
    assert len(proof) == 1 and len(proof[0]) <= 110, proof
    assert "series.lock" in proof[0] and "no witness ran" in proof[0]
    assert f"check: git -C {checkout} log --oneline -3" in done.stdout
    assert f"undo:  git -C {checkout} reset --keep {head[:12]}" in done.stdout
    assert "restart the sglang server" in done.stdout
    assert "Outcome." not in done.stdout and "witness guard-text" not in done.stdout
    # The details the short line leaves out: -v prints what the lock records of the witnesses.
    undone = subprocess.run(["git", "reset", "-q", "--keep", head], cwd=checkout)
    assert undone.returncode == 0 and git(checkout, "rev-parse", "HEAD").strip() == head
    verbose = _cli_into(guarded.root, checkout, "-v", cwd=tmp_path)
    assert verbose.returncode == 0, verbose.stdout + verbose.stderr
    for number, patch in (("0001", "0001-guard.patch"), ("0002", "0002-note.patch")):
        said = next(p for p in _locked(guarded.project)["patches"] if p["name"] == patch)["witness"]
        assert (f"  {number} applied (witness on the pristine tree {said['pristine']}, "
                f"on the patched tree {said['patched']})") in verbose.stdout.splitlines(), verbose.stdout
    git(checkout, "reset", "-q", "--keep", head)
    document = json.loads(_cli_into(guarded.root, checkout, "--json", cwd=tmp_path).stdout)
    assert document["branch"] == "main" and document["head_before"] == head and len(document["commits"]) == 2
    assert document["patches"] == [{"name": "0001-guard.patch", "status": "applied"}, {"name": "0002-note.patch", "status": "applied"}]
    assert locked_proof(_locked(guarded.project)) in document["proof"]
