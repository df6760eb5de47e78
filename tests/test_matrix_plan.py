"""The ROCm CI plan and the workflow generated from it: jobs per event, which checks of a job share
a server (the grouping the job runner and the plan both use), node-hours, the committed workflow
equal to the generated one, and its rocm job fanning out over exactly what the plan says."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import yaml

from conftest import REPO_ROOT
from sglpatch.matrix import job_plan, plan, workflow
from sglpatch.matrix.cells import PROFILE
from sglpatch.plumbing.project import Project
from sglpatch.rocm import constants
from sglpatch.rocm.constants import ROCM_GPU
from sglpatch.serving.profile import load_profile

WORKFLOW = REPO_ROOT / ".github" / "workflows" / "matrix.yml"
PROJECT = Project(REPO_ROOT)
PINS = [pin.version for pin in PROJECT.pins().pins]
# 0001's older rendition (the main file, the newest, covers the newest pin).
GUARD = "patches/renditions/0001-amd-guard-cuda-runtime-include-fused-metadata-copy/0.5.16.patch"


def test_a_pull_request_runs_the_pins_whose_renditions_changed_and_the_newest():
    jobs = plan.plan(PROJECT, "pr", changed_files=[GUARD])
    series = PROJECT.series()
    guard = series.get("0001-amd-guard-cuda-runtime-include-fused-metadata-copy")
    expected = {v for v in PINS if guard.for_version(v) and guard.for_version(v).path == PROJECT.root / GUARD}
    assert expected and PINS[-1] not in expected  # the newest pin carries another rendition
    assert [job.pin for job in jobs] == [v for v in PINS if v in expected | {PINS[-1]}]
    assert [job.pin for job in plan.plan(PROJECT, "pr", changed_files=["README.md"])] == [PINS[-1]]
    assert [job.pin for job in plan.plan(PROJECT, "pr", changed_files=["patches/series"])] == PINS


def _nightly_by_hand(d: dict) -> float:
    """A nightly job's seconds worked out by hand from durations ``d``: the image, the build, the
    checkpoint, then four lanes at once; spec checks wait for the baselines (lane 0's first
    server: its start and both baselines)."""
    start = d["server-start-checkpoint"]
    ready = start + 2 * d["baseline"]
    lanes = [
        ready + start + d["spec"],  # no speculation (both baselines), then depth 3
        max(start + d["load"], ready) + d["spec"] + start + d["spec"],  # as shipped: load, depth 5; then depth 4
        max(start, ready) + d["spec"] + start + d["spec"],  # depth 1, then depth 6
        max(start, ready) + d["spec"],  # depth 2
    ]
    return d["image"] + d["build"] + d["checkpoint"] + max(lanes)


def test_nightly_runs_the_matrix_on_every_pin_weekly_the_gate_and_the_bench_on_the_newest():
    nightly = plan.plan(PROJECT, "nightly")
    assert [job.pin for job in nightly] == PINS
    job = nightly[0]
    assert job.sessions == [f"build(rocm, {job.pin})", f"load(rocm, {job.pin})",
                            *[f"spec(rocm, {job.pin}, {d})" for d in range(1, 7)]]
    # load and depth 5 launch the profile as shipped: one server start for both
    assert len(job.launches) == 7
    assert f"profile as shipped (synthetic checkpoint): load(rocm, {job.pin}), spec(rocm, {job.pin}, 5)" in job.launches
    defaults = plan.DEFAULT_SECONDS
    assert job.seconds == _nightly_by_hand(defaults)
    assert job.node_hours == round(job.seconds / 3600, 2)
    weekly = plan.plan(PROJECT, "weekly")
    assert [job.pin for job in weekly] == [PINS[-1]]
    assert weekly[0].sessions == [f"accuracy(rocm, {PINS[-1]})", f"bench(rocm, {PINS[-1]}, serving)",
                                  f"bench(rocm, {PINS[-1]}, single-stream)"]
    # the full model, one server at a time: the gate's; serving: one variant; single stream: as
    # shipped and custom-all-reduce, each its own default
    assert weekly[0].seconds == (defaults["image"] + defaults["accuracy"] + defaults["bench-serving"]
                                 + 2 * defaults["bench-single-stream"] + 4 * defaults["server-start"])


def test_the_plan_fits_a_team_budget_nightly_6_pr_0_5_a_job_weekly_8_node_hours():
    nightly, weekly = plan.plan(PROJECT, "nightly"), plan.plan(PROJECT, "weekly")
    assert sum(job.node_hours for job in nightly) <= 6
    assert all(job.node_hours <= 0.5 for job in plan.plan(PROJECT, "pr", changed_files=["patches/series"]))
    assert sum(job.node_hours for job in weekly) <= 8


def test_the_matrix_serves_the_synthetic_checkpoint_in_lanes_and_the_full_model_alone():
    groups = job_plan.job_groups(job_plan.items_for("nightly"))
    serverless, lanes = job_plan.phases(groups)
    assert [[step.kind for step in group.steps] for lane in serverless for group in lane] == [["build"]]
    assert len(lanes) == constants.NODE_GPUS // job_plan.SYNTHETIC_TP == 4
    assert lanes[0][0].baselines  # the baselines' server first, so the other lanes wait least
    assert all(launch.synthetic and launch.model == constants.CHECKPOINT_INSIDE
               and launch.argv[launch.argv.index("--tp-size") + 1] == str(job_plan.SYNTHETIC_TP)
               for lane in lanes for group in lane for launch in group.launches)
    assert {job_plan.lane_resources(lane) for lane in range(4)} == {
        ("0,1", 30731), ("2,3", 31731), ("4,5", 32731), ("6,7", 33731)}
    weekly = job_plan.phases(job_plan.job_groups(job_plan.items_for("weekly")))
    assert all(len(phase) == 1 and len(phase[0]) == 1 for phase in weekly)  # the whole node each
    assert not any(launch.synthetic for phase in weekly for group in phase[0] for launch in group.launches)
    # A model asked for the matrix: the profile as shipped (TP8), one server at a time, no checkpoint.
    full = job_plan.job_groups(job_plan.items_for("nightly"), matrix_model="/models/m")
    assert not job_plan.needs_checkpoint(full) and all(len(phase) == 1 for phase in job_plan.phases(full))


def _shares(event: str) -> dict[str, list[str]]:
    """Per server start of an event's job (by launch name): the steps it serves."""
    groups = job_plan.job_groups(job_plan.items_for(event))
    return {launch.name: [step.label("X") for step in group.steps] for group in groups for launch in group.launches}


