"""Witness ``rocm-flags``: what the pin's own ``ServerArgs`` makes of the GLM-5.2 MI355X launch.

The launch profile (``sglpatch/serving/profiles/glm-5.2-mxfp4-mi355x.toml``: TP 8, EAGLE 5/1/6,
``--disable-custom-all-reduce``, ``SGLANG_USE_AITER=1``) is resolved by the pin's real ``ServerArgs``
on CPU, on an emulated 8x MI355X ROCm node (``probes/rocm_box.py``), for a synthetic GLM-5-shaped
model, in scenarios derived from it. The scenarios run in ``probes/flags_probe.py``, in the one
child process per tree that all CPU witnesses share (``probe_runs.CpuPython.run_probes``), so
sglang is imported once per tree.

It judges behaviour, never wording, case by case (``CASES``; each case's verdict is in the
answer's ``cases``, and ``patches/tests/<patch>/cases.toml`` names the regression tests that judge
the same behaviour). The fused aiter all-reduce + RMSNorm runs only with SGLANG_USE_AITER, on the
TP group's aiter custom all-reduce (not with ``--disable-custom-all-reduce``,
``SGLANG_USE_AITER_AR=0`` or ``SGLANG_USE_1STAGE_ALLREDUCE=1``), without DP attention and with TP
other than 6 (docs/research/flags/NOTES.md). A case is ``bug`` when:

- the launch as a user writes it without the fusion and KV flags (the profile without them) does
  not resolve the fusion off (0.5.21 on, the release turns on what cannot run there), or logs a
  warning naming a fusion flag it was not given, or does not resolve an fp8_e4m3 KV cache on
  gfx950, or logs that KV default for an "SM9" device instead of gfx950;
- where the fused kernel can run (custom all-reduce on), a release with GLM-5's decode-only
  default (0.5.21 on: it has the ``disable_aiter_allreduce_fusion_in_prefill`` field) does not
  turn the fusion on for decode only; a release without the field has no default to keep;
- that launch with one more condition (``default-*``: SGLANG_USE_AITER unset,
  SGLANG_USE_AITER_AR=0, the 1-stage all-reduce, DP attention, TP 6, deterministic inference,
  context parallelism) resolves the fusion on, warns about the flag it was not given (the
  deterministic-inference hook turning the default off again does), or is refused over it (the
  context-parallelism assertion: that error is judged, not taken as a scenario that could not run);
- ``--enable-aiter-allreduce-fusion`` under each condition above logs no warning-level record
  naming the flag and the condition (in whatever words), or warns where it can run; with
  deterministic inference it gets more than one warning; with context parallelism the launch is
  not refused, or a warning comes first;
- an explicit bfloat16 or gfx942 does not keep bfloat16, or DeepSeek-V3.2 gets fp8 on gfx950.

Patch 0003's own wording of that warning is checked by ``tests/test_patch_0003_wording.py``, not
here: a fix upstream words it otherwise.

Doubles, named in the answer: the GPU (torch and triton report an 8x MI355X node), and the
GPU-only packages, stood in by name only for what sglang imports unguarded on a HIP box
(``rocm_box.NAMED``), so sglang's own feature probes (``feature_probes`` in the answer) answer as
without them; ``tests/test_witness_rocm_flags.py`` compares the judged values with a run whose
import sees no named stand-in.
"""

from __future__ import annotations

import json
import re
import tempfile
from pathlib import Path
from typing import Callable

from sglpatch.plumbing import cache
from sglpatch.plumbing.errors import Unavailable
from sglpatch.serving.profile import Profile, load_profile
from sglpatch.sources.pins import Pin
from sglpatch.witnesses import cpu_envs, probe_runs
from sglpatch.witnesses import probing
from sglpatch.witnesses.probing import DROP
from sglpatch.witnesses.results import BUG, CLEAN, UNAVAILABLE, WitnessResult

