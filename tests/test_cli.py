"""The command line as its users expect it: --version, --json, plain help, exit codes that tell
the cases apart (sglpatch/exitcodes.py)."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys

import pytest

from conftest import REPO_ROOT, format_patch, tree_files
from sglpatch import __version__, exitcodes

KERNEL = "python/sglang/jit_kernel/csrc/kernel.cuh"
EXAMPLE = "python/sglang/srt/layers/example.py"


def sglpatch(root, *args):
    return subprocess.run([sys.executable, "-m", "sglpatch", "--root", str(root), *args], capture_output=True, text=True,
                          timeout=600)


def test_version_and_plain_help():
    run = subprocess.run([sys.executable, "-m", "sglpatch", "--version"], capture_output=True, text=True)
    assert run.returncode == 0 and run.stdout.strip() == f"sglpatch {__version__}"
    helped = subprocess.run([sys.executable, "-m", "sglpatch", "--help"], capture_output=True, text=True)
    assert helped.returncode == 0 and "``" not in helped.stdout and "exit status:" in helped.stdout
    for code in range(5):
        assert f"  {code}  " in helped.stdout


def _patches(fake_project, tmp_path, line=20, text="line 20 patched\n"):
    files = tree_files("0.1.0")
    patch = format_patch(tmp_path, files, {EXAMPLE: files[EXAMPLE].replace(f"line {line}\n", text)}, "example: patch",
                         trailers={"Witness": "rocm-guard"})
    fake_project.set_patches([("0001-example.patch", patch)])


@pytest.mark.parametrize("args", [["pins"], ["check"], ["apply", "--no-witnesses"], ["witness", "--allow-unavailable"],
                                  ["matrix", "cells"], ["matrix", "plan", "--event", "nightly"]])
def test_json_prints_one_document_on_stdout_and_the_text_on_stderr(fake_project, tmp_path, args):
    _patches(fake_project, tmp_path)
    run = sglpatch(fake_project.root, *args, "--json")
    assert run.returncode == 0, run.stdout + run.stderr
    document = json.loads(run.stdout)  # the whole of stdout is one JSON document
    assert document is not None and run.stderr.strip()


def test_exit_status_1_when_a_patch_fails(fake_project, tmp_path):
    files = tree_files("0.1.0")
    patch = format_patch(tmp_path, {**files, EXAMPLE: "other\n"}, {EXAMPLE: "changed\n"}, "does not apply")
    fake_project.set_patches([("0001-conflict.patch", patch)])
    assert sglpatch(fake_project.root, "apply", "--no-witnesses").returncode == exitcodes.FAILED


def test_exit_status_2_for_usage_and_bad_input(fake_project):
    assert sglpatch(fake_project.root, "apply", "--no-such-flag").returncode == exitcodes.USAGE
    assert sglpatch(fake_project.root, "apply", "9.9.9").returncode == exitcodes.USAGE


def test_exit_status_3_when_the_result_differs_from_the_lock(fake_project, tmp_path):
    _patches(fake_project, tmp_path)
    assert sglpatch(fake_project.root, "apply", "--no-witnesses").returncode == exitcodes.OK
    _patches(fake_project, tmp_path, text="line 20 patched differently\n")
    run = sglpatch(fake_project.root, "apply", "--no-witnesses")
    assert run.returncode == exitcodes.LOCK_MISMATCH and "--update-lock" in run.stdout


def test_exit_status_4_when_a_witness_cannot_run_here(fake_project, tmp_path):
    _patches(fake_project, tmp_path)  # rocm-guard finds no kernel to compile in this small tree
    run = sglpatch(fake_project.root, "apply")
    assert run.returncode == exitcodes.UNAVAILABLE and "witness-unavailable" in run.stdout


@pytest.mark.parametrize("outcome, allow, status", [("partial", False, exitcodes.UNAVAILABLE), ("skipped", False, exitcodes.UNAVAILABLE),
                                                    ("partial", True, exitcodes.OK), ("failed", True, exitcodes.FAILED),
                                                    ("passed", False, exitcodes.OK)])
def test_a_cpu_cell_that_could_not_run_every_part_fails_unless_allowed(fake_project, monkeypatch, capsys, outcome, allow, status):
    from sglpatch import cli
    from sglpatch.matrix import cpu
    from sglpatch.matrix.records import CellRecord, Part

    record = CellRecord("cpu", "build", "0.1.0", None, "1", "h", outcome, reason="the HIP toolchain is not installed",
                        parts=[Part("HIP build", "skipped" if outcome in ("partial", "skipped") else outcome, "why")])
    monkeypatch.setattr(cpu, "run_cpu_cell", lambda project, cell, use_cache=True: record)
    argv = ["--root", str(fake_project.root), "matrix", "run", "build", "0.1.0", *(["--allow-unavailable"] if allow else [])]
    assert cli.main(argv) == status
    if status == exitcodes.UNAVAILABLE:
        assert "a CPU cell must run every part" in capsys.readouterr().out


@pytest.mark.parametrize("outcomes, allow, status", [(["passed", "passed"], False, exitcodes.OK),
                                                     (["passed", "partial"], False, exitcodes.UNAVAILABLE),
                                                     (["passed", "partial"], True, exitcodes.OK),
                                                     (["failed", "partial"], True, exitcodes.FAILED)])
def test_run_all_sums_up_the_cpu_tier_and_exits_like_its_cells(fake_project, monkeypatch, capsys, outcomes, allow, status):
    from sglpatch import cli
    from sglpatch.matrix import cpu
    from sglpatch.matrix.records import CellRecord

    records = [CellRecord("cpu", "build", pin, None, "1", "h", outcome) for pin, outcome in zip(("0.1.0", "0.2.0"), outcomes)]
    asked = []
    monkeypatch.setattr(cpu, "run_cpu_tier", lambda project, pins, use_cache=True, jobs=1: asked.append((pins, jobs)) or records)
    argv = ["--root", str(fake_project.root), "matrix", "run-all", "--jobs", "2", *(["--allow-unavailable"] if allow else [])]
    assert cli.main(argv) == status
    assert asked == [([], 2)]
    assert "2 CPU cells: " in capsys.readouterr().out


def _python_m_sglpatch(*args):
    return subprocess.run([sys.executable, "-m", "sglpatch", *args], capture_output=True, text=True, timeout=120)


def test_sglpatch_alone_lists_every_verb_with_its_line():
    from sglpatch.cli import VERBS

    run = _python_m_sglpatch()
    assert run.returncode == exitcodes.USAGE
    for name, line in VERBS.items():
        assert f"  {name} " in run.stderr and line in run.stderr, name
    assert "Traceback" not in run.stderr


@pytest.mark.parametrize("typed, meant", [("aply", "apply"), ("upstrem", "upstream"), ("pin", "pins"), ("rebse", "rebase")])
def test_a_mistyped_verb_is_told_the_nearest_one(typed, meant):
    run = _python_m_sglpatch(typed, "0.5.14")
    assert run.returncode == exitcodes.USAGE
    assert run.stderr.strip() == f"sglpatch: error: '{typed}' is not a command; did you mean '{meant}'?"


@pytest.mark.parametrize("argv, said", [(["matrix", "rn", "build", "0.5.14"], "'rn' is not an action of matrix; did you mean 'run'?"),
                                        (["patch", "refesh", "0.5.23"], "'refesh' is not an action of patch; did you mean 'refresh'?"),
                                        (["series", "frob"], "'frob' is not an action of series; its actions: bump, diff")])
def test_a_mistyped_action_is_told_the_nearest_one(argv, said):
    run = _python_m_sglpatch(*argv)
    assert run.returncode == exitcodes.USAGE
    assert run.stderr.strip() == f"sglpatch {argv[0]}: error: {said}"


def test_a_malformed_option_of_sglpatchs_own_is_said_once():
    run = _python_m_sglpatch("--root")
    assert run.returncode == exitcodes.USAGE
    assert run.stderr.count("error:") == 1 and "--root: expected one argument" in run.stderr


def test_a_word_near_no_verb_gets_the_list_of_verbs():
    run = _python_m_sglpatch("frobnicate")
    assert run.returncode == exitcodes.USAGE and "'frobnicate' is not a command." in run.stderr
    assert "  apply " in run.stderr and "did you mean" not in run.stderr


def test_each_verbs_line_is_the_one_its_own_parser_registers():
    """The list printed without importing the verbs says what each verb, imported, says of itself."""
    from sglpatch import cli

    sub = next(action for action in cli.parser()._actions if isinstance(action, argparse._SubParsersAction))
    registered = {choice.dest: choice.help for choice in sub._choices_actions}
    assert registered == cli.VERBS


MODULES_AFTER = """
import json, sys
from sglpatch.cli import main
try:
    main(sys.argv[1:])