def test_load_the_gate_and_depth_5_share_one_server_every_other_launch_its_own_in_each_event():
    on = " (synthetic checkpoint)"
    for event in ("pr", "nightly"):
        assert _shares(event) == {
            "no speculative decoding" + on: [job_plan.BASELINES["greedy"], job_plan.BASELINES["speed"]],
            "EAGLE depth 3" + on: ["spec(rocm, X, 3)"],
            "profile as shipped" + on: ["load(rocm, X)", "spec(rocm, X, 5)"],
            **{f"EAGLE depth {d}" + on: [f"spec(rocm, X, {d})"] for d in (1, 2, 4, 6)},
        }
        groups = job_plan.job_groups(job_plan.items_for(event))
        assert [step.label("X") for group in groups if not group.launches for step in group.steps] == ["build(rocm, X)"]
        assert groups[0].launches == ()  # the build needs no server and runs first
    # weekly: the gate on the full model, then the bench, one server per workload variant, as
    # bench_run.py starts them
    assert _shares("weekly") == {
        "profile as shipped": ["accuracy(rocm, X)"],
        "serving as-shipped": ["bench(rocm, X, serving)"],
        "single-stream as-shipped": ["bench(rocm, X, single-stream)"],
        "single-stream custom-all-reduce": ["bench(rocm, X, single-stream)"],
    }


def test_sharing_follows_from_equal_launch_configurations_not_from_names():
    launches = job_plan.Launches("/models/m", matrix_model="/models/m")
    shipped = launches.shipped()
    assert launches.depth(5) == shipped == launches.gate()  # equal argv and environment
    assert shipped.argv == tuple(load_profile(PROFILE).server_args("/models/m"))
    assert dict(shipped.env) == load_profile(PROFILE).env
    assert all(launches.depth(d) != shipped for d in (1, 2, 3, 4, 6))
    assert not any(arg.startswith("--speculative") for arg in launches.plain().argv)
    for event in plan.EVENTS:  # within a job, the job starts no configuration twice
        groups = job_plan.job_groups(job_plan.items_for(event))
        job = [launch for group in groups if group.steps[0].kind != "bench" for launch in group.launches]
        assert job and len(set(job)) == len(job)
    # Known, and counted by the estimate: the weekly gate launches what the single-stream bench's
    # as-shipped variant launches, and bench_run.py starts its own servers, so it starts twice.
    weekly = job_plan.job_groups(job_plan.items_for("weekly"))
    assert weekly[0].launches[0] == weekly[-1].launches[0] and job_plan.server_starts(weekly) == 4


