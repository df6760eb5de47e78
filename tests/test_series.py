"""The series format and `sglpatch check`: every defect named with its file and line."""

from __future__ import annotations

import subprocess

import pytest

from conftest import format_patch, tree_files
from sglpatch.apply.apply_pins import apply_series
from sglpatch.plumbing.errors import SglpatchError
from sglpatch.series.check import check_series
from sglpatch.series.patches import load_series, parse_patch_file

EXAMPLE = "python/sglang/srt/layers/example.py"


def _patch(tmp_path, **kwargs):
    files = tree_files("0.1.0")
    new = files[EXAMPLE].replace("line 20\n", "line 20 patched\n")
    return format_patch(tmp_path, files, {EXAMPLE: new}, "example: patch line 20", **kwargs)


def _problems(fake_project):
    project = fake_project.project
    return [str(p) for p in check_series(project.patches_dir, project.pins())]


def _write_one(fake_project, text, name="0001-example.patch"):
    fake_project.set_patches([(name, text)])
    return fake_project.root / "patches" / name


def test_trailers_are_read_as_git_reads_them(fake_project, tmp_path):
    path = _write_one(fake_project, _patch(tmp_path, trailers={"Bug": "https://example.com/1"}))
    patch = parse_patch_file(path)
    assert patch.subject == "example: patch line 20"
    assert patch.trailer("Upstream-Status") == "Pending"
    assert patch.trailer("Bug") == "https://example.com/1"
    assert str(patch.applies_to) == ">=0.1"
    assert load_series(fake_project.root / "patches").version == "1"


def test_a_clean_series_has_no_problems_and_plain_git_am_accepts_it(fake_project, tmp_path):
    path = _write_one(fake_project, _patch(tmp_path))
    assert _problems(fake_project) == []
    work = tmp_path / "am-check"
    work.mkdir()
    for name, text in tree_files("0.1.0").items():
        (work / name).parent.mkdir(parents=True, exist_ok=True)
        (work / name).write_text(text)
    env = {"GIT_CONFIG_GLOBAL": "/dev/null", "HOME": str(tmp_path), "PATH": "/usr/bin:/bin:/usr/local/bin"}
    for args in (["init", "-q"], ["add", "-A"], ["-c", "user.name=a", "-c", "user.email=a@b", "commit", "-qm", "base"]):
        subprocess.run(["git", *args], cwd=work, check=True, env=env)
    subprocess.run(["git", "-c", "user.name=a", "-c", "user.email=a@b", "am", "-q", str(path)], cwd=work, check=True, env=env)


@pytest.mark.parametrize(
    "trailers, expected",
    [
        ({"Upstream-Status": "Sent upstream"}, "Upstream-Status 'Sent upstream' is not one of"),
        ({"Upstream-Status": "Submitted"}, "Upstream-Status 'Submitted' is not one of"),
        ({"Applies-To": "newest"}, "Applies-To 'newest' is not a PEP 440 specifier"),
        ({"Applies-To": ">=9.0"}, "Applies-To >=9.0 matches no pin"),
    ],
)
def test_bad_metadata_is_named_with_file_and_line(fake_project, tmp_path, trailers, expected):
    path = _write_one(fake_project, _patch(tmp_path, trailers=trailers))
    problems = _problems(fake_project)
    assert any(p.startswith(f"{path}:") and expected in p for p in problems), problems
    line = int(next(p for p in problems if expected in p).split(":")[1])
    key = next(iter(trailers))
    assert path.read_text().splitlines()[line - 1].startswith(f"{key}:")


def test_unknown_witness_is_reported(fake_project, tmp_path):
    path = _write_one(fake_project, _patch(tmp_path, trailers={"Witness": "no-such-check"}))
    problems = _problems(fake_project)
    assert any(p.startswith(f"{path}:") and "unknown witness 'no-such-check'" in p for p in problems), problems


