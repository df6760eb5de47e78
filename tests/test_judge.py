"""The judge's static names check: what an added or changed line uses must exist in the release."""

from __future__ import annotations

from sglpatch.rebase.judge import Release, Verdict, names_findings

SERVER_ARGS = '''from typing import Annotated as A


def NS(name):
    return name


class ServerArgs:
    tp_size: int = 1
    enable_aiter_allreduce_fusion: A[bool, "Enable Aiter AllReduce Fusion.", NS("exec.comm")] = False
    kv_cache_dtype: A[str, "KV cache dtype.", NS("model.cache")] = "auto"

    def __post_init__(self):
        self.resolved_tp = self.tp_size

    def _handle_aiter(self):
        if self.enable_aiter_allreduce_fusion:
            self.tp_size = 1
'''
RUNTIME = "def get_exec():\n    pass\n\n\ndef get_server_args():\n    pass\n\n\ndef get_parallel():\n    pass\n"


def _release(extra=None):
    files = {
        "python/sglang/srt/server_args.py": SERVER_ARGS,
        "python/sglang/srt/runtime_context.py": RUNTIME,
        "python/sglang/srt/utils/__init__.py": "def is_hip():\n    return False\n",
        **(extra or {}),
    }
    return Release(files.get, lambda path: path in files)


COMM = "python/sglang/srt/layers/communicator.py"
OLD = '''from sglang.srt.runtime_context import get_exec


def fused(batch_size):
    return get_exec().comm.enable_aiter_allreduce_fusion and batch_size > 0
'''


def test_a_name_the_release_no_longer_imports_is_a_finding_on_the_added_line_only():
    new = OLD.replace(" and batch_size > 0\n", " and batch_size > 0 and not get_server_args().tp_size == 6\n")
    assert names_findings(COMM, OLD, new, _release()) == [f"{COMM}:5: undefined name 'get_server_args'"]
    # A name the pristine file already lacked is not the port's doing.
    assert names_findings(COMM, new, new + "\n", _release()) == []


def test_a_namespaced_setting_must_be_declared_under_that_namespace():
    good = OLD.replace("batch_size > 0", "batch_size > 0 and get_exec().comm.enable_aiter_allreduce_fusion")
    assert names_findings(COMM, OLD, good, _release()) == []
    wrong = OLD.replace("batch_size > 0", "batch_size > 0 and get_exec().comm.kv_cache_dtype == 'fp8'")
    findings = names_findings(COMM, OLD, wrong, _release())
    assert len(findings) == 1 and "no setting comm.kv_cache_dtype under NS('exec'" in findings[0]


def test_a_server_args_field_the_release_does_not_have_is_a_finding():
    old = "from sglang.srt.runtime_context import get_server_args\n\n\ndef f():\n    return 1\n"
    new = old.replace("return 1", "return get_server_args().enable_flashinfer_fusion or get_server_args().tp_size")
    findings = names_findings(COMM, old, new, _release())
    assert findings == [f"{COMM}:5: ServerArgs has no field 'enable_flashinfer_fusion' (read as get_server_args().enable_flashinfer_fusion)"]
    # Inside ServerArgs itself, self.<field> is checked too; fields set in a method count.
    inside = SERVER_ARGS.replace("            self.tp_size = 1\n", "            self.tp_size = 1\n            self.resolved_tp = self.no_such_field\n")
    found = names_findings("python/sglang/srt/server_args.py", SERVER_ARGS, inside, _release())
    assert found == ["python/sglang/srt/server_args.py:19: ServerArgs has no field 'no_such_field' (read as self.no_such_field)"]


def test_an_import_of_a_module_or_name_the_release_does_not_define_is_a_finding():
    old = "import os\n"
    new = old + "from sglang.srt.utils import is_hip, is_gfx95_supported\nfrom sglang.srt.arg_groups.overrides import x\n"
    assert names_findings(COMM, old, new, _release()) == [
        f"{COMM}:2: sglang.srt.utils defines no is_gfx95_supported",
        f"{COMM}:3: imports sglang.srt.arg_groups.overrides, which the release does not have",
    ]


def test_a_verdict_is_accepted_only_when_every_part_ran_and_found_nothing():
    verdict = Verdict(checked=["names", "witness"])
    assert not verdict.accepted and "imports not checked" in verdict.summary()
    verdict.checked.append("imports")
    assert verdict.accepted
    verdict.imports.append("sglang.srt.layers.communicator: ImportError")
    assert not verdict.accepted and verdict.summary().startswith("refused: imports:")