PROFILE = "glm-5.2-mxfp4-mi355x"
PROBE = Path(__file__).parent / "probes" / "flags_probe.py"
GFX942 = "gfx942:sramecc+:xnack-"
# The emulated GPU for a scenario: an env entry that the probe reads and does not export.
ARCH_KEY = "SGLPATCH_GCN_ARCH"
TIMEOUT_S = 900
PROBE = "flags"
PROBE_LIMIT_S = 180
LEVEL = "server-args-cpu"  # the pin's ServerArgs resolved on CPU, ROCm emulated
MI355X = "gfx950:sramecc+:xnack-"

# A GLM-5 (GlmMoeDsaForCausalLM) config.json: the architecture, the DSA indexer fields that select
# sglang's sparse-attention path, the MTP layer count and shapes; no weights are ever read.
GLM5_CONFIG = {
    "architectures": ["GlmMoeDsaForCausalLM"],
    "model_type": "glm_moe_dsa",
    "attention_bias": False,
    "attention_dropout": 0.0,
    "hidden_act": "silu",
    "hidden_size": 6144,
    "intermediate_size": 12288,
    "moe_intermediate_size": 2048,
    "num_hidden_layers": 78,
    "num_attention_heads": 64,
    "num_key_value_heads": 64,
    "n_routed_experts": 256,
    "n_shared_experts": 1,
    "num_experts_per_tok": 8,
    "n_group": 1,
    "topk_group": 1,
    "routed_scaling_factor": 2.5,
    "norm_topk_prob": True,
    "first_k_dense_replace": 3,
    "kv_lora_rank": 512,
    "q_lora_rank": 2048,
    "qk_nope_head_dim": 192,
    "qk_rope_head_dim": 64,
    "v_head_dim": 256,
    "index_topk": 2048,
    "index_head_dim": 128,
    "index_n_heads": 32,
    "num_nextn_predict_layers": 1,
    "vocab_size": 154880,
    "max_position_embeddings": 202752,
    "rms_norm_eps": 1e-05,
    "rope_theta": 1000000,
    "tie_word_embeddings": False,
    "torch_dtype": "bfloat16",
    "bos_token_id": 0,
    "eos_token_id": [154820, 154827, 154829],
    "pad_token_id": 154820,
}

# DeepSeek-V3.2 (DeepseekV32ForCausalLM): the other DSA model, which keeps its bfloat16 default on
# gfx950. model_type deepseek_v3: every pinned transformers knows it (sglang keys on the
# architecture and index_topk).
DEEPSEEK_V32_CONFIG = {
    **{k: v for k, v in GLM5_CONFIG.items() if k not in ("architectures", "model_type")},
    "architectures": ["DeepseekV32ForCausalLM"],
    "model_type": "deepseek_v3",
}
# An argv item naming the DeepSeek-V3.2 model folder, filled in by ``probe_request``.
DEEPSEEK_V32_MODEL = "{deepseek-v32-model}"

Scenario = tuple[list[str], dict[str, "str | None"]]

FLAG = "--enable-aiter-allreduce-fusion"
# The launch as a user writes it without knowing the flags: the profile without them.
LAUNCH = [DROP + "--kv-cache-dtype", DROP + FLAG]
# The flag where only the scenario's condition keeps the fused kernel from running.
FLAG_ONLY = [DROP + "--kv-cache-dtype", DROP + "--disable-custom-all-reduce"]

# The same launch where the fused kernel can run (custom all-reduce on): where GLM-5's default
# applies, it turns the fusion on for decode; each "default-*" scenario adds one condition to it.
DEFAULT = [*LAUNCH, DROP + "--disable-custom-all-reduce"]
# Deterministic inference refuses the DSA attention backend; GLM-5 runs it on triton.
DETERMINISTIC = ["--enable-deterministic-inference", "--attention-backend", "triton"]
CONTEXT_PARALLEL = ["--attn-cp-size", "2"]

