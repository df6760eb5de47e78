"""Witness ``rocm-flags``: what the pin's own ``ServerArgs`` makes of the GLM-5.2 MI355X profile.

The launch profile (``sglpatch/serving/profiles/glm-5.2-mxfp4-mi355x.toml``) is resolved by the pin's real
``ServerArgs`` on CPU, on an emulated 8x MI355X ROCm node (``probes/rocm_box.py``), for a
synthetic GLM-5-shaped model, in a handful of scenarios derived from the profile. The scenarios
run in ``probes/flags_probe.py``, in the one child process per tree that all CPU witnesses share
(``probe_runs.CpuPython.run_probes``), so sglang is imported once per tree.

It judges behaviour, never wording. It finds the bug (``bug``) when any of these fails, and
``clean`` when all hold:

- the profile resolves to the aiter all-reduce fusion on and an fp8_e4m3 KV cache on gfx950, and
  so do the profile's *defaults* (the profile without its explicit KV dtype and fusion flags):
  what a user gets without knowing the right flags;
- where the fusion is asked for but cannot engage (the profile itself, with
  ``--disable-custom-all-reduce``; SGLANG_USE_AITER unset; DP attention; TP 6), sglang emits a
  warning-level log record that names the flag (``--enable-aiter-allreduce-fusion`` or
  ``enable_aiter_allreduce_fusion``), whatever its words; and none when every gate is open;
- the KV cache stays bfloat16 on gfx942 and when the user asks for bfloat16.

Patch 0003's own wording of that warning is checked by its unit test
(``tests/test_patch_0003_wording.py``), not here: a fix upstream words it otherwise.

Doubles, named in the answer: the GPU (torch and triton report an 8x MI355X node), and the
GPU-only packages, stood in by name only for what sglang imports unguarded on a HIP box
(``rocm_box.NAMED``), so sglang's own feature probes (``feature_probes`` in the answer) answer as
without them; ``tests/test_witness_rocm_flags.py`` compares the judged values with a run whose
import sees no named stand-in.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

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

Scenario = tuple[list[str], dict[str, "str | None"]]

# name -> (argv edits over the profile, env edits over the profile's env)
SCENARIOS: dict[str, Scenario] = {
    "profile": ([], {}),
    "defaults": ([DROP + "--kv-cache-dtype", DROP + "--enable-aiter-allreduce-fusion"], {}),
    "custom-all-reduce": ([DROP + "--disable-custom-all-reduce"], {}),
    "no-SGLANG_USE_AITER": ([], {"SGLANG_USE_AITER": None}),
    "dp-attention": (["--enable-dp-attention", "--dp-size", "8"], {}),
    "tp6": (["--tp-size", "6"], {}),
    "user-bf16": (["--kv-cache-dtype", "bfloat16"], {}),
    "gfx942": ([DROP + "--kv-cache-dtype"], {ARCH_KEY: GFX942}),
}
# The flag, as users write it and as ServerArgs names the field: a warning about the inert
# fusion names one of them, in whatever words.
FLAG_NAMES = ("--enable-aiter-allreduce-fusion", "enable_aiter_allreduce_fusion")
# scenario -> (fusion, kv dtype, whether an sglang warning naming the flag must be there: True,
# must not be there: False, or either: None)
EXPECTED: dict[str, tuple[bool | None, str | None, bool | None]] = {
    "profile": (True, "fp8_e4m3", True),
    "defaults": (True, "fp8_e4m3", True),
    "custom-all-reduce": (True, "fp8_e4m3", False),
    "no-SGLANG_USE_AITER": (True, None, True),
    "dp-attention": (True, None, True),
    "tp6": (True, None, True),
    "user-bf16": (None, "bfloat16", None),
    "gfx942": (None, "bfloat16", None),
}
# Why the fusion cannot engage in each scenario that must warn (for the answer's words only).
CLOSED_GATE = {
    "profile": "--disable-custom-all-reduce",
    "defaults": "--disable-custom-all-reduce",
    "no-SGLANG_USE_AITER": "SGLANG_USE_AITER unset",
    "dp-attention": "DP attention",
    "tp6": "TP 6",
}


class RocmFlagsWitness:
    name = "rocm-flags"

    def __init__(self, profile: Profile | None = None):
        self.profile = profile or load_profile(PROFILE)
        self.version = f"2-{self.profile.name}-v{self.profile.version}"

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
                                 f"alone [{probing.doubles_used(answer)}]")
        result = judge(answer, self.name)
        return WitnessResult(result.witness, result.state, result.level, f"{result.detail} [{probing.doubles_used(answer)}]")

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
    """The witness's answer from the flags probe's (scenario -> resolved fields and records)."""
    resolved = answer.get("scenarios") or {}
    missing = [scenario for scenario in EXPECTED if scenario not in resolved]
    if missing:
        return WitnessResult(name, UNAVAILABLE, LEVEL, f"the probe answered no scenario {', '.join(missing)}")
    took = f"{len(resolved)} scenarios resolved in {answer.get('seconds', 0):.0f}s"
    # sglang raising while it resolves (or argparse refusing the profile's arguments) says
    # nothing about the defaults or the warning this witness judges: it cannot tell.
    raised = [f"{scenario}: {resolved[scenario]['error']}" for scenario in EXPECTED if resolved[scenario].get("error")]
    if raised:
        return WitnessResult(name, UNAVAILABLE, LEVEL,
                             f"the pin's ServerArgs raised while resolving, so it cannot tell: {'; '.join(raised)}"[:1000])
    failures = [f"{scenario}: {problem}" for scenario, problem in check(resolved)]
    if failures:
        return WitnessResult(name, BUG, LEVEL, "; ".join(failures) + f" ({took})")
    return WitnessResult(
        name, CLEAN, LEVEL,
        f"fusion on, fp8_e4m3 on gfx950 for the profile and its defaults; sglang warns naming the flag "
        f"wherever the fusion cannot engage, and not where it can ({took})")


def names_the_flag(record: dict) -> bool:
    return any(flag in record.get("message", "") for flag in FLAG_NAMES)


def inert_fusion_warnings(got: dict) -> list[str]:
    """sglang's warning-level log records (WARNING or above) that name the fusion flag."""
    return [r["message"] for r in got.get("log_records") or []
            if r.get("level") in ("WARNING", "ERROR", "CRITICAL") and names_the_flag(r)]


