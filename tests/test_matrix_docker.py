"""The ROCm tier's docker path against a real, private docker engine.

No registry is reachable here, so a ``FROM scratch`` busybox image holding the pin's real sglang
kernel sources at /sgl-workspace/sglang stands in for the released ROCm image, and the GPU flags are
off. Everything else is the tier's own code: the patched image is built from it with the real
series applied inside, labelled; a container runs a check command against the patched checkout and
streams its log; clean-up removes only our containers. Skips, with the reason, where dockerd cannot
start.
"""

from __future__ import annotations

import io
import shutil
import subprocess
import tarfile

import pytest

from conftest import AUTHOR_ENV, REPO_ROOT, git
from docker_engine import EngineCannotStart, local_engine, standin_base_image
from sglpatch import matrix
from sglpatch.matrix import containers
from sglpatch.matrix import rocm as rocm_tier
from sglpatch.project import Project
from sglpatch.matrix.records import SKIPPED

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
    return matrix.prepare_pin(project, PIN)


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
                files[f"{containers.CHECKOUT}/{member.name}"] = tar.extractfile(member).read()
    return files


@pytest.fixture(scope="module")
def standin(engine, pin_under_test, tmp_path_factory):
    """The stand-in for lmsysorg/sglang:v0.5.14-rocm720-mi35x as sglang builds it: the checkout is
    a git repository and git is installed, so the series goes in with git apply."""
    files = _standin_files(pin_under_test)
    repo = tmp_path_factory.mktemp("checkout")
    for path, data in files.items():
        target = repo / path.removeprefix(containers.CHECKOUT + "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(data)
    git(repo, "init", "-q")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "pristine", env=AUTHOR_ENV)
    for path in sorted((repo / ".git").rglob("*")):
        if path.is_file():
            files[f"{containers.CHECKOUT}/{path.relative_to(repo)}"] = path.read_bytes()
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
    spec = rocm_tier.patched_image(pin_under_test, rocm_tier.RocmOptions(base_image=standin))
    applied = [o.name for o in pin_under_test.applied()]
    assert [name for name, _ in spec.patches] == applied
    assert applied[0] == "0001-amd-guard-cuda-runtime-include-fused-metadata-copy.patch"
    log: list[str] = []
    image_id = containers.build_image(engine, spec, log.append)
    for number, name in enumerate(applied, 1):
        assert any(f"applying {number:03d}_{name}" in line for line in log), (name, log)
    assert any("series applied" in line for line in log)
    # git apply where the checkout is a repository (sglang's images), GNU patch where it is not.
    assert any(line.startswith("patching file") for line in log) == (base == "standin_without_git"), log
    labels = engine.images.get(image_id).labels
    assert labels[containers.LABEL_PIN] == PIN
    assert labels[containers.LABEL_SERIES_VERSION] == pin_under_test.series_version
    assert labels[containers.LABEL_SERIES_HASH] == pin_under_test.series_hash
    assert labels[containers.LABEL_OWNER] == containers.OWNER

    # The check command runs in a container of the patched image: the guard is in the checkout.
    streamed: list[str] = []
    run = containers.run_check(
        engine,
        image_id,
        ["sh", "-c", f"grep -n 'ifndef USE_ROCM' {containers.CHECKOUT}/{KERNEL} && ls {containers.TOOLS_DIR}/checks"],
        {containers.LABEL_CELL: "test-build"},
        containers.RunOptions(gpu=False, network="none", timeout=120),
        streamed.append,
    )
    assert run.exit_code == 0, run.log
    assert "ifndef USE_ROCM" in run.log
    assert "build_check.py" in run.log and "serve_check.py" in run.log
    assert streamed and streamed == run.log.splitlines()
    # run_check removes its container.
    assert not engine.containers.list(all=True, filters={"label": f"{containers.LABEL_CELL}=test-build"})


def test_check_container_reports_a_failing_command_and_its_exit_code(engine, pin_under_test, standin):
    spec = rocm_tier.patched_image(pin_under_test, rocm_tier.RocmOptions(base_image=standin))
    image_id = containers.build_image(engine, spec, lambda line: None)
    pristine_guard = f"git -C {containers.CHECKOUT} diff --quiet"  # no git in the stand-in: fails
    run = containers.run_check(
        engine, image_id, ["sh", "-c", f"echo before; {pristine_guard}"], {},
        containers.RunOptions(gpu=False, network="none", timeout=120), lambda line: None,
    )
    assert run.exit_code not in (0, None)
    assert "before" in run.log