def test_a_cell_alone_starts_only_the_servers_it_needs():
    def starts(*items, **known):
        return job_plan.server_starts(job_plan.job_groups(list(items), **known))

    assert starts(job_plan.Item("build")) == 0
    assert starts(job_plan.Item("load")) == 1
    assert starts(job_plan.Item("spec", 5)) == 2  # no speculation (both baselines), then depth 5
    assert starts(job_plan.Item("spec", 3)) == 2  # depth 3 is compared with the non-speculative decode too
    assert starts(job_plan.Item("spec", 5), baselines_known=True) == 1
    # The gate serves the full model; load and depth 5 the synthetic checkpoint, unless the matrix
    # is asked to serve the same model.
    assert starts(job_plan.Item("load"), job_plan.Item("accuracy"), job_plan.Item("spec", 5), baselines_known=True) == 2
    assert starts(job_plan.Item("load"), job_plan.Item("accuracy"), job_plan.Item("spec", 5), baselines_known=True,
                  model="/models/m", matrix_model="/models/m") == 1


def test_the_plan_counts_exactly_the_server_starts_of_the_jobs_grouping():
    for event in plan.EVENTS:
        groups = job_plan.job_groups(job_plan.items_for(event))
        for job in plan.plan(PROJECT, event):
            assert len(job.launches) == job_plan.server_starts(groups)
            assert job.groups == groups
        # One second more a start costs a second a start in turn: the full model's starts all,
        # the synthetic checkpoint's those of the longest lane (two).
        zero = {"server-start": 0.0, "server-start-checkpoint": 0.0}
        full = plan.estimate(event, PINS[-1], {**zero, "server-start": 1.0}).seconds - plan.estimate(event, PINS[-1], zero).seconds
        small = plan.estimate(event, PINS[-1], {**zero, "server-start-checkpoint": 1.0}).seconds - plan.estimate(event, PINS[-1], zero).seconds
        assert full == sum(len(group.launches) for group in groups if not group.synthetic)
        assert small == (2 if job_plan.needs_checkpoint(groups) else 0)


def test_recorded_durations_replace_the_defaults_and_the_plan_says_so(tmp_path):
    for check, seconds in (("build", 100.0), ("load", 1000.0), ("spec", 500.0), ("accuracy", 2000.0)):
        (tmp_path / f"{check}.json").write_text(json.dumps(
            {"tier": "rocm", "check": check, "pin": "0.5.23", "outcome": "passed", "seconds": seconds, "device": ROCM_GPU}))
    (tmp_path / "skipped.json").write_text(json.dumps({"tier": "rocm", "check": "spec", "outcome": "skipped", "seconds": 1,
                                                               "device": ROCM_GPU}))
    (tmp_path / "rocm-job-0.5.23-nightly.json").write_text(json.dumps({
        "kind": "rocm-job", "pin": "0.5.23", "device": ROCM_GPU, "image_s": 600.0, "checkpoint": {"seconds": 30.0},
        "servers": [{"serving": True, "seconds": 700.0, "checkpoint": "synthetic"},
                    {"serving": True, "seconds": 500.0, "checkpoint": "synthetic"},
                    {"serving": True, "seconds": 2000.0, "checkpoint": "model"}, {"serving": False, "seconds": 3.0}],
        "baselines": [{"seconds": 50.0, "error": ""}, {"seconds": 70.0, "error": ""}]}))
    job = plan.plan(PROJECT, "nightly", records_dir=tmp_path)[-1]
    recorded = {"image": 600, "build": 100, "checkpoint": 30, "server-start-checkpoint": 600, "load": 1000, "spec": 500,
                "baseline": 60}
    assert job.seconds == _nightly_by_hand(recorded)
    assert {"spec: recorded", "server-start-checkpoint: recorded", "image: recorded", "baseline: recorded",
            "checkpoint: recorded"} <= set(job.sources)
    weekly = plan.plan(PROJECT, "weekly", records_dir=tmp_path)[-1]
    assert weekly.figures["server-start"] == plan.RECORDED and weekly.figures["accuracy"] == plan.RECORDED
    assert weekly.seconds == 600 + 4 * 2000 + 2000 + plan.DEFAULT_SECONDS["bench-serving"] + 2 * plan.DEFAULT_SECONDS["bench-single-stream"]
    text = plan.render([job], "nightly")
    assert f"estimated {job.node_hours:.2f} node-hours" in text and 'nox -s "spec(rocm, 0.5.23, 5)"' in text
    assert 'nox -s "rocm-job(0.5.23)" -- --event nightly' in text


