"""Witness ``mtp-quark-exclude``: the MTP draft must build the modules a Quark checkpoint keeps in
bf16 unquantized, load their full-width bf16 tensors, and not fuse an excluded shared expert into
its quantized routed experts.

A Quark MXFP4 checkpoint lists the modules it keeps in bf16 in ``quantization_config["exclude"]``
under the checkpoint's names, ``model.layers.{num_hidden_layers}.*`` for the MTP layer. sglang
builds that layer as ``model.decoder.*`` (and ``model.eh_proj`` ...), so an exclusion it does not
carry over misses, and the bf16 module gets a half-width MXFP4 slot; and where the draft fuses its
shared expert into the routed experts, an excluded (bf16) shared expert becomes one more MXFP4
expert (docs/research/mtp/NOTES.md says which release does what).

The check runs ``probes/mtp_probe.py`` in the pin's CPU Python (``sglpatch.witnesses.probe_runs``), in the one
child process per tree that all CPU witnesses share: sglang's own server args (the launch
profile, TP 1), model config, loader and draft class build the whole MTP draft for tiny
checkpoints that keep the MTP shared expert and ``eh_proj`` bf16, spelled two ways (``exact``:
the names Quark writes, the checkpoint's ``gate_proj``/``up_proj``/``down_proj``; ``regex``:
``re:`` patterns), once more with every routed expert of the MTP layer excluded too by its exact
names (``whole-moe``: the MTP layer's MoE all bf16, as upstream describes amd/GLM-5.2-MXFP4),
plus a control with nothing excluded; each case is built as launched and once
more with ``--disable-shared-experts-fusion``, each module is found under whatever prefix sglang
built it at, and the checkpoint's tensors go through the draft's own ``load_weights``.

The answer has a verdict per case (``WitnessResult.cases``), one per spelling and aspect:

- ``<spelling>/shared-expert-unquantized``: built with the fusion turned off, the draft's shared
  expert (``gate_up_proj``, ``down_proj``) is unquantized and its bf16 tensors load exactly;
- ``<spelling>/eh-proj-unquantized``: ``eh_proj`` is unquantized and loads exactly (as launched);
- ``<spelling>/draft-fusion-off`` (``exact``, ``regex``): as launched, on the emulated gfx950, the
  draft does not fuse its (excluded) shared expert into its quantized routed experts;
- ``whole-moe/routed-experts-unquantized``: as launched, the draft's routed experts (its fused
  MoE, judged by its quant method: no routed expert tensor is loaded) are unquantized;
- ``whole-moe/draft-fusion-kept``: as launched, the draft fuses its shared expert wherever it
  does with nothing excluded (the control): bf16 into bf16 needs no fusion turned off;
- ``control/not-excluded-quantized``: ``self_attn.o_proj`` (never excluded) is quantized in every
  build, and so are the control checkpoint's shared and routed experts.

Each is ``bug`` or ``clean``; the whole answer is ``bug`` when any case is, else ``clean``; every
case is ``unavailable`` (and so the answer) when the CPU environment cannot be had, the probe
failed or hung (the phase it was in is named), a module the check needs is not in a built draft,
a control fails (the probe cannot tell a fix from a draft that quantizes nothing), or a judged
module's values came through a stand-in (called while its tensors loaded, or built into the
module, its quant method or its weight). ``patches/tests/<patch>/cases.toml`` names the
regression tests that judge the same behaviour as each case.

Doubles (named in each answer): the GPU (HIP torch and triton reporting an 8x MI355X node), the
GPU-only packages (``probes/rocm_box.py``: named stand-ins for sgl_kernel, aiter, cuda-python;
torchvision), the draft built on the host (the emulated GPU holds no tensors) in a one-rank gloo
process group, and no ``process_weights_after_loading`` (GPU kernel layouts).

``resolve_mtp_modules`` is the same probe for any checkpoint folder (the test matrix's load cell);
``resolve_mtp_cases`` for several.
"""

from __future__ import annotations

from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError
from sglpatch.serving.profile import load_profile
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import cpu_envs, probe_runs
from sglpatch.witnesses import probing
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult

PROBE = "mtp"
PROBE_MODULE = "mtp_probe"
PROBE_LIMIT_S = 240
PROFILE = "glm-5.2-mxfp4-mi355x"
EXCLUDED_SPELLINGS = ("exact", "whole-moe", "regex")
CONTROL_SPELLING = "none"
# What each case judges, per spelling (see the module's docstring): where the routed experts stay
# quantized, whether the excluded shared expert is fused into them; where they are excluded too
# (``whole-moe``), that they are built unquantized and the draft keeps the fusion it has without
# any exclusion.
ASPECTS = ("shared-expert-unquantized", "eh-proj-unquantized", "draft-fusion-off")
WHOLE_MOE_ASPECTS = ("shared-expert-unquantized", "eh-proj-unquantized", "routed-experts-unquantized",
                     "draft-fusion-kept")
SPELLING_ASPECTS = {"exact": ASPECTS, "whole-moe": WHOLE_MOE_ASPECTS, "regex": ASPECTS}
CONTROL_CASE = "control/not-excluded-quantized"
CASES = (*(f"{spelling}/{aspect}" for spelling in EXCLUDED_SPELLINGS for aspect in SPELLING_ASPECTS[spelling]),
         CONTROL_CASE)
# The modules each spelling keeps bf16, and the control that is never excluded.
EXCLUDED_MODULES = ("shared_experts.gate_up_proj", "shared_experts.down_proj", "eh_proj")
SHARED_EXPERT = ("shared_experts.gate_up_proj", "shared_experts.down_proj")
ROUTED_EXPERTS = "routed_experts"  # the draft's fused MoE, judged by its quant method only
CONTROL_MODULE = "self_attn.o_proj"
CHECKED_MODULES = (*EXCLUDED_MODULES, ROUTED_EXPERTS, CONTROL_MODULE)
# What the model registry is asked for: the GLM-5 target and the draft class names ModelConfig
# gives it across the releases (``GlmMoeDsaForCausalLMNextN``, ``DeepseekV3ForCausalLMNextN``).
REGISTRY_ARCHS = ("GlmMoeDsaForCausalLM", "DeepseekV3ForCausalLMNextN")


class ProbeFailed(SglpatchError):
    """The probe ran but gave no answer; the message has its error."""


def probe_request(pin: Pin, cases: dict[str, Path] | None = None):
    """The MTP probe for ``probe_runs.CpuPython.run_probes``: the launch profile's server flags at
    TP 1 with the case's checkpoint as the model, under the profile's environment."""
    profile = load_profile(PROFILE)
    argv = probing.profile_argv(profile, "{model}", ["--tp-size", "1"])
    spec = {"argv": argv, "cases": {name: str(Path(folder).resolve()) for name, folder in cases.items()} if cases else None,
            "fusion_disabled_build": not cases}
    return probe_runs.ProbeRequest(PROBE, PROBE_MODULE, spec, PROBE_LIMIT_S, import_env=probing.import_env(profile),
                                   registry_archs=REGISTRY_ARCHS)


def resolve_mtp_cases(tree: Path, pin: Pin, cases: dict[str, Path]) -> dict:
    """What the pin's sglang builds for the MTP draft of each checkpoint folder in ``cases``
    (name -> folder holding ``config.json`` with a Quark ``quantization_config`` and
    ``*.safetensors``); the answer as ``resolve_mtp_modules`` describes it."""
    python = probe_runs.cpu_python(pin)
    run = python.run_probes(tree, [probe_request(pin, cases)], remember=True)
    failure = run.failure(PROBE)
    if failure:
        raise ProbeFailed(f"the MTP probe on {pin.version}: {failure}"[:2000])
    return _flatten(run.answers[PROBE], run.runner)