def check(resolved: dict[str, dict]) -> list[tuple[str, str]]:
    """(scenario, what is wrong) for every expectation that does not hold."""
    problems = []
    for name, (fusion, kv, warns) in EXPECTED.items():
        got = resolved.get(name)
        if got is None:
            problems.append((name, "not resolved"))
            continue
        if got["error"]:
            problems.append((name, f"rejected: {got['error']}"))
            continue
        if fusion is not None and got["enable_aiter_allreduce_fusion"] is not fusion:
            problems.append((name, f"fusion {got['enable_aiter_allreduce_fusion']}, want {fusion}"))
        if name == "defaults" and got.get("disable_aiter_allreduce_fusion_in_prefill") is False:
            problems.append((name, "fusion defaulted on for prefill too, want decode only"))
        if kv is not None and got["kv_cache_dtype"] != kv:
            problems.append((name, f"kv_cache_dtype {got['kv_cache_dtype']}, want {kv}"))
        inert = inert_fusion_warnings(got)
        if warns is False and inert:
            problems.append((name, f"warns although every gate is open: {inert[0]}"))
        elif warns is True and not inert:
            problems.append((name, f"silent: no warning naming {FLAG_NAMES[0]} although it cannot engage ({CLOSED_GATE[name]})"))
    return problems


def probe_request(profile: Profile, scenarios: dict[str, "Scenario"], workdir: Path, *, limit_s: float = PROBE_LIMIT_S):
    """The flags probe for ``probe_runs.CpuPython.run_probes``: each scenario as argv and environment
    over the profile's, for a synthetic GLM-5 model folder written in ``workdir``."""
    model = synthetic_model(workdir)
    spec = {
        "scenarios": {
            name: {
                "argv": probing.profile_argv(profile, str(model), argv),
                "env": {k: v for k, v in env.items() if k != ARCH_KEY},
                "arch": env.get(ARCH_KEY),
            }
            for name, (argv, env) in scenarios.items()
        },
    }
    return probe_runs.ProbeRequest(PROBE, "flags_probe", spec, limit_s, import_env=probing.import_env(profile), arch=MI355X,
                                   registry_archs=("GlmMoeDsaForCausalLM",))


def synthetic_model(workdir: Path) -> Path:
    """A folder holding the GLM-5 config.json (no weights: ServerArgs reads only the config),
    at a path named by its content so every run and tree shares it."""
    import hashlib

    text = json.dumps(GLM5_CONFIG, indent=1)
    folder = Path(workdir) / f"sglpatch-glm5-config-{hashlib.sha256(text.encode()).hexdigest()[:12]}"
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