finally:
    print(json.dumps(sorted(name for name in sys.modules if name.startswith("sglpatch"))), file=sys.stderr)
"""


def _sglpatch_modules_imported(*args) -> set[str]:
    """The sglpatch modules loaded once ``sglpatch ARGS`` is done."""
    run = subprocess.run([sys.executable, "-c", MODULES_AFTER, *args], capture_output=True, text=True, timeout=120,
                         cwd=REPO_ROOT)
    assert run.returncode == 0, run.stderr[-2000:]
    return set(json.loads(run.stderr.splitlines()[-1]))


def test_help_imports_no_verb_and_pins_only_its_own():
    """`sglpatch --help` and `sglpatch pins` start fast because they import no verb but their own
    (benchmarks/bench_startup.py times them)."""
    helped = _sglpatch_modules_imported("--help")
    assert not {module for module in helped if module.startswith("sglpatch.commands.")}, helped
    pins = _sglpatch_modules_imported("pins")
    assert {module for module in pins if module.startswith("sglpatch.commands.")} == {"sglpatch.commands.pins"}
    heavy = {"sglpatch.apply.one_pin", "sglpatch.apply.apply_pins", "sglpatch.sources.pristine_tree", "sglpatch.witnesses.cpu_envs", "sglpatch.plumbing.cache"}
    assert not (helped | pins) & heavy, (helped | pins) & heavy


def test_a_verbs_own_help_still_lists_its_options():
    run = _python_m_sglpatch("apply", "--help")
    assert run.returncode == 0 and "--no-witnesses" in run.stdout and "--into CHECKOUT" in run.stdout


def test_pins_has_a_heading_over_each_column_in_the_glossarys_words(capsys):
    from sglpatch import cli

    assert cli.main(["--root", str(REPO_ROOT), "pins"]) == 0
    heading, *rows = capsys.readouterr().out.splitlines()
    assert heading.split() == ["version", "tag", "tag", "commit", "checked", "artifact", "ROCm", "image"]
    assert len(rows) >= 18 and all(row.split()[3] in ("verified", "unverified") or row.split()[2] == "(unknown)" for row in rows)
    # Each column starts where its heading does.
    first = rows[0]
    for word in ("tag commit", "checked", "artifact", "ROCm image"):
        assert first[heading.index(word) - 1] == " " and first[heading.index(word)] != " ", (word, heading, first)
    glossary = (REPO_ROOT / "docs" / "glossary.md").read_text()
    assert "## tag commit" in glossary and all(f"`{word}`" in glossary for word in ("verified", "unverified", "(unknown)"))
