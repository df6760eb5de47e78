"""Progress on long work: live on a terminal, timestamped lines in logs, nothing with -q."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest

from sglpatch.apply.apply_pins import apply_series
from sglpatch.plumbing import progress


class _Terminal(io.StringIO):
    def isatty(self):
        return True


@pytest.fixture(autouse=True)
def _reset():
    yield
    progress.stop()
    progress.configure("lines")


def test_lines_mode_stamps_each_step_start_and_end_with_its_duration():
    out = io.StringIO()
    progress.configure("auto", out)  # not a terminal
    assert progress.mode() == "lines"
    with progress.step("sglang 0.5.14 (1/2)") as shown:
        shown.update("witness rocm-guard")
        shown.outcome = "ok"
    with progress.transfer("download sglang-0.5.14.whl", 3_000_000) as moved:
        moved.advance(3_000_000)
    progress.note("waiting for pristine/0.5.14: held by pid 7")
    lines = out.getvalue().splitlines()
    stamp = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ "
    assert re.fullmatch(stamp + r"sglang 0\.5\.14 \(1/2\) \.\.\.", lines[0])
    assert re.fullmatch(stamp + r"sglang 0\.5\.14 \(1/2\): witness rocm-guard", lines[1])
    assert re.fullmatch(stamp + r"sglang 0\.5\.14 \(1/2\): ok \(\d+\.\d s\)", lines[2])
    assert re.fullmatch(stamp + r"download sglang-0\.5\.14\.whl: 3\.0 MB at [\d.]+ MB/s \(\d+\.\d s\)", lines[4])
    assert lines[5].endswith("waiting for pristine/0.5.14: held by pid 7")


def test_a_failing_step_says_it_failed():
    out = io.StringIO()
    progress.configure("lines", out)
    with pytest.raises(RuntimeError):
        with progress.step("build the CPU Python"):
            raise RuntimeError("pip")
    assert out.getvalue().splitlines()[-1].split(" ", 1)[1].startswith("build the CPU Python: failed: RuntimeError (")


def test_quiet_prints_nothing():
    out = io.StringIO()
    progress.configure("quiet", out)
    with progress.step("anything") as shown:
        shown.update("more")
    progress.note("a note")
    assert out.getvalue() == ""


def test_a_terminal_gets_the_live_display_and_finished_steps_scroll_up():
    out = _Terminal()
    progress.configure("auto", out)
    assert progress.mode() == "live"
    with progress.transfer("download x.whl", 10) as moved:
        moved.advance(10)
    with progress.step("sglang 0.5.14 (1/1)") as shown:
        shown.outcome = "ok"
    progress.stop()
    text = re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", out.getvalue())
    assert "download x.whl" in text and "sglang 0.5.14 (1/1): ok" in text


def test_the_cli_keeps_stdout_for_its_report_and_quiet_silences_progress(fake_project):
    run = subprocess.run([sys.executable, "-m", "sglpatch", "--root", str(fake_project.root), "apply", "--no-witnesses"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    assert "sglang 0.1.0 (1/2) ..." in run.stderr and "sglang 0.1.0 (1/2)" not in run.stdout
    assert "download sglang-0.1.0.tar.gz" in run.stderr
    quiet = subprocess.run([sys.executable, "-m", "sglpatch", "-q", "--root", str(fake_project.root), "apply", "--no-witnesses"],
                           capture_output=True, text=True)
    assert quiet.returncode == 0 and quiet.stderr == "" and "sglang 0.1.0: ok" in quiet.stdout


def _fake_pin_cells(root, version, use_cache):
    # Stands in for a worker's real cells (those are proven in test_matrix): what is judged here
    # is only what the CPU tier says while its workers run.
    from sglpatch.matrix.cells import Cell

    with progress.step(f"cpu-build-{version}") as shown:
        shown.outcome = "passed"
    return [Cell("cpu", "build", version, None)]


def test_the_cpu_tier_says_each_cell_and_counts_the_pins_as_workers_finish(fake_project, monkeypatch, capfd):
    from sglpatch.matrix import cpu

    monkeypatch.setattr(cpu, "_pin_cells", _fake_pin_cells)
    progress.configure("lines")
    versions = [pin.version for pin in fake_project.project.pins().pins]
    assert len(versions) >= 2
    assert cpu.run_cpu_tier(fake_project.project, jobs=2) == [cpu.Cell("cpu", "build", v, None) for v in versions]
    said = [line.split(" ", 1)[1] for line in capfd.readouterr().err.splitlines()]  # whole lines, never interleaved
    assert said[0] == f"CPU tier: {len(versions)} pins on 2 workers ..."
    for version in versions:
        assert f"cpu-build-{version}: passed (0.0 s)" in said  # from the worker that ran it
    assert f"CPU tier: {len(versions)} pins on 2 workers: {len(versions)}/{len(versions)} pins done" in " ".join(said)
    assert said[-1].startswith(f"CPU tier: {len(versions)} pins on 2 workers: done (")


def test_one_cpu_cell_is_a_step_that_ends_with_its_outcome(fake_project, monkeypatch, capsys):
    from sglpatch.matrix import cpu
    from sglpatch.matrix.records import PASSED, CellRecord

    record = CellRecord("cpu", "spec", "0.5.14", 5, "1", "abc", PASSED)
    record.cached = True
    monkeypatch.setattr(cpu, "_run_cell", lambda project, cell, use_cache: record)
    progress.configure("lines")
    assert cpu.run_cpu_cell(fake_project.project, cpu.Cell("cpu", "spec", "0.5.14", 5)) is record
    said = [line.split(" ", 1)[1] for line in capsys.readouterr().err.splitlines()]
    assert said == ["cpu-spec-0.5.14-d5 ...", "cpu-spec-0.5.14-d5: passed (cached) (0.0 s)"]


def test_apply_in_workers_counts_each_pin_as_it_is_done(fake_project, monkeypatch, capfd):
    # The pins' own work is proven in test_apply; judged here is what the parent says meanwhile.
    progress.configure("lines")
    report = apply_series(fake_project.project, run_witnesses=False, jobs=2)
    assert report.ok, report.to_json()
    said = [line.split(" ", 1)[1] for line in capfd.readouterr().err.splitlines()]
    counted = [m.group(1) for line in said if (m := re.fullmatch(r"apply: 2 pins on 2 workers: (\d/2) pins done \(sglang \S+: ok\)", line))]
    assert counted == ["1/2", "2/2"]
    for version in fake_project.versions:  # each worker's own lines
        assert any(re.fullmatch(rf"sglang {re.escape(version)} \(\d/2\): ok \([\d.]+ s\)", line) for line in said), said
