"""The manual (docs/, mkdocs.yml) builds with MkDocs in strict mode, and strict means what CI
needs: a page left out of the nav, a broken link or anchor fails the build. Its command reference
is generated from sglpatch's own parser, so every command and option is in it."""

from __future__ import annotations

import argparse
import re
import shutil
import subprocess
import sys

import pytest

from conftest import REPO_ROOT
from sglpatch import cli
from sglpatch.commands.cli_reference import reference_markdown


def _build(root, site) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=root,
                          capture_output=True, text=True, timeout=300, env={"PATH": "/usr/bin:/bin", "HOME": str(site.parent),
                                                                            "LANG": "C.UTF-8", "NO_MKDOCS_2_WARNING": "1"})


@pytest.fixture
def manual_copy(tmp_path):
    """The manual's sources in a folder of their own, to break on purpose."""
    root = tmp_path / "project"
    root.mkdir()
    shutil.copy(REPO_ROOT / "mkdocs.yml", root / "mkdocs.yml")
    shutil.copytree(REPO_ROOT / "docs", root / "docs")
    return root


def test_the_manual_builds_strictly_with_the_generated_command_reference(tmp_path):
    site = tmp_path / "site"
    built = _build(REPO_ROOT, site)
    assert built.returncode == 0, built.stdout[-3000:] + built.stderr[-3000:]
    reference = (site / "reference" / "index.html").read_text()
    assert "sglpatch apply" in reference and "--no-witnesses" in reference
    assert (site / "glossary" / "index.html").is_file() and (site / "tour" / "index.html").is_file()


def test_a_page_left_out_of_the_nav_fails_the_build(manual_copy, tmp_path):
    (manual_copy / "docs" / "orphan.md").write_text("# A page nobody links\n")
    built = _build(manual_copy, tmp_path / "site")
    assert built.returncode != 0 and "orphan.md" in built.stderr


@pytest.mark.parametrize("link", ["[a page](no-such-page.md)", "[an anchor](glossary.md#no-such-word)"])
def test_a_broken_link_fails_the_build(manual_copy, tmp_path, link):
    page = manual_copy / "docs" / "bench.md"
    page.write_text(page.read_text() + f"\nSee {link}.\n")
    built = _build(manual_copy, tmp_path / "site")
    assert built.returncode != 0 and "bench.md" in built.stderr


def _commands(parser: argparse.ArgumentParser, path: str = "sglpatch"):
    yield path, parser
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, f"{path} {name}")


def test_the_command_reference_has_every_command_and_every_option():
    page = reference_markdown()
    missing = []
    for path, parser in _commands(cli.parser()):
        if f"# {path}\n" not in page:
            missing.append(path)
        missing += [f"{path} {option}" for option in parser._option_string_actions if option not in page]
    assert missing == []


def test_every_link_between_the_manuals_pages_works_unbuilt_as_on_github_too():
    """A link from one page of the manual to another is followed on GitHub (and in a clone) as a
    file of the repository, beside the built site: the page it names must be there, generated
    pages included (docs/reference.md says where the generated reference is)."""
    dead = []
    for page in sorted((REPO_ROOT / "docs").rglob("*.md")):
        for link in re.findall(r"\]\(([^)\s#]+)(?:#[^)]*)?\)", page.read_text()):
            if "://" not in link and not link.startswith("mailto:") and not (page.parent / link).exists():
                dead.append(f"{page.relative_to(REPO_ROOT)}: {link}")
    assert dead == []