def test_missing_required_trailer_is_reported(fake_project, tmp_path):
    text = _patch(tmp_path).replace("Witness: fixture-unwitnessed\n", "")
    _write_one(fake_project, text)
    assert any("missing the Witness trailer" in p for p in _problems(fake_project))


def test_wrong_hunk_count_is_reported_at_its_hunk_header(fake_project, tmp_path):
    text = _patch(tmp_path)
    header = next(line for line in text.splitlines() if line.startswith("@@"))
    broken = text.replace(header, header.replace("+17,7", "+17,9"))
    path = _write_one(fake_project, broken)
    problems = _problems(fake_project)
    line = broken.splitlines().index(header.replace("+17,7", "+17,9")) + 1
    assert f"{path}:{line}: hunk 1 of {EXAMPLE}" in "\n".join(problems), problems


def test_hunk_longer_than_its_header_is_reported(fake_project, tmp_path):
    text = _patch(tmp_path)
    header = next(line for line in text.splitlines() if line.startswith("@@"))
    broken = text.replace(header, header.replace("-17,7 +17,7", "-17,5 +17,5"))
    _write_one(fake_project, broken)
    assert any("hunk 1 of" in p for p in _problems(fake_project))


def test_truncated_patch_is_reported(fake_project, tmp_path):
    text = _patch(tmp_path)
    cut = text[: text.index("@@")]
    path = _write_one(fake_project, cut)
    assert any(p.startswith(f"{path}:") and "no hunks" in p for p in _problems(fake_project))


def test_garbled_patch_is_reported(fake_project, tmp_path):
    path = _write_one(fake_project, "this is not a patch\n")
    assert any(p.startswith(f"{path}:1:") and "not a git format-patch" in p for p in _problems(fake_project))


@pytest.mark.parametrize(
    "old, new, expected",
    [
        (f"a/{EXAMPLE}", "a/../../etc/passwd", "paths with '..' are refused"),
        (f"b/{EXAMPLE}", "/etc/passwd", "absolute paths are refused"),
    ],
)
def test_unsafe_paths_are_refused_by_check_and_apply(fake_project, tmp_path, old, new, expected):
    text = _patch(tmp_path).replace(old, new)
    _write_one(fake_project, text)
    assert any(expected in p for p in _problems(fake_project))
    report = apply_series(fake_project.project)
    assert not report.ok and all(expected in r.error for r in report.results)
    assert not (fake_project.root / "build" / "trees" / "0.1.0" / "python").exists()


def test_binary_patch_is_refused(fake_project, tmp_path):
    files = tree_files("0.1.0")
    repo_text = format_patch(tmp_path, files, {"python/sglang/blob.bin": "placeholder"}, "add a blob")
    binary = repo_text.split("diff --git")[0] + (
        "diff --git a/python/sglang/blob.bin b/python/sglang/blob.bin\n"
        "new file mode 100644\nindex 0000000..1111111\nGIT binary patch\nliteral 3\nKcmZQzWMT#Y01f~L\n\nliteral 0\nHcmV?d00001\n\n-- \n2.39.5\n"
    )
    _write_one(fake_project, binary)
    assert any("binary patch" in p for p in _problems(fake_project))
    report = apply_series(fake_project.project)
    assert not report.ok and "binary patch" in report.results[0].error


def test_patch_through_a_symlink_in_the_tree_is_refused(fake_project, tmp_path):
    import tarfile

    from conftest import BASE_FILES, make_sdist, pin_entry

    link = tarfile.TarInfo("sglang-0.3.0/sglang/linked")
    link.type, link.linkname = tarfile.SYMTYPE, "srt"
    artifact = make_sdist(fake_project.index, "0.3.0", BASE_FILES, extra=[link])
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.3.0", artifact))
    files = {**tree_files("0.1.0"), "python/sglang/linked/layers/example.py": tree_files("0.1.0")[EXAMPLE]}
    text = format_patch(
        tmp_path, files, {"python/sglang/linked/layers/example.py": files[EXAMPLE].replace("line 3\n", "x\n")}, "via link"
    )
    _write_one(fake_project, text)
    report = apply_series(fake_project.project, ["0.3.0"])
    assert not report.ok and "goes through the symbolic link python/sglang/linked" in report.results[0].error


