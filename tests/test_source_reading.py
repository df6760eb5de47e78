"""``sglpatch check`` (and ``apply``, before it runs anything) refuses a regression test that reads
sglang's source text instead of running its code, naming the file and line, as sglang's reviewers
would."""

from __future__ import annotations

import pytest

from conftest import REPO_ROOT
from sglpatch.series.check import check_series
from sglpatch.series.patches import load_series
from sglpatch.series.source_reading import source_reading_problems
from test_witness_upstream_test import GOOD_TEST, TEST_PATH, _project_with_tests

READS = {
    "open-file": "        text = open(ci_register.__file__).read()\n",
    "path-read-text": "        text = Path(ci_register.__file__).read_text()\n",
    "through-a-name": "        where = Path(ci_register.__file__).parent / 'ci_register.py'\n        text = where.read_bytes()\n",
    "inspect": "        text = inspect.getsource(ci_register)\n",
    "linecache": "        text = linecache.getline(ci_register.__file__, 3)\n",
    "a-path-naming-sglang": "        text = io.open('python/sglang/test/ci/ci_register.py').read()\n",
    "package-data": "        text = importlib.resources.read_text('sglang.test.ci', 'ci_register.py')\n",
    "spec-origin": "        with open(importlib.util.find_spec('sglang.test.ci.ci_register').origin) as f:\n            text = f.read()\n",
}
HEADER = "import importlib.resources\nimport importlib.util\nimport inspect\nimport io\nimport linecache\nfrom pathlib import Path\n\n" \
         "from sglang.test.ci import ci_register\n"


def _reading_test(body: str) -> str:
    test = GOOD_TEST.replace("import unittest\n", "import unittest\n" + HEADER, 1)
    return test.replace("        self.assertTrue(True)\n", body + "        self.assertEqual(text.count('register_musa_ci'), 2)\n")


@pytest.mark.parametrize("read", sorted(READS))
def test_check_refuses_a_test_that_reads_sglangs_source_naming_the_line(fake_project, tmp_path, read):
    project = _project_with_tests(fake_project, tmp_path, _reading_test(READS[read]))
    found = [p for p in check_series(project.patches_dir, project.pins()) if "reads source text" in p.message]
    text = (project.patches_dir / "tests" / "0001-fix-example" / TEST_PATH).read_text().splitlines()
    assert found, [str(p) for p in check_series(project.patches_dir, project.pins())]
    for problem in found:
        assert problem.path.name == "test_example.py"
        assert "sglang's reviewers would refuse it" in problem.message
        assert text[problem.line - 1].strip() and any(word in text[problem.line - 1]
                                                      for word in ("open", "read", "getsource", "getline"))


def test_a_test_that_runs_the_code_and_reads_only_its_own_files_is_not_refused(tmp_path):
    test = tmp_path / "test_x.py"
    test.write_text(HEADER + "import tempfile\n\n\ndef test_it():\n"
                    "    ci_register.register_cpu_ci(est_time=1, suite='base-a-test-cpu')\n"
                    "    scratch = Path(tempfile.mkdtemp()) / 'out.txt'\n    scratch.write_text('x')\n"
                    "    assert scratch.read_text() == 'x' and open(scratch).read() == 'x'\n"
                    "    own = Path(__file__).read_text()\n")
    assert source_reading_problems(test) == []


def test_the_series_own_tests_read_no_source():
    for patch in load_series(REPO_ROOT / "patches").patches:
        for test in patch.tests:
            assert source_reading_problems(test.file) == [], test.file