def resolve_mtp_modules(tree: Path, pin: Pin, *, checkpoint: Path | None = None) -> dict:
    """What the pin's sglang builds for the MTP draft layer, per module, and how its tensors load.

    ``tree`` is a checkout in upstream's layout (``python/sglang/...``). Without ``checkpoint`` the
    probe writes its own tiny checkpoints, one case per exclude-list spelling (``exact``,
    ``regex``, and ``none``, nothing excluded), each also built with the shared-experts fusion
    turned off (its ``fusion_disabled``, the same fields); with it (a folder holding
    ``config.json`` with a Quark ``quantization_config`` and ``*.safetensors``) there is one case,
    ``checkpoint``. The answer::

        {"sglang": ..., "draft_class": "GlmMoeDsaForCausalLMNextN", "emulated_gpu": "gfx950:...",
         "standins": [...], "import_s": 4.1, "total_s": 9.0,
         "cases": {case: {"draft_prefix": "model", "draft_quant_config": "QuarkConfig" | None,
                          "draft_class": ..., "exclude": [...], "draft_fusion": "on" | "off" | "unavailable: ...",
                          "standins_called": [...], "missing": [],
                          "modules": {"shared_experts.gate_up_proj": {
                              "prefix": "model.decoder.mlp.shared_experts.gate_up_proj",
                              "module": "model.decoder.mlp.shared_experts.gate_up_proj",
                              "checkpoint_names": [...], "quant_method": "UnquantizedLinearMethod",
                              "unquantized": True, "load": "ok", "load_detail": "..."}, ...}}}}

    ``prefix`` is what sglang asked the quant config about (the module's path where no quant
    config was asked); ``load`` is ``ok`` (loaded exactly), ``shape-mismatch`` (the loader refused
    a tensor its parameter cannot hold), ``silent-wrong`` (loaded without error into a narrower or
    other-typed parameter), ``not-loaded``, ``wrong-values``, ``fused`` (the draft built the module
    into its routed experts: ``fused_into`` names them), ``absent`` (no tensor for it in the
    checkpoint) or ``error`` (the loader failed on a tensor the parameter could hold). A case whose
    draft could not be built has ``error`` instead. Raises ``sglpatch.witnesses.cpu_envs.EnvUnavailable`` when
    the pin's CPU environment cannot be built and ``ProbeFailed`` when the probe gives no answer.
    """
    python = probe_runs.cpu_python(pin)
    cases = {"checkpoint": Path(checkpoint)} if checkpoint is not None else None
    run = python.run_probes(tree, [probe_request(pin, cases)], remember=True)
    failure = run.failure(PROBE)
    if failure:
        raise ProbeFailed(f"the MTP probe on {pin.version}: {failure}"[:2000])
    return _flatten(run.answers[PROBE], run.runner)


def _flatten(answer: dict, runner: dict) -> dict:
    seconds = runner.get("seconds", {})
    first = next((case for case in (answer.get("cases") or {}).values() if "draft_class" in case), {})
    return {**answer, "draft_class": first.get("draft_class"), "import_s": seconds.get("import"),
            "total_s": answer.get("seconds"), "runner": runner}


class MtpQuarkExcludeWitness:
    name = "mtp-quark-exclude"
    version = "4"

    def fingerprint(self, pin: Pin) -> str:
        profile = load_profile(PROFILE)
        code = probing.code_digest()
        return (f"{self.version}-{profile.name}-{profile.content_digest()[:16]}-{code[:16]}-"
                f"{cpu_envs.env_fingerprint(pin)[:16]}")

    def probe_request(self, pin: Pin):
        return probe_request(pin)

    def judge_probe(self, answer: dict | None, failure: str | None, pin: Pin) -> WitnessResult:
        if answer is None:
            return WitnessResult(self.name, UNAVAILABLE, detail=(failure or "no answer")[:1000])
        result = judge(answer, self.name)
        return WitnessResult(result.witness, result.state, result.level,
                             f"{result.detail} [{probing.doubles_used(answer)}]", cases=result.cases)

    def run(self, tree: Path, pin: Pin) -> WitnessResult:
        return probing.run_probe_witnesses([self], tree, pin)[self.name]