# Each condition that keeps the fused kernel from running, beyond the disabled custom all-reduce:
# as (argv edits, env edits) added to the default's launch and to the explicit flag's.
KEEPS_THE_FUSION_OFF: dict[str, Scenario] = {
    "no-SGLANG_USE_AITER": ([], {"SGLANG_USE_AITER": None}),
    "SGLANG_USE_AITER_AR-0": ([], {"SGLANG_USE_AITER_AR": "0"}),
    "1stage-allreduce": ([], {"SGLANG_USE_1STAGE_ALLREDUCE": "1"}),
    "dp-attention": (["--enable-dp-attention", "--dp-size", "8"], {}),
    "tp6": (["--tp-size", "6"], {}),
    "deterministic": (DETERMINISTIC, {}),
    "context-parallel": (CONTEXT_PARALLEL, {}),
}

# name -> (argv edits over the profile, env edits over the profile's env)
SCENARIOS: dict[str, Scenario] = {
    "launch": (LAUNCH, {}),
    "launch-custom-all-reduce": (DEFAULT, {}),
    **{f"default-{name}": ([*DEFAULT, *argv], env) for name, (argv, env) in KEEPS_THE_FUSION_OFF.items()},
    "flag": (FLAG_ONLY, {}),
    "flag-no-custom-all-reduce": ([DROP + "--kv-cache-dtype"], {}),
    **{f"flag-{name}": ([*FLAG_ONLY, *argv], env) for name, (argv, env) in KEEPS_THE_FUSION_OFF.items()},
    "launch-bf16": ([*LAUNCH, "--kv-cache-dtype", "bfloat16"], {}),
    "launch-gfx942": (LAUNCH, {ARCH_KEY: GFX942}),
    "deepseek-v32": ([*LAUNCH, "--model-path", DEEPSEEK_V32_MODEL], {}),
}
# The flag, as users write it and as ServerArgs names the field: a warning about the inert
# fusion names one of them, in whatever words.
FLAG_NAMES = (FLAG, "enable_aiter_allreduce_fusion")
# For each inert-flag scenario, what a warning must also name: the condition.
CONDITIONS = {
    "flag-no-custom-all-reduce": r"custom.all.reduce",
    "flag-no-SGLANG_USE_AITER": r"SGLANG_USE_AITER\b",
    "flag-SGLANG_USE_AITER_AR-0": r"SGLANG_USE_AITER_AR",
    "flag-1stage-allreduce": r"SGLANG_USE_1STAGE_ALLREDUCE",
    "flag-dp-attention": r"dp.attention",
    "flag-tp6": r"tp.size\D*6",
}


# What every release says when it refuses the fusion with context parallelism (its assertion in
# the context-parallelism hook): that refusal is judged, not taken as a scenario that could not run.
CONTEXT_PARALLEL_REFUSAL = re.compile(r"allreduce fusion is not supported with context parallelism", re.IGNORECASE)
# scenario -> the error it may end in that a case judges
JUDGED_ERRORS = {"default-context-parallel": CONTEXT_PARALLEL_REFUSAL, "flag-context-parallel": CONTEXT_PARALLEL_REFUSAL}


def _fusion_off(got: dict) -> str:
    return "" if got["enable_aiter_allreduce_fusion"] is False else (
        f"fusion {got['enable_aiter_allreduce_fusion']} where the fused kernel cannot run (--disable-custom-all-reduce)")


def _no_flag_warning(got: dict) -> str:
    inert = inert_fusion_warnings(got)
    return f"warns about a fusion flag it was not given: {inert[0]}" if inert else ""


def _kv(want: str):
    def check(got: dict) -> str:
        return "" if got["kv_cache_dtype"] == want else f"kv_cache_dtype {got['kv_cache_dtype']}, want {want}"
    return check


def _not_fp8(got: dict) -> str:
    # "auto" left as it is resolves to the model's dtype (releases whose DSA default skips the model).
    return f"kv_cache_dtype {got['kv_cache_dtype']}, want its non-fp8 default" if got["kv_cache_dtype"] == "fp8_e4m3" else ""


def _kv_log_names_gfx950(got: dict) -> str:
    lines = [r["message"] for r in got.get("log_records") or [] if "KV cache dtype" in r.get("message", "")]
    if not lines:
        return "no log line for the KV cache dtype default"
    wrong = [line for line in lines if "gfx950" not in line or re.search(r"\bSM9\b", line)]
    return f"logged for another device than gfx950: {wrong[0]}" if wrong else ""


