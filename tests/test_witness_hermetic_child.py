"""The upstream-test probe's child side (``probes/upstream_test_probe.py``) run as the witness runs
it, in a child process of its own: what a regression test can reach there.

Fast: sglang's CI collector is a test double here (a two-function module that says every file is
registered for the CPU suite), since what is under test is the probe's hermetic run of a test file,
not a release; the network test of the real witness on 0.5.23 is in test_witness_upstream_test.py.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

from conftest import REPO_ROOT, pip_default_index_host

PROBES = REPO_ROOT / "sglpatch" / "witnesses" / "probes"

# Test double: sglang.test.ci.ci_register, as much of it as the probe's collector step reads.
COLLECTOR_DOUBLE = '''
class _Backend:
    name = "CPU"


class _Registration:
    backend = _Backend()
    suite = "base-a-test-cpu"


def register_cpu_ci(**kwargs):
    pass


def ut_parse_one_file(path):
    return [_Registration()], True
'''

TEST_FILE = '''import os
import socket
import tempfile
import unittest
import urllib.request
from pathlib import Path

from sglang.test.ci.ci_register import register_cpu_ci

register_cpu_ci(est_time=1, suite="base-a-test-cpu")


class TestWhatATestReaches(unittest.TestCase):
    def test_home_and_temp_are_empty_and_its_own(self):
        home = os.environ["HOME"]
        self.assertNotEqual(home, {caller_home!r})
        self.assertEqual(os.listdir(home), [])
        self.assertTrue(tempfile.gettempdir().startswith(os.path.dirname(home)))
        self.assertEqual(os.listdir(os.getcwd()), [])
        Path(home, "left-behind").write_text("x")

    def test_no_connection_leaves_the_machine(self):
        with self.assertRaises(OSError) as refused:
            socket.create_connection(("192.0.2.1", 80), timeout=3)
        self.assertIn("{why}", str(refused.exception))
        with self.assertRaises(OSError):
            socket.getaddrinfo({index_host!r}, 443)

    def test_loopback_stays(self):
        with socket.socket() as server:
            server.bind(("127.0.0.1", 0))
            server.listen()
            with socket.create_connection(server.getsockname(), timeout=3):
                pass

    def test_that_needs_the_network(self):
        urllib.request.urlopen("https://" + {index_host!r} + "/", timeout=5).read()


if __name__ == "__main__":
    unittest.main()
'''

CHILD = '''
import json, sys
sys.path[:0] = [{probes!r}, {fake!r}]
import upstream_test_probe


class Context:
    workdir, tree = {work!r}, {tree!r}

    def phase(self, name):
        pass


answer = upstream_test_probe.run({{"tests": [{{"name": "test/registered/unit/test_x.py", "path": {test!r}}}]}}, Context())
print(json.dumps(answer))
'''


def _run_child(tmp_path: Path, test_text: str) -> dict:
    """The probe run on a tree whose python/ holds a module and the collector's double."""
    tree = tmp_path / "tree"
    fake = tree / "python"
    (fake / "sglang" / "test" / "ci").mkdir(parents=True)
    for folder in (fake / "sglang", fake / "sglang" / "test", fake / "sglang" / "test" / "ci"):
        (folder / "__init__.py").write_text("")
    (fake / "sglang" / "test" / "ci" / "ci_register.py").write_text(COLLECTOR_DOUBLE)
    (fake / "sglang" / "module.py").write_text("VALUE = 1\n")
    work = tmp_path / "work"
    work.mkdir()
    test = tmp_path / "test_x.py"
    test.write_text(test_text)
    script = CHILD.format(probes=str(PROBES), fake=str(fake), work=str(work), tree=str(tree / "python"), test=str(test))
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                          env={"PATH": os.environ["PATH"], "HOME": os.environ.get("HOME", "/root"),
                               "PYTHONDONTWRITEBYTECODE": "1"}, cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_test_gets_an_empty_home_and_no_network_and_one_that_needs_it_cannot_tell(tmp_path, monkeypatch):
    monkeypatch.syspath_prepend(str(PROBES))  # the probe imports its neighbours as the child does
    from upstream_test_probe import NO_NETWORK

    text = TEST_FILE.format(caller_home=os.environ.get("HOME", "/root"), why=NO_NETWORK, index_host=pip_default_index_host())
    answer = _run_child(tmp_path, text)
    found = answer["files"]["test/registered/unit/test_x.py"]
    print(json.dumps(answer, indent=1)[:3000])
    assert found["tests_run"] == 4 and found["failures"] == [] and found["tree_changed"] == []
    # The one test that needs the network errors (no failed assertion): no verdict, not a flake.
    [error] = found["errors"]
    assert error["test"].endswith("test_that_needs_the_network") and NO_NETWORK in error["detail"]
    assert "non-local sockets and name lookups refused" in answer["hermetic"]
    assert "own empty HOME" in answer["hermetic"]


def test_a_test_that_writes_to_the_tree_it_judges_is_seen(tmp_path):
    text = textwrap.dedent('''\
        import unittest
        from pathlib import Path

        import sglang.module
        from sglang.test.ci.ci_register import register_cpu_ci

        register_cpu_ci(est_time=1, suite="base-a-test-cpu")


        class TestEdits(unittest.TestCase):
            def test_edits_a_file_no_patch_touches(self):
                Path(sglang.module.__file__).write_text("VALUE = 2\\n")


        if __name__ == "__main__":
            unittest.main()
        ''')
    found = _run_child(tmp_path, text)["files"]["test/registered/unit/test_x.py"]
    assert found["tree_changed"] == ["python/sglang/module.py"], found
    from sglpatch.witnesses import upstream_test

    judged = upstream_test.judge({"files": {"test/registered/unit/test_x.py": found}})
    assert judged.state == "unavailable" and "the tests changed the tree they judge (python/sglang/module.py)" in judged.detail
