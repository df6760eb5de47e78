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


def test_names_a_module_makes_at_import_time_are_not_refused():
    lazy = {"python/sglang/srt/lazy.py": "def __getattr__(name):\n    return name\n",
            "python/sglang/srt/star.py": "from sglang.srt.utils import *\n"}
    new = "from sglang.srt.lazy import anything\nfrom sglang.srt.star import is_hip\n"
    assert names_findings(COMM, "", new, _release(lazy)) == []