def judge(answer: dict, name: str = MtpQuarkExcludeWitness.name) -> WitnessResult:
    """The witness's answer from the probe's (see ``resolve_mtp_modules``), with a verdict per case."""
    gpu = str(answer.get("emulated_gpu", "")).split(":")[0]
    level = f"build+load {gpu}".strip()
    reason = cannot_tell(answer)
    if reason:
        return WitnessResult(name, UNAVAILABLE, level, reason[:1000], cases=dict.fromkeys(CASES, UNAVAILABLE))
    cases = answer["cases"]
    verdicts, found = {CONTROL_CASE: CLEAN}, []
    for spelling in EXCLUDED_SPELLINGS:
        for aspect, problems in aspect_problems(cases[spelling], spelling, cases[CONTROL_SPELLING]).items():
            verdicts[f"{spelling}/{aspect}"] = BUG if problems else CLEAN
            if problems:
                found.append(f"{spelling}/{aspect}: {'; '.join(problems)}")
    fusion = ", ".join(f"{spelling} {cases[spelling].get('draft_fusion')}"
                       for spelling in (*EXCLUDED_SPELLINGS, CONTROL_SPELLING))
    fusion += "; routed experts: " + ", ".join(
        f"{spelling} {_short(cases[spelling]['modules'][ROUTED_EXPERTS]['quant_method'])}"
        for spelling in (*EXCLUDED_SPELLINGS, CONTROL_SPELLING))
    if found:
        return WitnessResult(name, BUG, level, f"{' | '.join(found)} [draft fusion as launched: {fusion}]",
                             cases=verdicts)
    built = cases[EXCLUDED_SPELLINGS[0]]["fusion_disabled"]["modules"]
    prefixes = ", ".join(sorted({built[m]["prefix"] or "" for m in EXCLUDED_MODULES} - {""}))
    return WitnessResult(
        name, CLEAN, level,
        f"{', '.join(EXCLUDED_MODULES)} unquantized and loaded exactly for spellings {', '.join(EXCLUDED_SPELLINGS)} "
        f"(built as {prefixes}); {CONTROL_MODULE} stays {built[CONTROL_MODULE]['quant_method']} "
        f"[draft fusion as launched: {fusion}]", cases=verdicts)


def aspect_problems(case: dict, spelling: str = "exact", control: dict | None = None) -> dict[str, list[str]]:
    """One spelling's problems per aspect (an empty list: that aspect is clean). ``control`` is the
    case with nothing excluded: the fusion this release gives the draft without any exclusion."""
    unfused = case["fusion_disabled"]
    routed = case["modules"][ROUTED_EXPERTS]
    # A shared expert fused into unquantized routed experts is bf16 beside bf16: no bug.
    fused = [f"its shared expert fused into the {_short(got['quant_method'])} routed experts {got.get('fused_into')}"
             for module, got in case["modules"].items() if module in SHARED_EXPERT and got["load"] == "fused"
             and not routed["unquantized"]]
    found = {
        "shared-expert-unquantized": case_problems(unfused, SHARED_EXPERT),
        "eh-proj-unquantized": case_problems(case, ("eh_proj",)),
        "draft-fusion-off": fused[:1] if case.get("draft_fusion") == "on" else [],
        "routed-experts-unquantized": [] if routed["unquantized"] else
        [f"{ROUTED_EXPERTS} {_short(routed['quant_method'])} (excluded expert by expert)"],
        "draft-fusion-kept": ["the draft turned off the fusion it has with nothing excluded, though its shared "
                              "and routed experts are both unquantized"]
        if control is not None and control.get("draft_fusion") == "on" and case.get("draft_fusion") == "off" else [],
    }
    return {aspect: found[aspect] for aspect in SPELLING_ASPECTS[spelling]}