def _spec_only_records(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "spec.json").write_text(json.dumps({"tier": "rocm", "check": "spec", "pin": "0.5.23", "outcome": "passed",
                                                  "seconds": 500.0, "device": ROCM_GPU}))
    return folder


def test_a_plan_mixing_recorded_and_default_durations_says_which_are_which_as_an_estimate_everywhere(tmp_path):
    records = _spec_only_records(tmp_path / "records")
    jobs = plan.plan(PROJECT, "pr", records_dir=records)
    job = jobs[-1]
    assert job.figures["spec"] == plan.RECORDED
    assert {job.figures[key] for key in ("image", "server-start-checkpoint", "checkpoint", "build", "load", "baseline")} == {
        plan.DEFAULT}
    said = job.estimate_from()
    assert said == ("recorded durations: spec; stated defaults (sglpatch.matrix.plan.DEFAULT_SECONDS, not measured): "
                    "baseline, build, checkpoint, image, load, server-start-checkpoint")
    # text: the total and every job say "estimated", and the total says what it was estimated from
    text = plan.render(jobs, "pr")
    head, *rest = text.splitlines()
    assert f"estimated {sum(j.node_hours for j in jobs):.2f} node-hours (an estimate from {said})" in head
    assert all(line.startswith(f"- {j.id}: estimated ") for line, j in zip([l for l in rest if l.startswith("- ")], jobs))
    assert not re.search(r"(?<!estimated )\d+\.\d\d node-hours", text)  # no figure shown unlabelled
    # JSON (sglpatch matrix plan --json): estimates named as such, with their sources
    data = json.loads(subprocess.run([sys.executable, "-m", "sglpatch", "matrix", "plan", "--event", "pr", "--records",
                                      str(records), "--json"], cwd=REPO_ROOT, capture_output=True, text=True, check=True).stdout)
    assert "node_hours" not in data and data["estimated_node_hours"] == round(sum(j.node_hours for j in jobs), 2)
    assert data["estimate_from"] == said
    assert data["jobs"][-1]["estimated_node_hours"] == job.node_hours and data["jobs"][-1]["estimate_from"] == said
    assert data["jobs"][-1]["estimate_durations"]["spec"] == "recorded"
    # GitHub outputs: the job matrix carries the estimate's label and sources, never a bare figure
    include = json.loads(plan.github_outputs(jobs, plan.DEFAULT_RUNNER).splitlines()[0].removeprefix("jobs="))["include"]
    assert "node_hours" not in include[-1]
    assert include[-1]["estimated_node_hours"] == job.node_hours and include[-1]["estimate_from"] == said


def test_a_plan_from_defaults_alone_names_every_figure_a_default():
    job = plan.plan(PROJECT, "nightly", records_dir=None)[0]
    assert set(job.figures.values()) == {plan.DEFAULT}
    assert job.estimate_from().startswith("stated defaults (sglpatch.matrix.plan.DEFAULT_SECONDS, not measured): ")
    assert "recorded" not in plan.render([job], "nightly")


def _bench_record(folder: Path, workload: str, variant: str, run_seconds: list[float]) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"bench-{workload}-{variant}.json").write_text(json.dumps({
        "kind": "bench", "workload": workload, "variant": variant, "pin": "0.5.23", "device": ROCM_GPU,
        "runs": [{"rate": "single", "seconds": seconds} for seconds in run_seconds]}))