def test_overlapping_renditions_and_stray_files_are_reported(fake_project, tmp_path):
    fake_project.set_patches(
        [("0001-example.patch", _patch(tmp_path))],
        renditions={"0001-example": [("new.patch", _patch(tmp_path, trailers={"Applies-To": ">=0.2"}))]},
    )
    (fake_project.root / "patches" / "9999-stray.patch").write_text(_patch(tmp_path))
    problems = "\n".join(_problems(fake_project))
    assert "both claim pin 0.2.0" in problems
    assert "9999-stray.patch:1: not listed in series" in problems


def test_series_entry_that_does_not_exist_is_reported_at_its_line(fake_project):
    (fake_project.root / "patches" / "series").write_text("# comment\n\n0001-missing.patch\n")
    assert any(p.endswith("series:3: 0001-missing.patch does not exist") for p in _problems(fake_project))
    with pytest.raises(SglpatchError, match="series:3: 0001-missing.patch does not exist"):
        load_series(fake_project.root / "patches")


def test_cli_check_exits_non_zero_and_prints_each_problem(fake_project, tmp_path):
    _write_one(fake_project, _patch(tmp_path, trailers={"Upstream-Status": "Done", "Witness": "rocm-guard"}))
    run = subprocess.run(
        ["python", "-m", "sglpatch", "--root", str(fake_project.root), "check"], capture_output=True, text=True
    )
    assert run.returncode == 1
    assert "Upstream-Status 'Done' is not one of" in run.stdout and "1 problem(s)" in run.stdout


def _two_file_patch(tmp_path, second=EXAMPLE):
    files = {**tree_files("0.1.0"), "python/sglang/other.py": "a\nb\nc\n"}
    edits = {EXAMPLE: files[EXAMPLE].replace("line 20\n", "line 20 patched\n"), "python/sglang/other.py": "a\nB\nc\n"}
    return format_patch(tmp_path, files, edits, "two files")


def _refused_by_check_and_by_apply_even_with_update_lock(fake_project, text, expected):
    path = _write_one(fake_project, text)
    problems = _problems(fake_project)
    assert any(p.startswith(f"{path}:") and expected in p for p in problems), problems
    report = apply_series(fake_project.project, update_lock=True, run_witnesses=False)
    assert not report.ok and all(expected in r.error for r in report.results), report.to_json()
    assert not (fake_project.root / "build" / "trees" / "0.1.0" / "python").exists()
    assert not (fake_project.root / "series.lock").exists()


@pytest.mark.parametrize(
    "new_path, expected",
    [
        (".git/hooks/post-checkout", "paths into .git are refused"),
        ("python/.GIT/config", "paths into .git are refused"),
        ("python/.git./config", "paths into .git are refused"),
        ("python/git~1/config", "paths into .git are refused"),
        ("python//sglang/x.py", "empty path components are refused"),
        ("python/./sglang/x.py", "paths with '.' components are refused"),
        ("python\\\\sglang\\\\x.py", "backslashes and control characters are refused"),
        ("python/sglang/x.py:stream", "':' is refused in paths"),
    ],
)
def test_paths_git_itself_would_reject_are_refused(fake_project, tmp_path, new_path, expected):
    text = _patch(tmp_path).replace(f"b/{EXAMPLE}", f"b/{new_path}").replace(f"a/{EXAMPLE}", f"a/{new_path}")
    _refused_by_check_and_by_apply_even_with_update_lock(fake_project, text, expected)