def cannot_tell(answer: dict) -> str:
    """Why the probe's answer proves nothing ("" when it can be judged)."""
    cases = answer.get("cases") or {}
    missing = [case for case in (*EXCLUDED_SPELLINGS, CONTROL_SPELLING) if case not in cases]
    if missing:
        return f"the probe answered no case for {', '.join(missing)}"
    builds = {case: cases[case] for case in cases}
    builds.update({f"{case} (fusion off)": cases[case].get("fusion_disabled") or
                   {"error": "no build with --disable-shared-experts-fusion"} for case in cases if "error" not in cases[case]})
    errors = [f"{case}: {found['error']}" for case, found in builds.items() if "error" in found]
    if errors:
        return "the draft could not be built: " + "; ".join(errors)[:900]
    # A module the check needs that is not in the built draft is a failure of the probe.
    absent = []
    for case, found in builds.items():
        modules = found.get("modules") or {}
        gone = [m for m in CHECKED_MODULES if m not in modules] + list(found.get("missing") or [])
        if gone:
            absent.append(f"{case}: {', '.join(dict.fromkeys(gone))}")
    if absent:
        return "the probe found no such module in the built draft: " + "; ".join(absent)
    unreadable = [f"{case}: {found.get('draft_fusion')}" for case, found in builds.items()
                  if found.get("draft_fusion") not in ("on", "off")]
    if unreadable:
        return "the draft's shared-expert fusion cannot be read: " + "; ".join(unreadable)
    still_fused = [case for case in cases if cases[case]["fusion_disabled"]["draft_fusion"] == "on"]
    if still_fused:
        return f"the draft fused its shared expert with --disable-shared-experts-fusion: {', '.join(still_fused)}"
    leaned = standins_leaned_on(builds)
    if leaned:
        return f"the judged modules rest on a stand-in, so their values are not sglang's alone: {leaned}"
    failed_loads = [f"{case}: {m} {got['load_detail']}" for case, found in builds.items()
                    if case.split(" ")[0] in EXCLUDED_SPELLINGS
                    for m, got in found["modules"].items()
                    if m in EXCLUDED_MODULES and got["load"] in ("error", "absent")]
    if failed_loads:
        return "the probe could not load a tensor: " + "; ".join(failed_loads)[:900]
    # Controls: without them a "clean" could mean the probe built nothing quantized at all.
    insane = [f"{case}: {CONTROL_MODULE} (never excluded) is not quantized"
              for case, found in builds.items() if found["modules"][CONTROL_MODULE]["unquantized"]]
    control = cases[CONTROL_SPELLING]["fusion_disabled"]["modules"]
    insane += [f"{CONTROL_SPELLING}: {module} is unquantized with nothing excluded"
               for module in (*SHARED_EXPERT, ROUTED_EXPERTS) if control[module]["unquantized"]]
    if insane:
        return "the probe cannot tell: " + "; ".join(insane)
    return ""


def standins_leaned_on(cases: dict) -> str:
    """Each judged module whose values came through a stand-in ("" when none): called while its
    tensors loaded, or built into it, its quant method or its weight. A stand-in called while the
    rest of the draft was built (the attention's rotary embedding) is listed in the answer's
    doubles and judges nothing."""
    found = []
    for case, answer in cases.items():
        for module, got in (answer.get("modules") or {}).items():
            if module not in CHECKED_MODULES:
                continue
            what = [f"called {c} while loading" for c in got.get("standins_called_in_load") or []]
            what += [f"its {part} is a stand-in" for part in got.get("standin_parts") or []]
            if what:
                found.append(f"{case} {module}: {', '.join(what)}")
    return "; ".join(found)


def case_problems(found: dict, modules: tuple[str, ...] = EXCLUDED_MODULES) -> list[str]:
    """What is wrong with one case's excluded modules: each one not built unquantized, or not
    loaded exactly (empty: all kept bf16 and loaded exactly)."""
    problems = []
    for module in modules:
        got = found["modules"][module]
        if got["load"] == "fused":
            problems.append(f"{module} fused into the {_short(got['quant_method'])} routed experts {got.get('fused_into')}")
        elif not got["unquantized"] or got["load"] != "ok":
            problems.append(f"{module} {_short(got['quant_method'])}/{got['load']}")
    return problems


def _short(method: str) -> str:
    """``QuarkLinearMethod(QuarkW4A4MXFP4)`` -> ``QuarkW4A4MXFP4``; others as they are."""
    return method[method.index("(") + 1 : -1] if method.endswith(")") and "(" in method else method