def test_single_stream_variants_are_recorded_and_estimated_separately_never_averaged(tmp_path):
    records = tmp_path / "records"
    _bench_record(records, "single-stream", "as-shipped", [1000.0])
    _bench_record(records, "single-stream", "custom-all-reduce", [3000.0])
    recorded = plan.recorded_seconds(records)
    assert recorded == {"bench-single-stream as-shipped": 1000.0, "bench-single-stream custom-all-reduce": 3000.0}
    job = plan.plan(PROJECT, "weekly", records_dir=records)[0]
    defaults = plan.DEFAULT_SECONDS
    # Both variants run, each its own server: 1000 + 3000 s, not their mean (2000) once.
    gate = defaults["server-start"] + defaults["accuracy"]
    assert job.seconds == defaults["image"] + gate + defaults["bench-serving"] + 1000 + 3000 + 3 * defaults["server-start"]
    assert job.figures["bench-single-stream as-shipped"] == job.figures["bench-single-stream custom-all-reduce"] == plan.RECORDED
    assert job.figures["bench-serving as-shipped"] == plan.DEFAULT
    # One variant recorded: the other keeps its default, and says so.
    (records / "bench-single-stream-custom-all-reduce.json").unlink()
    job = plan.plan(PROJECT, "weekly", records_dir=records)[0]
    assert job.seconds == (defaults["image"] + gate + defaults["bench-serving"] + 1000 + defaults["bench-single-stream"]
                           + 3 * defaults["server-start"])
    assert job.figures["bench-single-stream custom-all-reduce"] == plan.DEFAULT
    assert "recorded durations: bench-single-stream as-shipped;" in job.estimate_from()


def test_the_committed_workflow_is_the_generated_one():
    assert WORKFLOW.read_text() == workflow.workflow_yaml(), "run: sglpatch matrix plan --write-workflow .github/workflows/matrix.yml"


