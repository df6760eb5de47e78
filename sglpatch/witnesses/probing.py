"""What the CPU-probe witnesses (``mtp-quark-exclude``, ``rocm-flags``) share: the launch
profile's server arguments and environment they hand sglang, the code their answers rest on,
the doubles an answer names, and running them, uncached, in one child process per tree.
"""

from __future__ import annotations

from pathlib import Path

from sglpatch.plumbing.errors import Unavailable
from sglpatch.serving.profile import Profile
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import probe_runs
from sglpatch.witnesses.results import UNAVAILABLE, WitnessResult

DROP = "!"  # an argv item "!--flag" removes --flag (and its value) from the profile's arguments
# The CPU-probe witnesses' own code: they share one child process, so each one's answer rests on
# every one's requests as well as on this module.
WITNESS_CODE = tuple(Path(__file__).parent / name for name in ("probing.py", "mtp_exclude.py", "rocm_flags.py"))


def code_digest() -> str:
    """The CPU-probe witnesses' code, the probes' and how their child is started
    (``probe_runs.code_digest``)."""
    return probe_runs.code_digest(list(WITNESS_CODE))


def import_env(profile: Profile) -> tuple[tuple[str, str], ...]:
    """The environment sglang is imported under: the launch profile's, as the server is started."""
    return tuple(sorted(profile.env.items()))


def profile_argv(profile: Profile, model: str, edits: list[str]) -> list[str]:
    """The profile's ``launch_server`` arguments with the scenario's edits, for a CPU resolve."""
    args = profile.server_args(model)
    for edit in (e for e in edits if e.startswith(DROP)):
        flag = edit[len(DROP):]
        while flag in args:
            at = args.index(flag)
            takes_value = at + 1 < len(args) and not args[at + 1].startswith("--")
            del args[at : at + (2 if takes_value else 1)]
    # ServerArgs on CPU needs an explicit device; the emulation makes "cuda" mean the ROCm GPUs.
    return [*args, "--device", "cuda", *(e for e in edits if not e.startswith(DROP))]


def doubles_used(answer: dict) -> str:
    """The test doubles a CPU probe's answer rests on, in a few words for a witness's detail."""
    standins = ", ".join(s.split(" (")[0] for s in answer.get("standins") or []) or "none"
    called = sorted({c for case in (answer.get("cases") or {}).values() for c in case.get("standins_called") or []}
                    | set(answer.get("standins_called") or []))
    gpu = str(answer.get("emulated_gpu") or "?").split(":")[0]
    return f"doubles: emulated {gpu} node; stand-ins {standins}; called: {', '.join(called) or 'none'}"


def run_probe_witnesses(witnesses: list, tree: Path, pin: Pin) -> dict[str, WitnessResult]:
    """Run CPU-probe witnesses on one tree, uncached: those that share an import environment (and
    group: ``probe_runs.ProbeRequest``) in one child process. Every witness gets an answer; what could not run is ``unavailable``."""
    results: dict[str, WitnessResult] = {}
    try:
        python = probe_runs.cpu_python(pin)
    except Unavailable as exc:
        return {w.name: WitnessResult(w.name, UNAVAILABLE, detail=f"CPU environment: {exc}"[:1000]) for w in witnesses}
    groups: dict[tuple, list] = {}
    requests = {}
    for witness in witnesses:
        request = witness.probe_request(pin)
        requests[witness.name] = request
        groups.setdefault((request.environment(), request.group), []).append(witness)
    for group in groups.values():
        run = python.run_probes(tree, [requests[w.name] for w in group])
        for witness in group:
            name = requests[witness.name].name
            failure = run.failure(name)
            answer = run.answers.get(name)
            if answer is not None:
                answer.setdefault("runner", run.runner)
            results[witness.name] = witness.judge_probe(None if failure else answer, failure, pin)
    return results