def test_a_patch_that_does_not_apply_fails_the_image_build_with_its_log(engine, pin_under_test):
    # A base without the kernel the patch changes: the series cannot apply, the build must fail.
    tag = standin_base_image(engine, "sglpatch-test/rocm-standin:empty", {f"{containers.CHECKOUT}/README": b"x\n"})
    spec = rocm_tier.patched_image(pin_under_test, rocm_tier.RocmOptions(base_image="sglpatch-test/rocm-standin:empty"))
    with pytest.raises(containers.BuildFailed) as failure:
        containers.build_image(engine, spec, lambda line: None)
    assert "001_0001-amd-guard-cuda-runtime-include-fused-metadata-copy.patch does not apply" in str(failure.value)
    assert tag


def test_clean_up_removes_only_containers_with_our_labels(engine, standin):
    foreign = engine.containers.create(standin, ["true"], labels={"someone.else": "1"})
    ours = engine.containers.create(
        standin, ["true"], labels={containers.LABEL_OWNER: containers.OWNER, containers.LABEL_CELL: "cell-a"}
    )
    other_cell = engine.containers.create(
        standin, ["true"], labels={containers.LABEL_OWNER: containers.OWNER, containers.LABEL_CELL: "cell-b"}
    )
    try:
        removed = containers.remove_ours(engine, {containers.LABEL_CELL: "cell-a"})
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
    options = rocm_tier.RocmOptions(base_image=standin, gpu=False, network="none", cell_timeout=120)
    monkeypatch.setattr(containers, "connect", lambda base_url=None, timeout=600: engine)
    record = rocm_tier.run_rocm_cell(project, matrix.Cell("rocm", "build", PIN), options, on_log=lambda line: None)
    assert record.image_digest.startswith("sha256:")
    assert record.image_digest == engine.images.get(containers.PatchedImage(
        standin, PIN, record.series_version, record.series_hash, ()).tag).id
    assert record.outcome == "failed", record
    log = open(record.log).read()
    # The build log streamed into the cell's log (the apply step itself may come from the layer
    # cache of the first test), then the container's refusal to start a missing python3.
    assert "apply-series.sh" in log and '"python3": executable file not found' in log
    assert not engine.containers.list(all=True, filters={"label": f"{containers.LABEL_CELL}={record.cell_id}"})


def test_rocm_cells_skip_with_the_reason_where_there_is_no_engine(project, tmp_path):
    options = rocm_tier.RocmOptions(gpu=False, docker_url=f"unix://{tmp_path}/no-engine.sock")
    record = rocm_tier.run_rocm_cell(project, matrix.Cell("rocm", "spec", PIN, 5), options, on_log=lambda line: None)
    assert record.outcome == SKIPPED
    assert "no docker engine" in record.reason


def test_rocm_cells_skip_with_the_reason_where_there_is_no_gpu(project):
    if rocm_tier.KFD.exists():
        pytest.skip("this machine has /dev/kfd: the no-GPU skip cannot be observed here")
    record = rocm_tier.run_rocm_cell(project, matrix.Cell("rocm", "load", PIN), rocm_tier.RocmOptions(), on_log=lambda l: None)
    assert record.outcome == SKIPPED
    assert "/dev/kfd" in record.reason


def test_sglpatch_image_builds_the_patched_image_and_prints_its_tag_and_labels(engine, project, standin, capsys):
    from sglpatch import cli

    code = cli.main(["-q", "--root", str(project.root), "image", PIN, "--image", standin, "--docker-url", engine.sglpatch_url])
    out = capsys.readouterr().out
    assert code == 0, out
    tag, image_id = out.splitlines()[0].split()
    assert tag.startswith(f"sglpatch/sglang:{PIN}-s") and image_id.startswith("sha256:")
    assert f"  {containers.LABEL_PIN}={PIN}" in out and f"  {containers.LABEL_BASE}={standin}" in out
    assert engine.images.get(tag).labels[containers.LABEL_PIN] == PIN


def test_apply_into_the_checkout_of_the_standin_image(engine, project, standin, tmp_path):
    """The released image's checkout, taken out of a container of the stand-in image, takes the
    series as commits with apply --into, as it would inside a running container."""
    from sglpatch.into import apply_into

    container = engine.containers.create(standin, ["true"], labels={containers.LABEL_OWNER: containers.OWNER})
    try:
        chunks, _ = container.get_archive(containers.CHECKOUT)
        with tarfile.open(fileobj=io.BytesIO(b"".join(chunks))) as tar:
            tar.extractall(tmp_path, filter="fully_trusted")
    finally:
        container.remove(force=True)
    checkout = tmp_path / containers.CHECKOUT.rsplit("/", 1)[-1]
    git(checkout, "config", "user.name", "In The Container")
    git(checkout, "config", "user.email", "root@container")
    done = apply_into(project, checkout, PIN)
    assert done.how == "git commits" and len(done.commits) == len(matrix.prepare_pin(project, PIN).applied())
    assert "#ifndef USE_ROCM" in (checkout / KERNEL).read_text()
    assert git(checkout, "log", "-1", "--format=%cn").strip() == "In The Container"