def _run_step(step: dict, tmp_path: Path, env_values: dict[str, str]) -> tuple[dict[str, str], str]:
    """Run a workflow step's shell script here, as the runner would, and read what it outputs."""
    output, summary = tmp_path / "github-output", tmp_path / "summary"
    output.write_text("")
    summary.write_text("")
    env = {**os.environ, "GITHUB_OUTPUT": str(output), "GITHUB_STEP_SUMMARY": str(summary),
           "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}
    for key in step.get("env", {}):
        env[key] = env_values.get(key, "")  # expressions such as ${{ vars.X }} are empty where nothing is configured
    script = step["run"].replace("python -m pip install --quiet -e .", "true")  # installed already here
    subprocess.run(["bash", "-eo", "pipefail", "-c", script], cwd=REPO_ROOT, env=env, check=True, capture_output=True)
    return dict(line.split("=", 1) for line in output.read_text().splitlines() if "=" in line), summary.read_text()


def test_the_rocm_jobs_fan_out_over_exactly_the_plan_one_job_per_pin(tmp_path):
    jobs = yaml.safe_load(WORKFLOW.read_text())["jobs"]
    rocm = jobs["rocm"]
    matrix_expr = re.fullmatch(r"\$\{\{ fromJSON\(needs\.([\w-]+)\.outputs\.(\w+)\) \}\}", rocm["strategy"]["matrix"])
    producer, output = matrix_expr.groups()
    step_ref = re.fullmatch(r"\$\{\{ steps\.([\w-]+)\.outputs\.(\w+) \}\}", jobs[producer]["outputs"][output])
    step = next(s for s in jobs[producer]["steps"] if s.get("id") == step_ref.group(1))
    for event_name, schedule, event in (("schedule", workflow.NIGHTLY_CRON, "nightly"),
                                        ("schedule", workflow.WEEKLY_CRON, "weekly"), ("push", "", "pr")):
        outputs, summary = _run_step(step, tmp_path, {"EVENT_NAME": event_name, "SCHEDULE": schedule})
        include = json.loads(outputs[step_ref.group(2)])["include"]
        expected = plan.plan(PROJECT, event, records_dir=REPO_ROOT / "build" / "matrix" / "records")
        assert [entry["id"] for entry in include] == [job.id for job in expected]
        assert [json.loads(entry["sessions"]) for entry in include] == [job.sessions for job in expected]
        assert [(entry["pin"], entry["event"]) for entry in include] == [(job.pin, event) for job in expected]
        assert f"ROCm CI plan for {event}" in summary
    runner = re.fullmatch(r"\$\{\{ fromJSON\(needs\.[\w-]+\.outputs\.(\w+)\) \}\}", rocm["runs-on"]).group(1)
    assert json.loads(outputs[runner]) == ["self-hosted", "linux-mi35x-gpu-8"]
    door = next(s for s in rocm["steps"] if "rocm-job" in s.get("run", ""))
    assert door["run"].strip() == 'python3 -m nox -s "rocm-job($PIN)" -- --event "$EVENT"'
    assert door["env"] == {"PIN": "${{ matrix.pin }}", "EVENT": "${{ matrix.event }}"}
    assert any("matrix-${{ matrix.id }}" == s.get("with", {}).get("name") for s in rocm["steps"])
    cpu_runs = [s.get("run", "") for s in jobs["cpu"]["steps"]]
    assert "nox -s cpu-tier" in cpu_runs and "nox -s tests" in cpu_runs and "nox -s apply" in cpu_runs


def test_every_planned_session_is_one_nox_lists():
    listing = subprocess.run([sys.executable, "-m", "nox", "-l", "--json", "-t", "rocm", "rocm-job"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True).stdout
    listed = {s["session"] for s in json.loads(listing)}
    jobs_only = subprocess.run([sys.executable, "-m", "nox", "-l", "--json", "-t", "rocm"], cwd=REPO_ROOT,
                               capture_output=True, text=True, check=True).stdout
    # nox -t rocm runs each check once, per cell; the jobs (the same checks) are tagged rocm-job only.
    assert not [s for s in json.loads(jobs_only) if s["session"].startswith("rocm-job(")]
    for event in plan.EVENTS:
        for job in plan.plan(PROJECT, event):
            assert set(job.sessions) <= listed, set(job.sessions) - listed
            assert f"rocm-job({job.pin})" in listed  # the door the workflow runs


def test_the_bench_and_the_gate_are_listed_for_every_pin_under_the_bench_tag():
    listing = subprocess.run([sys.executable, "-m", "nox", "-l", "--json", "-t", "bench"], cwd=REPO_ROOT,
                             capture_output=True, text=True, check=True).stdout
    listed = {s["session"]: s for s in json.loads(listing)}
    for pin in PINS:
        for name in (f"bench(rocm, {pin}, serving)", f"bench(rocm, {pin}, single-stream)", f"accuracy(rocm, {pin})"):
            assert listed[name]["tags"] == ["rocm", "bench"], name


def test_the_runner_labels_are_configurable():
    env = {**os.environ, "SGLPATCH_ROCM_RUNNER": "self-hosted, linux-mi30x-gpu-2"}
    out = subprocess.run([sys.executable, "ci/matrix_cells.py", "nightly"], cwd=REPO_ROOT, env=env,
                         capture_output=True, text=True, check=True).stdout
    runner = next(line for line in out.splitlines() if line.startswith("runner="))
    assert json.loads(runner.removeprefix("runner=")) == ["self-hosted", "linux-mi30x-gpu-2"]


def test_the_manual_states_exactly_what_sglpatch_matrix_plan_prints(tmp_path):
    """The manual's plan figures are the plan's own: the generated block of its CI page equals the
    first line `sglpatch matrix plan` prints for each event (no records: every figure a default),
    and every node-hour figure anywhere in the README or the manual is one the plan prints."""
    page = (REPO_ROOT / "docs" / "ci.md").read_text()
    text = "\n".join(path.read_text() for path in [REPO_ROOT / "README.md", *sorted((REPO_ROOT / "docs").rglob("*.md"))])
    block = page.split("<!-- sglpatch matrix plan: generated figures, kept equal by tests/test_matrix_plan.py -->\n")[1]
    block = block.split("<!-- end of generated figures -->")[0]
    empty = tmp_path / "no-records"
    empty.mkdir()
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "HOME": os.environ.get("HOME", str(tmp_path)),
           "LANG": "C.UTF-8", "PYTHONDONTWRITEBYTECODE": "1"}
    printed, expected = [], []
    for event in ("nightly", "pr", "weekly"):
        out = subprocess.run([sys.executable, "-m", "sglpatch", "matrix", "plan", "--event", event, "--records", str(empty)],
                             cwd=REPO_ROOT, capture_output=True, text=True, check=True, env=env, timeout=300).stdout
        printed += out.splitlines()
        expected += [f"$ sglpatch matrix plan --event {event}", out.splitlines()[0]]
    assert block == "```\n" + "\n".join(expected) + "\n```\n"
    figures = set(re.findall(r"(\d+\.\d\d) node-hours", "\n".join(printed)))
    assert set(re.findall(r"(\d+\.\d\d) node-hours", text)) <= figures