def test_a_star_import_of_another_sglang_module_is_followed_and_checked():
    star = {"python/sglang/srt/star.py": "from sglang.srt.utils import *\n",
            "python/sglang/srt/relative/__init__.py": "from ..utils import *\n"}
    new = ("from sglang.srt.star import is_hip\nfrom sglang.srt.star import is_cuda\n"
           "from sglang.srt.relative import is_hip as hip\n")
    assert names_findings(COMM, "", new, _release(star)) == [f"{COMM}:2: sglang.srt.star defines no is_cuda"]


def test_a_name_a_module_may_make_at_import_time_is_a_finding_that_it_could_not_be_checked():
    # Issue 30: a module __getattr__, or a star import from outside the release, hides what the
    # module defines; the names part cannot look, and says so (which refuses the port).
    blind = {"python/sglang/srt/lazy.py": "def __getattr__(name):\n    return name\n\n\ndef real():\n    pass\n",
             "python/sglang/srt/outside.py": "from torch import *\n"}
    new = "from sglang.srt.lazy import anything, real\nfrom sglang.srt.outside import tensor\n"
    assert names_findings(COMM, "", new, _release(blind)) == [
        f"{COMM}:1: could not check whether sglang.srt.lazy defines anything: sglang.srt.lazy makes names at import time"
        " (a module __getattr__)",
        f"{COMM}:2: could not check whether sglang.srt.outside defines tensor: sglang.srt.outside takes names by a star"
        " import from torch, outside the release",
    ]


def test_a_release_file_that_does_not_parse_is_a_finding_not_a_pass():
    broken = OLD.replace("def fused(batch_size):", "def fused(batch_size) ->:")
    new = broken.replace(" and batch_size > 0\n", " and batch_size > 0 and undefined_name\n")
    findings = names_findings(COMM, broken, new, _release())
    assert len(findings) == 1 and findings[0].startswith(
        f"{COMM}: could not check the names its lines use: the release's own file does not parse here")
    # A module imported from, whose file does not parse, is one the part could not look into either.
    bad = {"python/sglang/srt/bad.py": "def f(:\n"}
    found = names_findings(COMM, "", "from sglang.srt.bad import f\n", _release(bad))
    assert found == [f"{COMM}:1: could not check what it imports from sglang.srt.bad: python/sglang/srt/bad.py does not parse"
                     " here (line 1: invalid syntax)"]


def test_server_args_whose_fields_cannot_be_read_is_a_finding_where_a_line_reads_one():
    based = SERVER_ARGS.replace("class ServerArgs:", "class ServerArgs(Base):")
    old = "from sglang.srt.runtime_context import get_server_args\n\n\ndef f():\n    return 1\n"
    new = old.replace("return 1", "return get_server_args().tp_size")
    assert names_findings(COMM, old, new, _release({"python/sglang/srt/server_args.py": based})) == [
        f"{COMM}:5: could not check the ServerArgs field 'tp_size': ServerArgs takes fields from a base class"]


def test_names_only_the_port_defines_are_checked_against_the_port_and_reported_as_its_own():
    release_files = {"python/sglang/srt/utils/__init__.py": "def is_hip():\n    return False\n",
                     "python/sglang/srt/server_args.py": SERVER_ARGS, "python/sglang/srt/runtime_context.py": RUNTIME}
    port_files = {**release_files,
                  "python/sglang/srt/utils/__init__.py": "def is_hip():\n    return False\n\n\ndef is_mi355x():\n    return False\n",
                  "python/sglang/srt/new_module.py": "X = 1\n",
                  "python/sglang/srt/server_args.py": SERVER_ARGS.replace("    tp_size: int = 1\n",
                                                                          "    tp_size: int = 1\n    new_field: int = 0\n")}
    port = Release(port_files.get, lambda path: path in port_files)
    release = Release(release_files.get, lambda path: path in release_files, port=port)
    old = "from sglang.srt.runtime_context import get_server_args\n\n\ndef f():\n    return 1\n"
    new = ("from sglang.srt.runtime_context import get_server_args\nfrom sglang.srt.utils import is_mi355x\n"
           "from sglang.srt.new_module import X\n\n\ndef f():\n    return get_server_args().new_field or X or is_mi355x()\n")
    assert names_findings(COMM, old, new, release) == []
    assert release.added == [
        f"{COMM}:2: imports is_mi355x from sglang.srt.utils, which the port itself adds",
        f"{COMM}:3: imports sglang.srt.new_module, a module the port itself adds",
        f"{COMM}:7: reads ServerArgs field 'new_field', which the port itself adds",
    ]
    # Without the port's own tree the same lines are findings: the release alone does not define them.
    assert len(names_findings(COMM, old, new, Release(release_files.get, lambda path: path in release_files))) == 3
    verdict = Verdict(checked=["names", "witness", "imports"], added=release.added)
    assert verdict.accepted and "3 name(s) the port itself adds" in verdict.summary()
    assert f"the port adds: {release.added[0]}" in verdict.findings()