def test_a_submodule_in_a_patch_is_refused(fake_project, tmp_path):
    text = _patch(tmp_path)
    head, rest = text.split("diff --git", 1)
    gitlink = (
        "diff --git a/python/vendor b/python/vendor\nnew file mode 160000\nindex 0000000..1234567\n"
        "--- /dev/null\n+++ b/python/vendor\n@@ -0,0 +1 @@\n+Subproject commit 1234567890123456789012345678901234567890\n"
    )
    _refused_by_check_and_by_apply_even_with_update_lock(fake_project, head + gitlink + "diff --git" + rest, "a submodule")


def test_content_that_is_not_text_is_refused(fake_project, tmp_path):
    text = _patch(tmp_path).replace("+line 20 patched", "+line 20 \x00patched")
    _refused_by_check_and_by_apply_even_with_update_lock(fake_project, text, "content that is not text")


@pytest.mark.parametrize(
    "char, name",
    [
        ("\u202e", "RIGHT-TO-LEFT OVERRIDE"),
        ("\u2066", "LEFT-TO-RIGHT ISOLATE"),
        ("\u2069", "POP DIRECTIONAL ISOLATE"),
        ("\u200f", "RIGHT-TO-LEFT MARK"),
        ("\u061c", "ARABIC LETTER MARK"),
        ("\u200b", "ZERO WIDTH SPACE"),
        ("\u2060", "WORD JOINER"),
        ("\ufeff", "ZERO WIDTH NO-BREAK SPACE"),
    ],
)
def test_an_invisible_character_in_an_added_line_is_refused_at_its_line_with_its_code_point(
    fake_project, tmp_path, char, name
):
    files = tree_files("0.1.0")
    added = f"line 20 {char}patched"
    text = format_patch(tmp_path, files, {EXAMPLE: files[EXAMPLE].replace("line 20\n", added + "\n")}, "example: patch line 20")
    expected = f"{EXAMPLE}:20: added line holds U+{ord(char):04X} {name}"
    _refused_by_check_and_by_apply_even_with_update_lock(fake_project, text, expected)
    path = fake_project.root / "patches" / "0001-example.patch"
    [problem] = _problems(fake_project)
    assert problem.startswith(f"{path}:{text.split(chr(10)).index('+' + added) + 1}: {expected}"), problem
    assert "\n" not in problem


def test_invisible_characters_upstream_already_has_are_not_the_patch_s_to_answer_for(fake_project, tmp_path):
    files = {**tree_files("0.1.0"), "python/sglang/rtl.py": "a\nb \u202e c\nd\ne\n"}
    # The patch keeps one such line as context and removes it elsewhere; it adds none.
    edits = {"python/sglang/rtl.py": "a\nb \u202e c\nd\n", EXAMPLE: files[EXAMPLE].replace("line 20\n", "line 20 patched\n")}
    _write_one(fake_project, format_patch(tmp_path, files, edits, "keeps a context line"))
    assert _problems(fake_project) == []
    removing = {"python/sglang/rtl.py": "a\nd\ne\n"}
    _write_one(fake_project, format_patch(tmp_path, files, removing, "removes it"))
    assert _problems(fake_project) == []


def test_a_byte_order_mark_opening_a_new_file_is_not_refused(fake_project, tmp_path):
    text = format_patch(tmp_path, tree_files("0.1.0"), {"python/sglang/new.py": "\ufeffx = 1\ny = 2\n"}, "bom")
    _write_one(fake_project, text)
    assert _problems(fake_project) == []


@pytest.mark.parametrize(
    "trailers, expected",
    [
        ({"Witness": "no-such-check"}, "unknown witness 'no-such-check'"),
        ({"Upstream-Status": "Done"}, "Upstream-Status 'Done' is not one of"),
        ({"Origin": "see shared/BRIEF.md"}, "Origin cites shared/BRIEF.md, which is not in this repository"),
    ],
)
def test_apply_with_update_lock_and_no_witnesses_refuses_the_trailers_check_refuses(fake_project, tmp_path, trailers, expected):
    _refused_by_check_and_by_apply_even_with_update_lock(fake_project, _patch(tmp_path, trailers=trailers), expected)