def _default_where_it_runs(got: dict) -> str:
    if got.get("disable_aiter_allreduce_fusion_in_prefill") is None and got["enable_aiter_allreduce_fusion"] is False:
        # No per-phase field (before 0.5.21): the release has no GLM-5 fusion default to keep, and
        # nothing turned the fusion on.
        return ""
    if got["enable_aiter_allreduce_fusion"] is not True:
        return f"fusion {got['enable_aiter_allreduce_fusion']} where it runs, want on by default"
    if got.get("disable_aiter_allreduce_fusion_in_prefill") is not True:
        return "fusion defaulted on for prefill too, want decode only"
    return ""


def _warns_naming(condition: str):
    def check(got: dict) -> str:
        inert = inert_fusion_warnings(got)
        if not inert:
            return f"silent: no warning naming {FLAG} although it cannot run"
        if not any(re.search(condition, w, re.IGNORECASE) for w in inert):
            return f"its warning does not name why ({condition}): {inert[0]}"
        return ""
    return check


def _default_stays_off(got: dict) -> str:
    """No fusion flag given, where the fused kernel cannot run or a later hook refuses it: the
    launch resolves it off, is not refused over it, and warns about no flag it was not given."""
    if got.get("error"):
        return f"the launch is refused over a fusion it was not asked for: {got['error']}"
    if got["enable_aiter_allreduce_fusion"] is not False:
        return f"fusion {got['enable_aiter_allreduce_fusion']} where it cannot run"
    return _no_flag_warning(got)


def _warns_once_naming(condition: str):
    def check(got: dict) -> str:
        inert = inert_fusion_warnings(got)
        if len(inert) > 1:
            return f"{len(inert)} warnings naming {FLAG}, want one: {inert}"
        return _warns_naming(condition)(got)
    return check


def _refused_without_a_warning(got: dict) -> str:
    if not got.get("error"):
        return f"the flag with context parallelism was not refused (fusion {got['enable_aiter_allreduce_fusion']})"
    inert = inert_fusion_warnings(got)
    return f"warns before refusing: {inert[0]}" if inert else ""


def _quiet_where_it_runs(got: dict) -> str:
    inert = inert_fusion_warnings(got)
    if inert:
        return f"warns although the fused kernel can run: {inert[0]}"
    return "" if got["enable_aiter_allreduce_fusion"] is True else "the flag did not resolve the fusion on"


# case -> (scenario, check: resolved scenario -> "" when the behaviour holds, else what is wrong)
CASES: dict[str, tuple[str, Callable[[dict], str]]] = {
    "launch-fusion-off-without-custom-all-reduce": ("launch", _fusion_off),
    "launch-no-warning-about-an-unpassed-flag": ("launch", _no_flag_warning),
    "launch-kv-fp8-on-gfx950": ("launch", _kv("fp8_e4m3")),
    "launch-kv-log-names-gfx950": ("launch", _kv_log_names_gfx950),
    "default-fusion-on-for-decode-where-it-runs": ("launch-custom-all-reduce", _default_where_it_runs),
    **{f"{scenario}-stays-off": (scenario, _default_stays_off) for scenario in SCENARIOS
       if scenario.startswith("default-")},
    **{f"{scenario}-warns": (scenario, _warns_naming(condition)) for scenario, condition in CONDITIONS.items()},
    "flag-deterministic-warns-once": ("flag-deterministic", _warns_once_naming(r"determinis")),
    "flag-context-parallel-refused": ("flag-context-parallel", _refused_without_a_warning),
    "flag-quiet-where-it-runs": ("flag", _quiet_where_it_runs),
    "explicit-bf16-kept": ("launch-bf16", _kv("bfloat16")),
    "gfx942-keeps-bf16": ("launch-gfx942", _kv("bfloat16")),
    "deepseek-v32-not-fp8-on-gfx950": ("deepseek-v32", _not_fp8),
}


