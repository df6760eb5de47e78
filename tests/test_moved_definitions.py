"""The cascade's last merge tool: a hunk whose function the release moved to another file follows it
there, found by qualified name and signature; a changed signature or a definition that is gone is
no proposal, with the reason."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from conftest import BASE_FILES, TextWitness, format_patch, make_wheel, pin_entry, tree_files
from sglpatch.apply.checkouts import checkout_commit
from sglpatch.plumbing.gitcmd import git_out, run_git
from sglpatch.rebase import moved_definitions
from sglpatch.rebase.merge_tools import FIXED_COMMIT_ENV, wiggle_available
from sglpatch.rebase.onto import rebase_onto
from sglpatch.rebase.trial import Trial
from sglpatch.witnesses import registry

SETTINGS = "python/sglang/srt/server_args.py"
DEFAULTS = "python/sglang/srt/arg_groups/defaults.py"

SERVER_ARGS = '''import logging

logger = logging.getLogger(__name__)


class ServerArgs:
    kv_cache_dtype: str = "auto"
    enable_fusion: bool = False

    def __post_init__(self):
        self.resolve()

    def resolve(self):
        self.kv_cache_dtype = choose_kv_cache_dtype(self, "gfx942")


def choose_kv_cache_dtype(args, arch):
    """The KV cache dtype a node gets by default."""
    if args.kv_cache_dtype != "auto":
        return args.kv_cache_dtype
    return "bfloat16"


def other():
    return 1
'''
FIXED = SERVER_ARGS.replace(
    '    if args.kv_cache_dtype != "auto":\n        return args.kv_cache_dtype\n    return "bfloat16"\n',
    '    if args.kv_cache_dtype != "auto":\n        return args.kv_cache_dtype\n    if arch == "gfx950":\n'
    '        return "fp8_e4m3"\n    return "bfloat16"\n',
)
# The release moved the function into a module of its own, below other code, and rewrote the rest.
MOVED_TO = '''"""Defaults that depend on the node."""

import os

FALLBACK = os.environ.get("KV_FALLBACK", "bfloat16")


def choose_attention_backend(args):
    return "triton"


def choose_kv_cache_dtype(args, arch):
    """The KV cache dtype a node gets by default."""
    if args.kv_cache_dtype != "auto":
        return args.kv_cache_dtype
    return "bfloat16"
'''
SERVER_ARGS_RELEASE = '''import logging

from sglang.srt.arg_groups.defaults import choose_attention_backend, choose_kv_cache_dtype

logger = logging.getLogger(__name__)


class ServerArgs:
    kv_cache_dtype: str = "auto"
    attention_backend: str = "auto"

    def __post_init__(self):
        self.attention_backend = choose_attention_backend(self)
        self.kv_cache_dtype = choose_kv_cache_dtype(self, "gfx942")


def other():
    return 2
'''


def _commit(repo, files: dict[str, str], parent: str | None = None) -> str:
    env = {"GIT_INDEX_FILE": str(repo / ".git" / "index-test")}
    run_git(["read-tree", "--empty"], repo, env=env)
    for path, text in files.items():
        blob = git_out(["hash-object", "-w", "--stdin"], repo, input=text.encode())
        run_git(["update-index", "--add", "--cacheinfo", f"100644,{blob},{path}"], repo, env=env)
    tree = git_out(["write-tree"], repo, env=env)
    return git_out(["commit-tree", tree, *(["-p", parent] if parent else []), "-m", "tree"], repo, env=FIXED_COMMIT_ENV)


@pytest.fixture
def repo(tmp_path):
    path = tmp_path / "repo"
    run_git(["init", "--quiet", str(path)], tmp_path)
    return path


def _rendition(repo, base_files, patched_files):
    base = _commit(repo, base_files)
    patched = _commit(repo, patched_files, base)
    return base, run_git(["diff", "--full-index", base, patched], repo).stdout.decode()


def test_definitions_are_found_by_qualified_name_with_their_span_and_parameters():
    found = {d.qualname: d for d in moved_definitions.definitions(SERVER_ARGS)}
    assert set(found) == {"ServerArgs", "ServerArgs.__post_init__", "ServerArgs.resolve", "choose_kv_cache_dtype", "other"}
    assert found["choose_kv_cache_dtype"].params == ("args", "arch")
    assert (found["choose_kv_cache_dtype"].start, found["choose_kv_cache_dtype"].end) == (17, 21)
    assert found["ServerArgs.resolve"].kind == "def" and found["ServerArgs"].kind == "class"
    assert moved_definitions.definitions("this is ( no python") == []


def test_a_hunk_whose_function_moved_to_another_file_is_applied_where_the_release_defines_it(repo, tmp_path):
    base, diff = _rendition(repo, {SETTINGS: SERVER_ARGS}, {SETTINGS: FIXED})
    onto = _commit(repo, {SETTINGS: SERVER_ARGS_RELEASE, DEFAULTS: MOVED_TO})
    # The hunk's own context is gone from server_args.py: nothing applies there.
    assert run_git(["apply", "--check", "-"], repo, input=diff.encode(), check=False).returncode != 0
    proposal = moved_definitions.retarget(repo, base, diff, onto, tmp_path, use_wiggle=wiggle_available())
    assert proposal.tree, proposal.detail
    assert proposal.changed == [DEFAULTS]
    assert f"hunk 1 of {SETTINGS} (choose_kv_cache_dtype) -> {DEFAULTS} line" in proposal.detail
    ported = run_git(["cat-file", "blob", f"{proposal.tree}:{DEFAULTS}"], repo).stdout.decode()
    assert ported == MOVED_TO.replace('    return "bfloat16"\n', '    if arch == "gfx950":\n        return "fp8_e4m3"\n    return "bfloat16"\n')
    released = run_git(["cat-file", "blob", f"{proposal.tree}:{SETTINGS}"], repo).stdout.decode()
    assert released == SERVER_ARGS_RELEASE


def test_a_moved_definition_whose_signature_changed_is_no_proposal_and_says_so(repo, tmp_path):
    base, diff = _rendition(repo, {SETTINGS: SERVER_ARGS}, {SETTINGS: FIXED})
    changed = MOVED_TO.replace("def choose_kv_cache_dtype(args, arch):", "def choose_kv_cache_dtype(args, arch, device):")
    onto = _commit(repo, {SETTINGS: SERVER_ARGS_RELEASE, DEFAULTS: changed})
    proposal = moved_definitions.retarget(repo, base, diff, onto, tmp_path)
    assert not proposal.tree
    assert (f"choose_kv_cache_dtype is in {DEFAULTS}, but its signature changed: def choose_kv_cache_dtype(args, arch)"
            " -> def choose_kv_cache_dtype(args, arch, device)") in proposal.detail


def test_a_definition_the_release_no_longer_has_is_no_proposal_and_says_so(repo, tmp_path):
    base, diff = _rendition(repo, {SETTINGS: SERVER_ARGS}, {SETTINGS: FIXED})
    onto = _commit(repo, {SETTINGS: SERVER_ARGS_RELEASE, DEFAULTS: MOVED_TO.replace("choose_kv_cache_dtype", "pick_kv_dtype")})
    proposal = moved_definitions.retarget(repo, base, diff, onto, tmp_path)
    assert not proposal.tree
    assert "(in def choose_kv_cache_dtype(args, arch)): no def choose_kv_cache_dtype in the release's python" in proposal.detail


def test_a_hunk_that_fails_where_its_definition_still_is_is_not_moved(repo, tmp_path):
    base, diff = _rendition(repo, {SETTINGS: SERVER_ARGS}, {SETTINGS: FIXED})
    rewritten = SERVER_ARGS.replace('    return "bfloat16"\n', '    return FALLBACK\n')
    onto = _commit(repo, {SETTINGS: rewritten})
    proposal = moved_definitions.retarget(repo, base, diff, onto, tmp_path, use_wiggle=False)
    assert not proposal.tree and f"choose_kv_cache_dtype is still in {SETTINGS}" in proposal.detail


# -- in the cascade: ``rebase`` of a release that moved the function ------------------------------


def _import_each_touched_module(self, commit, changed):
    """The judge's import smoke for the small test release: each touched module imported by this
    interpreter from the candidate tree."""
    tree = checkout_commit(self.repo, commit, Path(tempfile.mkdtemp(dir=self.scratch, prefix="imports-")))
    findings = []
    for path in changed:
        if path.startswith("python/") and path.endswith(".py") and (tree / path).exists():
            module = path[len("python/"):-3].replace("/", ".")
            done = subprocess.run([sys.executable, "-c", f"import {module}"], capture_output=True, text=True, timeout=120,
                                  env={"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(tree / "python")})
            if done.returncode:
                findings.append(f"{module}: {done.stderr.strip().splitlines()[-1]}")
    return findings


def test_rebase_ports_a_patch_whose_function_the_release_moved_and_reports_the_try(fake_project, tmp_path, monkeypatch):
    monkeypatch.setattr(Trial, "import_smoke", _import_each_touched_module)
    known = registry.registry
    # The fix is in server_args.py on 0.2.5 and in the file 0.3.0 moved the function to.
    witness = TextWitness("kv-default", (DEFAULTS, SETTINGS), '"fp8_e4m3"')
    monkeypatch.setattr(registry, "registry", lambda: {**known(), "kv-default": witness})
    files_025 = {**BASE_FILES, "sglang/srt/server_args.py": SERVER_ARGS}
    wheel = make_wheel(fake_project.index, "0.2.5", files_025)
    pins = fake_project.root / "upstream" / "pins.toml"
    pins.write_text(pins.read_text() + pin_entry("0.2.5", wheel))
    patch = format_patch(tmp_path, {**tree_files("0.2.5"), SETTINGS: SERVER_ARGS}, {SETTINGS: FIXED}, "kv: fp8 on gfx950",
                         trailers={"Witness": "kv-default", "Applies-To": "==0.2.5"})
    fake_project.set_patches([("0001-kv.patch", patch)])
    make_wheel(fake_project.index, "0.3.0", {**BASE_FILES, "sglang/srt/server_args.py": SERVER_ARGS_RELEASE,
                                             "sglang/srt/arg_groups/defaults.py": MOVED_TO})
    report = rebase_onto(fake_project.project, "0.3.0")
    outcome = report.outcomes[0]
    assert (outcome.verdict, outcome.step) == ("new-rendition", moved_definitions.STEP), report.text()
    tried = next(a for a in outcome.attempts if a.how == moved_definitions.STEP)
    assert tried.result == f"proposes a tree changing {DEFAULTS}" and tried.judge.startswith("accepted")
    assert "(choose_kv_cache_dtype) -> " + DEFAULTS in tried.detail
    assert f"tried patches/0001-kv.patch {moved_definitions.STEP} from 0.2.5: proposes a tree changing {DEFAULTS}" in report.text()
    # A rendition for a release newer than every pin is the newest: it becomes the main file, and
    # the old main moves under renditions/, named after the newest pin it covers.
    text = (fake_project.root / "patches" / "0001-kv.patch").read_text()
    assert "Applies-To: ==0.3.0" in text and outcome.rendition == "patches/0001-kv.patch"
    assert (fake_project.root / "patches" / "renditions" / "0001-kv" / "0.2.5.patch").read_text() == patch
    assert f"+++ b/{DEFAULTS}" in text and '+        return "fp8_e4m3"' in text and "server_args.py" not in text.split("---\n", 1)[1]
    assert report.written
