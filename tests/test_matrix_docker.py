"""The ROCm tier's docker path against a real, private docker engine.

No registry is reachable here, so a ``FROM scratch`` busybox image holding the pin's real sglang
kernel sources at /sgl-workspace/sglang stands in for the released ROCm image, and the GPU flags are
off. Everything else is the tier's own code: the patched image is built from it with the real
series applied inside, labelled; a container runs a check command against the patched checkout and
streams its log; clean-up removes only our containers. For a pin's ROCm job the stand-in also holds
this machine's Python and a test double of sglang's server (``tests/rocm_standin/``), so the
in-image scripts run for real: the synthetic checkpoint written in the image by the CPU probes'
generator, mounted into every server container (the stand-in server reads its config and
safetensors header), one server container per launch configuration, shared by the checks that
launch it, four lanes at once. Skips, with the reason, where dockerd cannot start.
"""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from conftest import AUTHOR_ENV, REPO_ROOT, git
from docker_engine import EngineCannotStart, host_python, local_engine, standin_base_image
from sglpatch.apply.pin_under_test import prepare_pin
from sglpatch.matrix import job_plan, plan, rocm_judge
from sglpatch.matrix.cells import Cell
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED
from sglpatch.plumbing.project import Project
from sglpatch.rocm import constants, containers, image
from sglpatch.rocm.job import run_job, run_rocm_cell
from sglpatch.rocm.options import RocmOptions

pytestmark = pytest.mark.network  # the real pin's pristine tree comes from the package index

PIN = "0.5.14"  # a pin the series patches (the ROCm guard), in the tvm-ffi kernel layout
KERNEL = "python/sglang/jit_kernel/csrc/elementwise/fused_metadata_copy.cuh"


@pytest.fixture(scope="module")
def engine():
    try:
        with local_engine() as url:
            client = containers.connect(url)
            client.sglpatch_url = url  # for tests that hand the engine to the CLI
            yield client
    except EngineCannotStart as exc:
        pytest.skip(f"no local docker engine: {exc}")


@pytest.fixture(scope="module")
def project(tmp_path_factory):
    """The repository's pins, patches and lock in a scratch folder, so build/ lands there."""
    root = tmp_path_factory.mktemp("project")
    for part in ("upstream", "patches"):
        shutil.copytree(REPO_ROOT / part, root / part)
    shutil.copy(REPO_ROOT / "series.lock", root / "series.lock")
    return Project(root)


@pytest.fixture(scope="module")
def pin_under_test(project):
    return prepare_pin(project, PIN)


def _standin_files(put) -> dict[str, bytes]:
    """The pin's pristine JIT kernel folder and every other file the series changes on this pin,
    where sglang's images keep the checkout."""
    changed = subprocess.run(
        ["git", "diff", "--name-only", put.pristine_commit, put.patched_commit],
        cwd=put.tree_path, capture_output=True, text=True, check=True,
    ).stdout.split()
    archive = subprocess.run(
        ["git", "archive", put.pristine_commit, "python/sglang/jit_kernel", *changed],
        cwd=put.tree_path, capture_output=True, check=True,
    ).stdout
    files = {}
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        for member in tar.getmembers():
            if member.isfile():
                files[f"{constants.CHECKOUT}/{member.name}"] = tar.extractfile(member).read()
    return files


