"""Progress on long work: live on a terminal, timestamped lines in logs, nothing with -q."""

from __future__ import annotations

import io
import re
import subprocess
import sys

import pytest

from sglpatch import progress


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
