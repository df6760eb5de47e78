"""The CPU Python the probes run in: a pinned base, each pin's own requirements on top, and the
shared child-side test doubles (stand-in modules, HIP emulation)."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
import zipfile
from pathlib import Path

import pytest

from conftest import REPO_ROOT
from sglpatch.plumbing import progress
from sglpatch.sources.pins import load_pins
from sglpatch.witnesses import cpu_envs, probe_children, probe_runs

PINS = load_pins(REPO_ROOT / "upstream" / "pins.toml")


def _probe(tmp_path: Path, source: str, python: str = sys.executable) -> dict:
    script = tmp_path / "probe.py"
    script.write_text(textwrap.dedent(source))
    done = subprocess.run(
        [python, str(script)], env={"PYTHONPATH": str(probe_children.PROBES), "PATH": "/usr/bin:/bin"},
        capture_output=True, text=True, timeout=600,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_stand_ins_replace_only_what_cannot_be_imported(tmp_path):
    answer = _probe(tmp_path, """
        import json, standins
        stood_in = standins.install("json", "sglpatch_no_such_gpu_package")
        import sglpatch_no_such_gpu_package as gpu
        from sglpatch_no_such_gpu_package.ops import Kernel, fused_op

        class Sub(Kernel):  # a placeholder works as a base class
            pass

        @gpu.register_custom_op
        def op():
            return 7

        print(json.dumps({"stood_in": stood_in, "decorated": op(), "isinstance": isinstance(Sub(), Kernel),
                          "called": repr(fused_op(1, 2))}))
    """)
    assert answer["stood_in"] == ["sglpatch_no_such_gpu_package"]  # json is real and stays real
    assert answer["decorated"] == 7
    assert answer["isinstance"] is True
    assert "stand-in" in answer["called"]


def test_a_named_stand_in_has_exactly_the_listed_names(tmp_path):
    answer = _probe(tmp_path, """
        import importlib.util, json, standins
        stood_in = standins.install(names={"sglpatch_gpu_kernels": ["gemm"],
                                           "sglpatch_gpu_kernels.kvcacheio": ["transfer"]})
        import sglpatch_gpu_kernels
        from sglpatch_gpu_kernels.kvcacheio import transfer
        try:
            import sglpatch_gpu_kernels.flash
            flash = "imported"
        except ImportError:
            flash = "missing"
        try:
            from sglpatch_gpu_kernels import fused_moe
            unlisted = "imported"
        except ImportError:
            unlisted = "missing"
        standins.reset_calls()
        transfer(1, 2)
        print(json.dumps({"stood_in": stood_in, "flash": flash, "unlisted": unlisted,
                          "has_gemm": hasattr(sglpatch_gpu_kernels, "gemm"),
                          "has_other": hasattr(sglpatch_gpu_kernels, "other"),
                          "find_spec": importlib.util.find_spec("sglpatch_gpu_kernels") is not None,
                          "called": standins.calls()}))
    """)
    assert answer == {
        "stood_in": ["sglpatch_gpu_kernels (named: 2 names in 2 modules)"],
        "flash": "missing",
        "unlisted": "missing",
        "has_gemm": True,
        "has_other": False,
        "find_spec": True,
        "called": ["sglpatch_gpu_kernels.kvcacheio.transfer"],
    }


def test_the_bytecode_cache_is_keyed_on_content_and_names_the_right_file(tmp_path):
    for tree in ("a", "b"):
        package = tmp_path / tree / "python" / "pkg"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("import inspect\n\ndef where():\n    return inspect.getsourcefile(where)\n")
    cache = tmp_path / "pyc"
    seen = []
    for tree in ("a", "b"):
        answer = _probe(tmp_path, f"""
            import json, sys, bytecode
            stats = bytecode.install([{str(tmp_path / tree / "python")!r}], {str(cache)!r})
            sys.path.insert(0, {str(tmp_path / tree / "python")!r})
            import pkg
            print(json.dumps({{"stats": stats, "file": pkg.where()}}))
        """)
        seen.append(answer)
    assert seen[0]["stats"] == {"hit": 0, "miss": 1}
    assert seen[1]["stats"] == {"hit": 1, "miss": 0}  # same content at another path: compiled once
    assert seen[1]["file"] == str(tmp_path / "b" / "python" / "pkg" / "__init__.py")
    assert not list((tmp_path / "a").rglob("__pycache__")), "the tree got a __pycache__"


def test_the_environments_packages_are_compiled_once_into_the_cache_and_not_beside_their_source(tmp_path):
    for env in ("one", "two"):  # two overlays holding the same version of a package
        package = tmp_path / env / "lib" / "site-packages" / "thirdparty"
        package.mkdir(parents=True)
        (package / "__init__.py").write_text("VALUE = 41 + 1\n")
    cache = tmp_path / "pyc"
    seen = []
    for env in ("one", "two", "one"):
        seen.append(_probe(tmp_path, f"""
            import json, sys, bytecode
            sys.path.insert(0, {str(tmp_path / env / "lib" / "site-packages")!r})
            stats = bytecode.install(bytecode.environment_roots(), {str(cache)!r})
            import thirdparty
            print(json.dumps({{"stats": dict(stats), "value": thirdparty.VALUE, "file": thirdparty.__file__}}))
        """))
    assert [answer["value"] for answer in seen] == [42, 42, 42]
    assert seen[0]["stats"]["miss"] >= 1 and seen[1]["stats"]["miss"] == seen[2]["stats"]["miss"] == 0
    assert seen[1]["file"] == str(tmp_path / "two" / "lib" / "site-packages" / "thirdparty" / "__init__.py")
    assert not list(tmp_path.glob("*/lib/site-packages/**/__pycache__")), "bytecode was written beside the source"


@pytest.mark.network
def test_each_pin_gets_the_transformers_its_own_metadata_pins():
    versions: dict[str, tuple[str, str]] = {}  # one interpreter per environment, however many pins share it
    for pin in PINS.pins:
        wanted = {str(r.name).lower(): str(r.specifier) for r in cpu_envs.pin_requirements(pin)}
        python = str(probe_runs.cpu_python(pin).python)
        if python not in versions:
            done = subprocess.run(
                [python, "-c", "import transformers, torch; print(transformers.__version__, torch.__version__)"],
                capture_output=True, text=True, check=True, timeout=300,
            )
            versions[python] = tuple(done.stdout.split())
        transformers_version, torch_version = versions[python]
        assert wanted["transformers"] == f"=={transformers_version}", pin.version
        assert torch_version.startswith("2.13.0"), pin.version


@pytest.mark.network
def test_a_test_run_as_shown_gets_the_releases_own_torch_and_torchvision_in_front_of_the_pins_cpu_python():
    from sglpatch.upstream import upstream_plain_run

    [pin] = PINS.select(["0.5.23"])
    wanted = {str(r.name).lower(): str(r.specifier) for r in cpu_envs.pin_requirements(pin)}
    interpreter = upstream_plain_run.release_interpreter(pin)
    done = subprocess.run(
        [str(interpreter.bin_dir / "python"), "-c",
         "import json, torch, torchvision, transformers; print(json.dumps([torch.__version__, "
         "torchvision.__version__, transformers.__version__, torch.ops.torchvision.nms.default.name()]))"],
        env={"PATH": "/usr/bin:/bin"}, capture_output=True, text=True, timeout=300,
    )
    assert done.returncode == 0, done.stderr[-2000:]
    torch_version, vision_version, transformers_version, nms = json.loads(done.stdout.strip().splitlines()[-1])
    # The release's own torch (its CUDA build, on the CPU) shadows the base's 2.13.0+cpu, and the
    # torchvision beside it loads its operators; the pin's overlay still gives transformers.
    assert wanted["torch"] == f"=={torch_version.split('+')[0]}" and not torch_version.endswith("+cpu")
    assert nms == "torchvision::nms" and f"torchvision {vision_version.split('+')[0]} " in interpreter.described
    assert wanted["transformers"] == f"=={transformers_version}"


@pytest.mark.network
def test_hip_emulation_makes_torch_report_the_chosen_amd_gpu(tmp_path):
    python = probe_runs.cpu_python(PINS.newest)
    answer = _probe(tmp_path, """
        import json, subprocess, hip_emulation, torch
        hip_emulation.emulate()
        import triton
        mi355x = (torch.version.hip is not None, torch.cuda.is_available(), torch.cuda.get_device_capability(),
                  torch.cuda.get_device_properties(0).gcnArchName)
        target = triton.runtime.driver.active.get_current_target()
        hip_emulation.set_arch(hip_emulation.MI300X)
        rocminfo = subprocess.run(["rocminfo"], capture_output=True, text=True).stdout
        print(json.dumps({"mi355x": mi355x, "mi300x": torch.cuda.get_device_capability(),
                          "rocminfo": rocminfo.count("gfx942"),
                          "triton": [target.backend, target.arch, target.warp_size],
                          "triton_after": triton.runtime.driver.active.get_current_target().arch}))
    """, python=str(python.python))
    assert answer == {"mi355x": [True, True, [9, 5], "gfx950:sramecc+:xnack-"], "mi300x": [9, 4], "rocminfo": 8,
                      "triton": ["hip", "gfx950", 64], "triton_after": "gfx942"}


def test_a_failed_environment_build_is_unavailable_leaves_nothing_and_is_not_retried_by_the_same_process(tmp_path, monkeypatch):
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(tmp_path / "cache"))
    requirements = tmp_path / "requirements-cpu.txt"
    requirements.write_text("sglpatch-there-is-no-such-package==0.0.1\n")
    monkeypatch.setattr(cpu_envs, "REQUIREMENTS", requirements)
    monkeypatch.setenv("PIP_INDEX_URL", (tmp_path / "empty-index").as_uri())
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    with pytest.raises(cpu_envs.EnvUnavailable, match="CPU witness environment \\(base\\): pip failed"):
        cpu_envs.base_env()
    assert not [p for p in (tmp_path / "cache" / "pyenv").glob("base-*") if p.is_dir()], "a half-built environment was left"
    # The next tree asking in this process gets the same answer without pip failing again.
    monkeypatch.setattr(cpu_envs, "_pip", lambda *args: pytest.fail("pip ran again for a build that failed"))
    with pytest.raises(cpu_envs.EnvUnavailable, match="pip failed"):
        cpu_envs.base_env()


def test_a_probe_script_that_hangs_is_killed_and_the_result_names_it(tmp_path):
    python = probe_runs.CpuPython(Path(sys.executable))
    script = tmp_path / "hangs.py"
    script.write_text("import subprocess, sys, time\nsubprocess.Popen([sys.executable, '-c', 'import time; time.sleep(600)'])\n"
                      "print('started', flush=True)\ntime.sleep(600)\n")
    started = time.monotonic()
    run = python.run([str(script)], tree=tmp_path, timeout=3)
    assert time.monotonic() - started < 40
    assert run.returncode == 124 and "started" in run.stdout
    assert run.stderr.strip().endswith(f"hangs.py hung in the CPU Python of {tmp_path.name}: killed after 3 s")


def test_building_the_environment_says_which_package_it_is_on(tmp_path, monkeypatch, capsys):
    # pip of its own would say nothing for minutes with -q; the build shows each package as a
    # timestamped line (a terminal gets the same as a live display).
    monkeypatch.setenv("SGLPATCH_CACHE_DIR", str(tmp_path / "cache"))
    links = tmp_path / "links"
    links.mkdir()
    with zipfile.ZipFile(links / "sglpatch_tiny-1.0-py3-none-any.whl", "w") as wheel:
        wheel.writestr("sglpatch_tiny/__init__.py", "X = 1\n")
        wheel.writestr("sglpatch_tiny-1.0.dist-info/METADATA", "Metadata-Version: 2.1\nName: sglpatch-tiny\nVersion: 1.0\n")
        wheel.writestr("sglpatch_tiny-1.0.dist-info/WHEEL", "Wheel-Version: 1.0\nGenerator: test\nRoot-Is-Purelib: true\nTag: py3-none-any\n")
        wheel.writestr("sglpatch_tiny-1.0.dist-info/RECORD", "")
    requirements = tmp_path / "requirements-cpu.txt"
    requirements.write_text("sglpatch-tiny==1.0\n")
    monkeypatch.setattr(cpu_envs, "REQUIREMENTS", requirements)
    monkeypatch.setenv("PIP_NO_INDEX", "1")
    monkeypatch.setenv("PIP_FIND_LINKS", str(links))
    progress.configure("lines")
    env = cpu_envs.base_env()
    lines = capsys.readouterr().err.splitlines()
    said = [line.split(" ", 1)[1] for line in lines]
    assert said[0] == "CPU Python for the witnesses: base ..."
    assert "CPU Python for the witnesses: base: unpacking sglpatch_tiny-1.0-py3-none-any.whl" in said
    assert "CPU Python for the witnesses: base: installing 1 package" in said
    assert said[-1].startswith("CPU Python for the witnesses: base: done (")
    assert subprocess.run([str(env / "bin" / "python"), "-c", "import sglpatch_tiny"], timeout=60).returncode == 0


def test_distinct_overlays_are_built_once_each_and_side_by_side(tmp_path, monkeypatch):
    # What is judged is the orchestration: the real builds are proven by the tests above and by
    # every witness run. Three pins, two overlays between them, two builders.
    import threading

    base = tmp_path / "base"
    wants = {"0.1": {"transformers": "==5.3.0"}, "0.2": {"transformers": "==5.3.0"}, "0.3": {"transformers": "==5.8.1"}}
    built, running, overlapped = [], set(), []
    lock = threading.Lock()

    def build(base_path, wanted):
        with lock:
            running.add(wanted["transformers"])
            overlapped.append(len(running))
        time.sleep(0.3)
        with lock:
            running.discard(wanted["transformers"])
            built.append(wanted["transformers"])
        return tmp_path / wanted["transformers"]

    monkeypatch.setattr(cpu_envs, "base_env", lambda: base)
    monkeypatch.setattr(cpu_envs, "installed_versions", lambda env: {})
    monkeypatch.setattr(cpu_envs, "overlay_requirements", lambda pin, index, have: wants[pin.version])
    monkeypatch.setattr(cpu_envs, "overlay_env", build)
    pins = [type("P", (), {"version": v})() for v in wants]
    pythons = probe_runs.cpu_pythons(pins, jobs=2)
    assert sorted(built[:2]) == ["==5.3.0", "==5.8.1"] and max(overlapped) == 2
    assert [p.overlay for p in pythons] == list(wants.values())
