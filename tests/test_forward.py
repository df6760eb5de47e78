"""Forward-porting the series to a new release: every patch classified, all or nothing written."""

from __future__ import annotations

import shutil

import pytest

from conftest import BASE_FILES, REPO_ROOT, format_patch, make_wheel, tree_files
from sglpatch import forward
from sglpatch.pins import load_pins
from sglpatch.project import Project

EXAMPLE = "python/sglang/srt/layers/example.py"


def _lines(replace):
    lines = [f"line {n}\n" for n in range(1, 41)]
    for number, text in replace.items():
        lines[number - 1] = text
    return "".join(lines)


def _release(fake_project, version, example_text):
    files = {**BASE_FILES, "sglang/srt/layers/example.py": example_text}
    make_wheel(fake_project.index, version, files)


def _example_patch(tmp_path):
    files = tree_files("0.1.0")
    return format_patch(tmp_path, files, {EXAMPLE: _lines({20: "patched\n"})}, "example: patch line 20", trailers={"Witness": "rocm-guard"})


def test_patch_that_applies_as_is_carries_over_and_the_pin_is_written(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({5: "upstream changed line 5\n"}))
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert [(o.name, o.verdict) for o in report.outcomes] == [("0001-example.patch", "carries-over")]
    assert report.written
    pin = load_pins(fake_project.root / "upstream" / "pins.toml").select(["0.3.0"])[0]
    assert pin.artifact.endswith(".whl") and not pin.commit and "rebase" in pin.commit_evidence
    assert '"0.3.0"' in (fake_project.root / "series.lock").read_text()


def test_changed_context_is_merged_three_way_into_a_new_rendition(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({17: "upstream changed line 17\n"}))
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert [(o.name, o.verdict) for o in report.outcomes] == [("0001-example.patch", "new-rendition")]
    rendition = fake_project.root / "patches" / "renditions" / "0001-example" / "0.3.0.patch"
    text = rendition.read_text()
    assert "Applies-To: >=0.3.0" in text and " upstream changed line 17" in text and "+patched" in text
    assert report.written
    assert "Applies-To: >=0.1,<0.3.0" in (fake_project.root / "patches" / "0001-example.patch").read_text()
    from sglpatch.check import check_series

    project = fake_project.project
    assert check_series(project.patches_dir, project.pins()) == []


def test_conflict_writes_nothing(fake_project, tmp_path):
    fake_project.set_patches([("0001-example.patch", _example_patch(tmp_path))])
    _release(fake_project, "0.3.0", _lines({20: "upstream rewrote line 20\n"}))
    pins_before = (fake_project.root / "upstream" / "pins.toml").read_text()
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert [(o.name, o.verdict) for o in report.outcomes] == [("0001-example.patch", "conflict")]
    assert "hunk 1 of" in report.outcomes[0].detail
    assert not report.written
    assert (fake_project.root / "upstream" / "pins.toml").read_text() == pins_before
    assert not (fake_project.root / "patches" / "renditions").exists()


def test_bug_fixed_differently_upstream_is_fixed_upstream(fake_project, tmp_path, test_witnesses):
    files = tree_files("0.1.0")
    kernel = "python/sglang/jit_kernel/csrc/kernel.cuh"
    guarded = files[kernel].replace("#include <cuda_runtime.h>\n", "#ifndef USE_ROCM\n#include <cuda_runtime.h>\n#endif\n")
    patch = format_patch(tmp_path, files, {kernel: guarded}, "kernel: guard", trailers={"Witness": "guard-text"})
    fake_project.set_patches([("0001-guard.patch", patch)])
    upstream_way = "#pragma once\n#ifndef USE_ROCM  // upstream's own fix\n#include <cuda_runtime.h>\n#endif\n"
    make_wheel(fake_project.index, "0.3.0", {**BASE_FILES, "sglang/jit_kernel/csrc/kernel.cuh": upstream_way})
    report = forward.forward_port(fake_project.project, "0.3.0")
    assert [(o.name, o.verdict) for o in report.outcomes] == [("0001-guard.patch", "fixed-upstream")]
    assert report.written


def test_already_pinned_version_is_refused(fake_project):
    with pytest.raises(Exception, match="already pinned"):
        forward.forward_port(fake_project.project, "0.2.0")


@pytest.mark.network
def test_end_to_end_forward_port_of_the_real_series_to_a_real_release(tmp_path):
    root = tmp_path / "project"
    shutil.copytree(REPO_ROOT / "patches", root / "patches")
    (root / "upstream").mkdir(parents=True)
    text = (REPO_ROOT / "upstream" / "pins.toml").read_text()
    (root / "upstream" / "pins.toml").write_text(text[: text.index('[[pin]]\nversion = "0.5.23"')])
    report = forward.forward_port(Project(root), "0.5.23")
    # 0001's guard is in 0.5.23 verbatim; 0002 and 0003 still fix real bugs there (their witnesses
    # fail on the pristine release) and their newest renditions already cover it.
    assert [(o.name, o.verdict) for o in report.outcomes] == [
        ("0001-amd-guard-cuda-runtime-include-fused-metadata-copy.patch", "already-upstream"),
        ("0002-quark-keep-mtp-draft-excluded-modules-unquantized.patch", "carries-over"),
        ("0003-amd-glm5-mi355x-aiter-allreduce-fusion-fp8-kv-default.patch", "carries-over"),
    ]
    assert report.written
    ported = load_pins(root / "upstream" / "pins.toml").select(["0.5.23"])[0]
    shipped = load_pins(REPO_ROOT / "upstream" / "pins.toml").select(["0.5.23"])[0]
    assert (ported.artifact, ported.sha256, ported.released) == (shipped.artifact, shipped.sha256, shipped.released)