def test_cli_apply_update_lock_no_witnesses_refuses_an_unknown_witness_naming_the_patch(fake_project, tmp_path):
    path = _write_one(fake_project, _patch(tmp_path, trailers={"Witness": "no-such-check"}))
    run = subprocess.run(
        ["python", "-m", "sglpatch", "--root", str(fake_project.root), "apply", "--update-lock", "--no-witnesses", "0.1.0"],
        capture_output=True,
        text=True,
    )
    assert run.returncode != 0 and "Traceback" not in run.stderr, run.stderr
    assert f"{path}:" in run.stdout + run.stderr and "unknown witness 'no-such-check'" in run.stdout + run.stderr
    assert not (fake_project.root / "series.lock").exists()


def test_the_same_file_twice_in_one_patch_is_refused(fake_project, tmp_path):
    text = _patch(tmp_path)
    diff = text[text.index("diff --git") : text.index("\n-- \n")]
    doubled = text.replace(diff, diff + "\n" + diff.replace("line 20 patched", "line 20 again"))
    _refused_by_check_and_by_apply_even_with_update_lock(fake_project, doubled, "is changed twice in one patch")


def test_a_repeated_hunk_is_refused(fake_project, tmp_path):
    text = _patch(tmp_path)
    hunk = text[text.index("@@") : text.index("\n-- \n")]
    _refused_by_check_and_by_apply_even_with_update_lock(fake_project, text.replace(hunk, hunk + "\n" + hunk), "overlaps")


def test_a_file_holding_two_patches_is_refused(fake_project, tmp_path):
    one = _patch(tmp_path)
    two = format_patch(tmp_path, tree_files("0.1.0"), {"python/sglang/new.py": "x\n"}, "second")
    _refused_by_check_and_by_apply_even_with_update_lock(fake_project, one + two, "a second patch starts here")


def test_real_git_refuses_what_check_calls_a_path_git_rejects(tmp_path):
    from conftest import git

    repo = tmp_path / "repo"
    repo.mkdir()
    git(repo, "init", "-q")
    patch = "diff --git a/.git/x b/.git/x\nnew file mode 100644\n--- /dev/null\n+++ b/.git/x\n@@ -0,0 +1 @@\n+x\n"
    run = subprocess.run(["git", "apply", "--check", "-"], cwd=repo, input=patch, capture_output=True, text=True)
    assert run.returncode != 0 and "invalid path" in run.stderr


def test_an_origin_citing_a_file_outside_the_repository_is_reported(fake_project, tmp_path):
    (fake_project.root / "docs").mkdir()
    (fake_project.root / "docs" / "notes.md").write_text("notes\n")
    cited = _patch(tmp_path, trailers={"Origin": "sglpatch; from the bring-up (shared/BRIEF.md, fix 2)"})
    path = _write_one(fake_project, cited)
    assert [p for p in _problems(fake_project) if "Origin cites" in p] == [
        f"{path}:{cited.splitlines().index('Origin: sglpatch; from the bring-up (shared/BRIEF.md, fix 2)') + 1}: "
        "Origin cites shared/BRIEF.md, which is not in this repository: say in words where the patch comes from"
    ]
    in_repo = _patch(tmp_path, trailers={"Origin": "sglpatch; the code reading is docs/notes.md, see https://example.com/a/b.html"})
    _write_one(fake_project, in_repo)
    assert not [p for p in _problems(fake_project) if "Origin cites" in p]


def test_the_shipped_series_has_no_problems():
    from conftest import REPO_ROOT
    from sglpatch.sources.pins import load_pins

    assert [str(p) for p in check_series(REPO_ROOT / "patches", load_pins(REPO_ROOT / "upstream" / "pins.toml"))] == []