class RocmFlagsWitness:
    name = "rocm-flags"

    def __init__(self, profile: Profile | None = None):
        self.profile = profile or load_profile(PROFILE)
        self.version = f"4-{self.profile.name}-v{self.profile.version}"

    def fingerprint(self, pin: Pin) -> str:
        code = probing.code_digest()
        return f"{self.version}-{self.profile.content_digest()[:16]}-{code[:16]}-{cpu_envs.env_fingerprint(pin)[:16]}"

    def probe_request(self, pin: Pin):
        return probe_request(self.profile, SCENARIOS, cache.cache_root() / "probes")

    def judge_probe(self, answer: dict | None, failure: str | None, pin: Pin) -> WitnessResult:
        if answer is None:
            return WitnessResult(self.name, UNAVAILABLE, detail=(failure or "no answer")[:1000])
        leaned = standins_leaned_on(answer)
        if leaned:
            return WitnessResult(self.name, UNAVAILABLE, LEVEL,
                                 f"the judged resolution used a stand-in ({leaned}), so its values are not sglang's "
                                 f"alone [{probing.doubles_used(answer)}]", cases=dict.fromkeys(CASES, UNAVAILABLE))
        result = judge(answer, self.name)
        return WitnessResult(result.witness, result.state, result.level, f"{result.detail} [{probing.doubles_used(answer)}]",
                             cases=result.cases)

    def run(self, tree: Path, pin: Pin) -> WitnessResult:
        return probing.run_probe_witnesses([self], tree, pin)[self.name]


# The one attribute sglang reads from the stand-ins besides ``from module import name``: the
# aiter.QuantType enum, taken as a constant at the top level of fp8_utils.
READS_ALLOWED = ("aiter.QuantType (read at ",)


def standins_leaned_on(answer: dict) -> str:
    """What of the stand-ins sglang called, or read other than as an import, while the scenarios
    resolved ("" when nothing): every answer proves its judged values are sglang's own."""
    called = list(answer.get("standins_called") or [])
    reads = [r for r in answer.get("standin_reads") or [] if not (r.startswith(READS_ALLOWED) and r.endswith(", module level)"))]
    return "; ".join([*(f"called {c}" for c in called), *(f"read {r}" for r in reads)])


class WitnessUnavailable(Unavailable):
    pass


def judge(answer: dict, name: str = RocmFlagsWitness.name) -> WitnessResult:
    """The witness's answer from the flags probe's (scenario -> resolved fields and records):
    a verdict per case in ``cases``, and ``bug`` when a case is one, ``clean`` when every case is;
    ``unavailable`` when a scenario is missing or sglang raised while resolving it (that says
    nothing about what this witness judges), its cases marked so."""
    resolved = answer.get("scenarios") or {}
    took = f"{len(resolved)} scenarios resolved in {answer.get('seconds', 0):.0f}s"
    cases, problems, unresolved = {}, [], []
    for case, (scenario, check_case) in CASES.items():
        got = resolved.get(scenario)
        judged = JUDGED_ERRORS.get(scenario)
        if got is None or (got.get("error") and not (judged and judged.search(got["error"]))):
            cases[case] = UNAVAILABLE
            why = "not answered" if got is None else got["error"]
            unresolved.append(f"{scenario}: {why}")
            continue
        problem = check_case(got)
        cases[case] = BUG if problem else CLEAN
        if problem:
            problems.append(f"{case}: {problem}")
    if unresolved:
        detail = f"the pin's ServerArgs could not resolve, so it cannot tell: {'; '.join(dict.fromkeys(unresolved))}"
        return WitnessResult(name, UNAVAILABLE, LEVEL, detail[:1000], cases=cases)
    if problems:
        return WitnessResult(name, BUG, LEVEL, f"{'; '.join(problems)} ({took})"[:2000], cases=cases)
    return WitnessResult(
        name, CLEAN, LEVEL,
        f"GLM-5: fp8_e4m3 on gfx950, logged for gfx950; the fusion off where it cannot run and on for decode where "
        f"it can; the flag warns under each condition that keeps it from running, and not where it runs ({took})",
        cases=cases)