@pytest.fixture(scope="module")
def standin(engine, pin_under_test, tmp_path_factory):
    """The stand-in for lmsysorg/sglang:v0.5.14-rocm720-mi35x as sglang builds it: the checkout is
    a git repository and git is installed, so the series goes in with git apply."""
    files = _standin_files(pin_under_test)
    repo = tmp_path_factory.mktemp("checkout")
    for path, data in files.items():
        target = repo / path.removeprefix(constants.CHECKOUT + "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "pristine", env=AUTHOR_ENV)
    for path in sorted((repo / ".git").rglob("*")):
        if path.is_file():
            files[f"{constants.CHECKOUT}/{path.relative_to(repo)}"] = path.read_bytes()
    tag = f"sglpatch-test/rocm-standin:{PIN}"
    standin_base_image(engine, tag, files, programs=("git",))
    return tag


@pytest.fixture(scope="module")
def standin_without_git(engine, pin_under_test):
    """The same files without git (a plain folder): the series goes in with GNU patch, no fuzz."""
    tag = f"sglpatch-test/rocm-standin:{PIN}-nogit"
    standin_base_image(engine, tag, _standin_files(pin_under_test))
    return tag


@pytest.mark.parametrize("base", ["standin", "standin_without_git"])
def test_patched_image_applies_the_series_inside_and_carries_our_labels(engine, pin_under_test, base, request):
    standin = request.getfixturevalue(base)
    spec = image.patched_image(pin_under_test, RocmOptions(base_image=standin))
    applied = [o.name for o in pin_under_test.applied()]
    assert [name for name, _ in spec.patches] == applied
    assert applied[0] == "0001-amd-guard-cuda-runtime-include-fused-metadata-copy.patch"
    log: list[str] = []
    image_id = image.build_image(engine, spec, log.append)
    for number, name in enumerate(applied, 1):
        assert any(f"applying {number:03d}_{name}" in line for line in log), (name, log)
    assert any("series applied" in line for line in log)
    # git apply where the checkout is a repository (sglang's images), GNU patch where it is not.
    assert any(line.startswith("patching file") for line in log) == (base == "standin_without_git"), log
    labels = engine.images.get(image_id).labels
    assert labels[constants.LABEL_PIN] == PIN
    assert labels[constants.LABEL_SERIES_VERSION] == pin_under_test.series_version
    assert labels[constants.LABEL_SERIES_HASH] == pin_under_test.series_hash
    assert labels[constants.LABEL_OWNER] == constants.OWNER

    # The check command runs in a container of the patched image: the guard is in the checkout.
    streamed: list[str] = []
    run = containers.run_check(
        engine,
        image_id,
        ["sh", "-c", f"grep -n 'ifndef USE_ROCM' {constants.CHECKOUT}/{KERNEL} && ls {constants.TOOLS_DIR}/checks"],
        {constants.LABEL_CELL: "test-build"},
        containers.RunOptions(gpu=False, network="none", timeout=120),
        streamed.append,
    )
    assert run.exit_code == 0, run.log
    assert "ifndef USE_ROCM" in run.log
    assert "build_check.py" in run.log and "serve_check.py" in run.log
    assert streamed and streamed == run.log.splitlines()
    # run_check removes its container.
    assert not engine.containers.list(all=True, filters={"label": f"{constants.LABEL_CELL}=test-build"})


def test_check_container_reports_a_failing_command_and_its_exit_code(engine, pin_under_test, standin):
    """In a container of the stand-in image (tests/rocm_standin, no real sglang): the docker path alone."""
    spec = image.patched_image(pin_under_test, RocmOptions(base_image=standin))
    image_id = image.build_image(engine, spec, lambda line: None)
    pristine_guard = f"git -C {constants.CHECKOUT} diff --quiet"  # no git in the stand-in: fails
    run = containers.run_check(
        engine, image_id, ["sh", "-c", f"echo before; {pristine_guard}"], {},
        containers.RunOptions(gpu=False, network="none", timeout=120), lambda line: None,
    )
    assert run.exit_code not in (0, None)
    assert "before" in run.log


def test_a_patch_that_does_not_apply_fails_the_image_build_with_its_log(engine, pin_under_test):
    # A base without the kernel the patch changes: the series cannot apply, the build must fail.
    tag = standin_base_image(engine, "sglpatch-test/rocm-standin:empty", {f"{constants.CHECKOUT}/README": b"x\n"})
    spec = image.patched_image(pin_under_test, RocmOptions(base_image="sglpatch-test/rocm-standin:empty"))
    with pytest.raises(image.BuildFailed) as failure:
        image.build_image(engine, spec, lambda line: None)
    assert "001_0001-amd-guard-cuda-runtime-include-fused-metadata-copy.patch does not apply" in str(failure.value)
    assert tag


def test_clean_up_removes_only_containers_with_our_labels(engine, standin):
    """Containers of the stand-in image (tests/rocm_standin, no real sglang): only the clean-up is tested."""
    foreign = engine.containers.create(standin, ["true"], labels={"someone.else": "1"})
    ours = engine.containers.create(
        standin, ["true"], labels={constants.LABEL_OWNER: constants.OWNER, constants.LABEL_CELL: "cell-a"}
    )
    other_cell = engine.containers.create(
        standin, ["true"], labels={constants.LABEL_OWNER: constants.OWNER, constants.LABEL_CELL: "cell-b"}
    )
    try:
        removed = containers.remove_ours(engine, {constants.LABEL_CELL: "cell-a"})
        assert removed == [ours.id]
        remaining = {c.id for c in engine.containers.list(all=True)}
        assert foreign.id in remaining and other_cell.id in remaining
        assert containers.remove_ours(engine) == [other_cell.id]
        assert {c.id for c in engine.containers.list(all=True)} == {foreign.id}
    finally:
        foreign.remove(force=True)


def test_rocm_cell_runs_against_the_engine_and_records_the_image(engine, project, standin, monkeypatch):
    """The whole cell through the tier's entry point, GPU flags off, against the stand-in: the image
    is built and recorded, the check container runs, and its log lands in the cell's log. The
    stand-in has no Python, so the check itself must fail -- and say so -- rather than pass."""
    options = RocmOptions(base_image=standin, gpu=False, network="none", cell_timeout=120)
    monkeypatch.setattr(containers, "connect", lambda base_url=None, timeout=600: engine)
    record = run_rocm_cell(project, Cell("rocm", "build", PIN), options, on_log=lambda line: None)
    assert record.image_digest.startswith("sha256:")
    assert record.image_digest == engine.images.get(image.PatchedImage(
        standin, PIN, record.series_version, record.series_hash, ()).tag).id
    assert record.outcome == "failed", record
    # A cell alone is a job of one cell: the image's build log streamed into the job's log (the
    # apply step itself may come from the layer cache of the first test), the container's refusal
    # to start a missing python3 into the cell's log too.
    log = open(record.log).read()
    job_log = (Path(record.log).parent / f"rocm-job-build-{PIN}.log").read_text()
    assert "apply-series.sh" in job_log and '"python3": executable file not found' in log
    assert '"python3": executable file not found' in job_log
    assert not engine.containers.list(all=True, filters={"label": f"{constants.LABEL_CELL}={record.cell_id}"})


def test_rocm_cells_skip_with_the_reason_where_there_is_no_engine(project, tmp_path):
    options = RocmOptions(gpu=False, docker_url=f"unix://{tmp_path}/no-engine.sock")
    record = run_rocm_cell(project, Cell("rocm", "spec", PIN, 5), options, on_log=lambda line: None)
    assert record.outcome == SKIPPED
    assert "no docker engine" in record.reason


def test_rocm_cells_skip_with_the_reason_where_there_is_no_gpu(project):
    if constants.KFD.exists():
        pytest.skip("this machine has /dev/kfd: the no-GPU skip cannot be observed here")
    record = run_rocm_cell(project, Cell("rocm", "load", PIN), RocmOptions(), on_log=lambda l: None)
    assert record.outcome == SKIPPED
    assert "/dev/kfd" in record.reason


def test_sglpatch_image_builds_the_patched_image_and_prints_its_tag_and_labels(engine, project, standin, capsys):
    """FROM the stand-in image (tests/rocm_standin, no real sglang): the build and its labels."""
    from sglpatch import cli

    code = cli.main(["-q", "--root", str(project.root), "image", PIN, "--image", standin, "--docker-url", engine.sglpatch_url])
    out = capsys.readouterr().out
    assert code == 0, out
    tag, image_id = out.splitlines()[0].split()
    assert tag.startswith(f"sglpatch/sglang:{PIN}-s") and image_id.startswith("sha256:")
    assert f"  {constants.LABEL_PIN}={PIN}" in out and f"  {constants.LABEL_BASE}={standin}" in out
    assert engine.images.get(tag).labels[constants.LABEL_PIN] == PIN


def test_apply_into_the_checkout_of_the_standin_image(engine, project, standin, tmp_path):
    """The released image's checkout, taken out of a container of the stand-in image, takes the
    series as commits with apply --into, as it would inside a running container."""
    from sglpatch.apply.into import apply_into

    container = engine.containers.create(standin, ["true"], labels={constants.LABEL_OWNER: constants.OWNER})
    try:
        chunks, _ = container.get_archive(constants.CHECKOUT)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            tar.extractall(tmp_path, filter="fully_trusted")
    finally:
        container.remove(force=True)
    checkout = tmp_path / constants.CHECKOUT.rsplit("/", 1)[-1]
    git(checkout, "config", "user.name", "In The Container")
    git(checkout, "config", "user.email", "root@container")
    done = apply_into(project, checkout, PIN)
    assert done.how == "git commits" and len(done.commits) == len(prepare_pin(project, PIN).applied())
    assert "#ifndef USE_ROCM" in (checkout / KERNEL).read_text()
    assert git(checkout, "log", "-1", "--format=%cn").strip() == "In The Container"


# -- a pin's ROCm job: one server per launch configuration, shared by its checks ----------------

STANDIN_SGLANG = Path(__file__).parent / "rocm_standin" / "sglang"


@pytest.fixture(scope="module")
def standin_with_server(engine, pin_under_test):
    """The stand-in image with this machine's Python and the test double of sglang's server and
    GSM8K evaluation (``tests/rocm_standin/``) in its standard library folder; no torch, so the
    build cell's compile script cannot import it and must fail."""
    try:
        python = host_python()
    except EngineCannotStart as exc:
        pytest.skip(f"no Python for the stand-in image: {exc}")
    files = {**_standin_files(pin_under_test), **python.files}
    for path in sorted(STANDIN_SGLANG.rglob("*.py")):
        files[f"{python.stdlib}/sglang/{path.relative_to(STANDIN_SGLANG)}"] = path.read_bytes()
    tag = f"sglpatch-test/rocm-standin:{PIN}-server"
    standin_base_image(engine, tag, files, links=python.links, executables=(python.program,))
    return tag


def _standin_model(folder: Path, behaviour: dict) -> Path:
    """A model folder; the stand-in server reads how to behave from its standin.json."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "standin.json").write_text(json.dumps(behaviour))
    return folder


def _job_options(engine, image: str, model: Path, tmp_path: Path, **overrides) -> RocmOptions:
    (tmp_path / "hf").mkdir(exist_ok=True)
    settings = dict(base_image=image, model=str(model), hf_cache=tmp_path / "hf", docker_url=engine.sglpatch_url,
                    gpu=False, network="none", server_timeout=60, health_poll_s=0.2, cell_timeout=120)
    return RocmOptions(**{**settings, **overrides})


def _server_starts(project: Project) -> list[dict]:
    """What the stand-in server logged at each start, in the job's state folder."""
    path = project.build_dir / "matrix" / "rocm-state" / PIN / "standin-server-starts.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def _forget_server_starts(project: Project) -> None:
    (project.build_dir / "matrix" / "rocm-state" / PIN / "standin-server-starts.jsonl").unlink(missing_ok=True)


def _ours_left(engine) -> list:
    return engine.containers.list(all=True, filters={"label": constants.LABEL_JOB})


def test_a_pins_nightly_job_writes_the_synthetic_checkpoint_once_and_serves_it_in_lanes_to_every_check(
        engine, project, standin_with_server, tmp_path):
    """One pin's whole ROCm job against the stand-in (a test double of sglang's server, no GPU):
    the checkpoint written in the image by the CPU probes' generator, mounted into every server,
    read by each; one server per launch configuration, four lanes at once; every check of the job
    run and judged by the tier's own code."""
    _forget_server_starts(project)
    model = _standin_model(tmp_path / "model", {})  # the full model's folder: no nightly check may use it
    items = job_plan.items_for("nightly")
    seen: list[str] = []
    result = run_job(project, PIN, items, _job_options(engine, standin_with_server, model, tmp_path),
                              event="nightly", on_log=seen.append)

    # The checkpoint: written once, in the image (its Python has no transformers), then removed.
    job_record = json.loads(result.path.read_text())
    written = job_record["checkpoint"]
    assert written["folder"] == constants.CHECKPOINT_INSIDE and written["mtp_layer"] == 4 and "error" not in written
    assert written["config_from"] == "GLM-5's published fields (no GlmMoeDsaConfig in this Python)"
    assert sum(line.startswith("# writing the synthetic checkpoint") for line in seen) == 1
    assert not Path(written["host_folder"]).exists()

    # The servers the stand-in really started: one per distinct launch configuration, as many as
    # the CI plan counts, each on the mounted checkpoint, which it read: the config's MTP
    # exclusions and the safetensors header's bf16 MTP tensors, as the generator wrote them.
    started = _server_starts(project)
    groups = job_plan.job_groups(items, model=str(model))
    planned = sorted(tuple(launch.argv) for group in groups for launch in group.launches)
    assert sorted(tuple(start["argv"][:-4]) for start in started) == planned  # less --host and --port
    assert len(set(planned)) == len(started) == 7
    assert {start["SGLANG_USE_AITER"] for start in started} == {"1"}
    nightly = next(job for job in plan.plan(project, "nightly") if job.pin == PIN)
    assert len(nightly.launches) == len(started) == len(result.servers)
    mtp = "model.layers.4"
    for start in started:
        assert start["argv"][start["argv"].index("--model-path") + 1] == constants.CHECKPOINT_INSIDE
        assert start["model"]["architectures"] == ["GlmMoeDsaForCausalLM"] and start["model"]["quant_method"] == "quark"
        assert start["model"]["mtp_excluded"] == sorted(written["excluded"]) == sorted(
            [f"{mtp}.eh_proj", *(f"{mtp}.mlp.shared_experts.{p}_proj" for p in ("gate", "up", "down"))])
        assert start["model"]["tensors"] == written["tensors"] and start["model"]["bytes"] + 8 < written["bytes"]
        assert start["model"]["mtp_bf16"][f"{mtp}.mlp.shared_experts.gate_proj.weight"] == [512, 1024]
    # Four lanes, each its own GPUs and port, at once: every lane's first server started before
    # any lane's second.
    by_lane: dict[str, list[dict]] = {}
    for start in sorted(started, key=lambda start: start["time"]):
        by_lane.setdefault(start["HIP_VISIBLE_DEVICES"], []).append(start)
    assert sorted(by_lane) == ["0,1", "2,3", "4,5", "6,7"]
    assert max(lane[0]["time"] for lane in by_lane.values()) < min(lane[1]["time"] for lane in by_lane.values() if len(lane) > 1)
    assert {server["port"] for server in job_record["servers"]} == {30731, 31731, 32731, 33731}

    # One record per cell, on disk; load and depth 5 were served by one container.
    records = {record.cell_id: record for record in result.records}
    assert list(records) == [item.record_id(PIN) for item in items]
    for cell_id, record in records.items():
        on_disk = json.loads((project.build_dir / "matrix" / "records" / f"{cell_id}.json").read_text())
        assert on_disk["outcome"] == record.outcome and on_disk["image_digest"] == record.image_digest
    served = {cell_id: record.figures["server"]["container"] for cell_id, record in records.items() if "server" in record.figures}
    shipped = {served[f"rocm-load-{PIN}"], served[f"rocm-spec-{PIN}-d5"]}
    assert len(shipped) == 1
    others = {served[f"rocm-spec-{PIN}-d{depth}"] for depth in (1, 2, 3, 4, 6)}
    assert len(others) == 5 and not others & shipped
    assert records[f"rocm-load-{PIN}"].figures["server"]["shared_by"] == [f"load(rocm, {PIN})", f"spec(rocm, {PIN}, 5)"]

    # The checks ran against the stand-in and were judged by the tier's own code.
    for cell_id, record in records.items():
        if cell_id != f"rocm-build-{PIN}":
            assert record.outcome == PASSED, (cell_id, record.parts)
            assert record.figures["checkpoint"] == "synthetic"
    load = records[f"rocm-load-{PIN}"]
    flags = next(part for part in load.parts if part.name == rocm_judge.FLAGS_PART)
    assert "kv_cache_dtype='fp8_e4m3'" in flags.detail and "tp_size=2" in flags.detail
    assert any(part.name == rocm_judge.COMPILE_PART and part.outcome == PASSED for part in load.parts)
    spec5 = records[f"rocm-spec-{PIN}-d5"].figures
    assert spec5["accept_length"] == pytest.approx(sum(0.95**k for k in range(6)), abs=1e-3)
    assert spec5["prefix_match_mean"] == 1.0 and spec5["not_judged"] == ["accept_length", "prefix_match"]
    # The build cell runs in its own container, without a server, and the stand-in has no torch.
    build = records[f"rocm-build-{PIN}"]
    assert build.outcome == FAILED and "No module named 'torch'" in build.reason and "server" not in build.figures

    assert job_record["server_starts"] == 7 and job_record["image_digest"] == build.image_digest
    assert all(server["serving"] and server["checkpoint"] == "synthetic" for server in job_record["servers"])
    assert not _ours_left(engine)


def test_a_checkpoint_that_cannot_be_written_fails_the_synthetic_cells_and_starts_no_server(engine, project, standin, tmp_path):
    # The stand-in without Python: the generator cannot run in it.
    """Against the stand-in image (tests/rocm_standin): a GPU-free failure path no real server can show here."""
    _forget_server_starts(project)
    model = _standin_model(tmp_path / "model", {})
    result = run_job(project, PIN, [job_plan.Item("load")], _job_options(engine, standin, model, tmp_path),
                              on_log=lambda line: None)
    (load,) = result.records
    assert load.outcome == FAILED and "the synthetic checkpoint was not written" in load.reason
    assert '"python3": executable file not found' in load.reason
    assert result.servers[0]["serving"] is False and "container" not in result.servers[0]
    assert not _server_starts(project) and not _ours_left(engine)


@pytest.mark.parametrize("behaviour, load_fails, gate_fails", [
    ({"generate": "error"}, "one generate", "GSM8K"),
    ({"generate": "hang"}, "timed out", "timed out"),
    # The server died while held: the gate's check finds it unhealthy, or finds it stopped.
    ({"generate": "exit"}, "one generate", ("server healthy: not healthy", "the server stopped (container exit")),
    ({"start": "mismatch"}, "no shape mismatch in the server log", "the server exited with 1"),
])
def test_a_failing_check_fails_its_records_and_the_server_container_is_removed(
        engine, project, standin_with_server, tmp_path, behaviour, load_fails, gate_fails):
    """Against the stand-in server (tests/rocm_standin), made to fail: failure paths the real server on CPU cannot be asked for."""
    _forget_server_starts(project)
    model = _standin_model(tmp_path / "model", behaviour)
    # The matrix asked to serve the model folder (not the synthetic checkpoint): load and the gate share a server.
    options = _job_options(engine, standin_with_server, model, tmp_path, cell_timeout=4, matrix_model=str(model))
    result = run_job(project, PIN, [job_plan.Item("load"), job_plan.Item("accuracy")], options,
                              on_log=lambda line: None)
    assert len(_server_starts(project)) == len(result.servers) == 1  # load and the gate share it
    load, gate = result.records
    assert load.outcome == FAILED and load_fails in load.reason, load.reason
    assert gate.outcome == FAILED and any(why in gate.reason for why in (
        gate_fails if isinstance(gate_fails, tuple) else (gate_fails,))), gate.reason
    assert not _ours_left(engine)


def test_an_interrupted_job_still_removes_its_server_container(engine, project, standin_with_server, tmp_path):
    """Against the stand-in server (tests/rocm_standin): the clean-up of a job interrupted mid-way."""
    model = _standin_model(tmp_path / "model", {})
    seen: list[str] = []

    def interrupt_at_the_first_check(line: str) -> None:
        seen.append(line)
        if line.startswith(f"# rocm-load-{PIN}: against the server"):
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_job(project, PIN, [job_plan.Item("load")],
                         _job_options(engine, standin_with_server, model, tmp_path, matrix_model=str(model)),
                         on_log=interrupt_at_the_first_check)
    assert any('"serving": true' in line for line in seen)  # the server was up when the job was stopped
    assert not _ours_left(engine)


def test_a_spec_cell_alone_starts_its_baselines_once_then_reuses_them(engine, project, standin_with_server, tmp_path):
    """Against the stand-in server (tests/rocm_standin). For a person debugging one cell: the first run of spec depth 5 starts the baselines'
    servers and its own; a second run on the same image reuses the baselines."""
    _forget_server_starts(project)
    model = _standin_model(tmp_path / "model", {})
    options = _job_options(engine, standin_with_server, model, tmp_path)
    state = project.build_dir / "matrix" / "rocm-state" / PIN
    for old in state.glob("baseline-*.json"):
        old.unlink()
    cell = Cell("rocm", "spec", PIN, 5)
    first = run_rocm_cell(project, cell, options, on_log=lambda line: None)
    assert first.outcome == PASSED, first.parts
    launches = job_plan.Launches(str(model))
    # Two lanes at once: the baselines' server and depth 5's, in either order.
    assert sorted(start["argv"][:-4] for start in _server_starts(project)) == sorted([  # less --host and --port
        list(launches.plain().argv), list(launches.depth(5).argv)])
    second = run_rocm_cell(project, cell, options, on_log=lambda line: None)
    assert second.outcome == PASSED and len(_server_starts(project)) == 3
    assert second.figures["plain_decode_tok_s"] == first.figures["plain_decode_tok_s"]
    assert not _ours_left(engine)
