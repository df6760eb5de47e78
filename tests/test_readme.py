"""The README and the manual drift from the code only by failing this test: every `sglpatch ...`
and `nox ...` command they show parses with the real command line (and names real sessions and
tags), and the cheap ones are run for real here; the heavy ones (apply, the matrix, the bench) are
what the other tests run. The README stays a front door: at most about 10 KB, its two
fresh-machine commands exactly, and every page it links there."""

from __future__ import annotations

import json
import re
import shlex
import subprocess
import sys

import pytest

from conftest import REPO_ROOT

README = (REPO_ROOT / "README.md").read_text()
# The manual's pages (the research notes are a record of findings, not instructions to follow).
MANUAL = {path.relative_to(REPO_ROOT): path.read_text() for path in sorted((REPO_ROOT / "docs").rglob("*.md"))
          if "research" not in path.parts}
TEXT = "\n".join([README, *MANUAL.values()])
FRESH_MACHINE = ["python3 -m pip install nox && nox -s apply", "python3 -m pip install nox && nox -s tests"]
PLACEHOLDERS = {
    "PIN...": "0.5.14", "PIN": "0.5.14", "X": "0.5.14", "VERSION": "0.5.24",
    "PATCH": "0001-amd-guard-cuda-runtime-include-fused-metadata-copy", "CHECKPOINT": "/tmp/checkpoint",
    "CHECKOUT": "/tmp/checkout", "DIR": "/tmp/dir", "FILE": "/tmp/file", "NAME": "glm-5.2-mxfp4-mi355x",
    "TEXT": "a-note", '"..."': "a-note", "D": "5", "E": "nightly", "EVENT": "nightly", "A": "/tmp/a",
    "B": "/tmp/b", "BASE": "an-image", "URL": "unix:///tmp/docker.sock", "REF": "main", "vN": "v4", "vM": "v5",
    "COMMAND": "apply", "~/sglang": "/tmp/sglang",
}
RUN_FOR_REAL = ["sglpatch --version", "sglpatch pins", "sglpatch check", "sglpatch profile", "sglpatch profile --depth 5",
                "sglpatch matrix plan --event nightly", "sglpatch matrix cells", "nox -l", "nox -l -t bench"]


def readme_commands() -> list[str]:
    spans = re.findall(r"`((?:sglpatch|nox) [^`]+)`", TEXT)
    spans += re.findall(r"^    (?:python3 -m pip install nox && )?((?:sglpatch|nox) .+)$", TEXT, re.MULTILINE)
    commands = []
    for span in spans:
        text = " ".join(span.split())
        if "<" in text or "@" in text:
            continue  # an identity, not a command
        commands.append(text)
    return sorted(set(commands))


def concrete(command: str) -> list[list[str]]:
    """The command as argv, with and without its optional [...] parts, placeholders filled in and
    each alternative of an a|b list tried."""
    text = command.replace('"..."', PLACEHOLDERS['"..."']).replace("PIN...", PLACEHOLDERS["PIN..."])
    for name, value in PLACEHOLDERS.items():
        if re.fullmatch(r"[A-Za-z]+", name):
            text = re.sub(rf"(?<![\w-]){name}(?![\w-])", value, text)
    text = text.replace("~/sglang", PLACEHOLDERS["~/sglang"])
    variants = []
    for keep_optional in (False, True):
        shown = re.sub(r"\[([^\]]*)\]", (lambda m: m.group(1)) if keep_optional else "", text)
        alternatives = [[]]
        for word in shlex.split(shown.replace("\\|", "|"), comments=True):  # a shell comment is no argument
            choices = word.split("|") if "|" in word and not word.startswith("-") else [word]
            alternatives = [prefix + [choice] for prefix in alternatives for choice in choices]
        variants += [[word for word in argv if word != "ARGS"] for argv in alternatives]
    unique = []
    for argv in variants:
        if argv not in unique:
            unique.append(argv)
    return unique


def _parse(argv: list[str]) -> str | None:
    """None when sglpatch's parser accepts argv, else what it said."""
    from sglpatch import cli

    try:
        cli.parser().parse_args(argv)
    except SystemExit as exc:
        if exc.code not in (0, None):
            return f"exit {exc.code}"
    return None


def _nox(*args: str) -> str:
    return subprocess.run([sys.executable, "-m", "nox", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                          check=True, timeout=300).stdout


@pytest.fixture(scope="module")
def nox_sessions() -> set[str]:
    """Every session nox lists (selected by default or not: `* name` and `- name` lines)."""
    names = {line[2:].split(" -> ")[0].strip() for line in _nox("-l").splitlines() if line[:2] in ("* ", "- ")}
    return {re.sub(r" \[[^\]]*\]$", "", name) for name in names}  # less the [tags] nox shows


def test_the_readme_and_the_manual_show_commands():
    assert len(readme_commands()) > 40


def test_the_readme_is_a_front_door_of_at_most_about_10_kb():
    assert len(README.encode()) <= 10 * 1024


def test_the_readme_keeps_its_two_fresh_machine_commands_exactly():
    shown = re.findall(r"^    (python3 -m pip install nox && .+)$", README, re.MULTILINE)
    assert shown == FRESH_MACHINE


def test_every_page_the_readme_links_exists():
    links = re.findall(r"\]\(([^)#]+)(?:#[^)]*)?\)", README)
    local = [link for link in links if "://" not in link]
    assert "docs/index.md" in local and len(local) > 10
    assert [link for link in local if not (REPO_ROOT / link).is_file()] == []


@pytest.mark.parametrize("command", [c for c in readme_commands() if c.startswith("sglpatch ")])
def test_every_sglpatch_command_in_the_readme_parses(command, capsys):
    problems = []
    for argv in concrete(command):
        said = _parse(argv[1:])
        if said is not None and argv[-1] in ("run", "accuracy", "tune-moe", "report", "compare", "cells", "job", "plan"):
            said = _parse([*argv[1:], "--help"])  # a verb named in a list: it must exist
        if said is not None:
            problems.append(f"{' '.join(argv)}: {said}")
    capsys.readouterr()
    assert problems == []


@pytest.mark.parametrize("command", [c for c in readme_commands() if c.startswith("nox ")])
def test_every_nox_command_in_the_readme_names_real_sessions(command, nox_sessions):
    for argv in concrete(command):
        words = argv[1:]
        if "-s" in words:
            session = words[words.index("-s") + 1].strip('"')
            assert session in nox_sessions, (command, session)
            if "--" in words and session in ("apply", "rebase", "upstream", "watch"):
                assert _parse([session, *words[words.index("--") + 1:]]) is None, command
        if "-t" in words:
            tag = words[words.index("-t") + 1]
            assert json.loads(_nox("-l", "--json", "-t", tag)), (command, tag)


@pytest.mark.parametrize("command", RUN_FOR_REAL)
def test_the_cheap_readme_commands_run(command):
    shown = {" ".join(argv) for listed in readme_commands() for argv in concrete(listed)}
    assert any(one.startswith(command.split(" -")[0]) for one in shown), command
    argv = command.split()
    prefix = [sys.executable, "-m", "sglpatch"] if argv[0] == "sglpatch" else [sys.executable, "-m", "nox"]
    run = subprocess.run([*prefix, *argv[1:]], cwd=REPO_ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout[-2000:] + run.stderr[-2000:]