def names_the_flag(record: dict) -> bool:
    return any(flag in record.get("message", "") for flag in FLAG_NAMES)


def inert_fusion_warnings(got: dict) -> list[str]:
    """sglang's warning-level log records (WARNING or above) that name the fusion flag."""
    return [r["message"] for r in got.get("log_records") or []
            if r.get("level") in ("WARNING", "ERROR", "CRITICAL") and names_the_flag(r)]


def probe_request(profile: Profile, scenarios: dict[str, "Scenario"], workdir: Path, *, limit_s: float = PROBE_LIMIT_S):
    """The flags probe for ``probe_runs.CpuPython.run_probes``: each scenario as argv and environment
    over the profile's, for a synthetic GLM-5 model folder written in ``workdir``."""
    model = synthetic_model(workdir)
    deepseek_v32 = str(synthetic_model(workdir, DEEPSEEK_V32_CONFIG))
    spec = {
        "scenarios": {
            name: {
                "argv": [deepseek_v32 if a == DEEPSEEK_V32_MODEL else a
                         for a in probing.profile_argv(profile, str(model), argv)],
                "env": {k: v for k, v in env.items() if k != ARCH_KEY},
                "arch": env.get(ARCH_KEY),
            }
            for name, (argv, env) in scenarios.items()
        },
    }
    return probe_runs.ProbeRequest(PROBE, "flags_probe", spec, limit_s, import_env=probing.import_env(profile), arch=MI355X,
                                   registry_archs=("GlmMoeDsaForCausalLM", "DeepseekV32ForCausalLM"))


def synthetic_model(workdir: Path, config: dict | None = None) -> Path:
    """A folder holding a config.json (GLM-5's unless told; no weights: ServerArgs reads only the
    config), at a path named by its content so every run and tree shares it."""
    import hashlib

    config = config or GLM5_CONFIG
    text = json.dumps(config, indent=1)
    kind = config["model_type"].replace("_", "-")
    folder = Path(workdir) / f"sglpatch-{kind}-config-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
    if not (folder / "config.json").is_file() or (folder / "config.json").read_text() != text:
        folder.mkdir(parents=True, exist_ok=True)
        tmp = folder / f".config.json.{id(text)}.tmp"
        tmp.write_text(text)
        tmp.replace(folder / "config.json")
    return folder


def resolve_server_args(
    tree: Path,
    pin: Pin,
    scenarios: dict[str, Scenario],
    *,
    profile: Profile | None = None,
    timeout: float = TIMEOUT_S,
) -> dict[str, dict]:
    """Resolve the pin's ``ServerArgs`` for each scenario: the profile's flags plus the scenario's.

    A scenario is (argv, env): ``argv`` is appended to the profile's arguments (argparse keeps the
    last value of a repeated flag) and an item ``"!--flag"`` removes ``--flag`` from them; ``env``
    updates the profile's environment, a value of None unsets the variable, and
    ``SGLPATCH_GCN_ARCH`` picks the emulated GPU (default gfx950, MI355X). Returns, per scenario,
    the resolved fields (``speculative_*``, ``enable_aiter_allreduce_fusion``, ``kv_cache_dtype``,
    ...), ``log_records`` (sglang's records of WARNING and above: level, logger, message),
    ``warnings`` (those and Python warnings, as text) and ``error`` (None unless ServerArgs
    rejected the arguments). Raises ``WitnessUnavailable`` when the pin's CPU env cannot be had
    or the probe gives no answer.
    """
    profile = profile or load_profile(PROFILE)
    try:
        python = probe_runs.cpu_python(pin)
    except Unavailable as exc:
        raise WitnessUnavailable(f"no CPU Python for {pin.version}: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="sglpatch-flags-") as work:
        request = probe_request(profile, scenarios, Path(work), limit_s=timeout)
        run = python.run_probes(tree, [request], timeout=timeout + probe_runs.IMPORT_ALLOWANCE_S, remember=True)
    failure = run.failure(PROBE)
    if failure:
        raise WitnessUnavailable(f"the flags probe on {pin.version}: {failure}"[:2000])
    return run.answers[PROBE]["scenarios"]
