"""Witness ``rocm-flags``: what the pin's own ``ServerArgs`` makes of the GLM-5.2 MI355X profile.

The launch profile (``sglpatch/profiles/glm-5.2-mxfp4-mi355x.toml``) is resolved by the pin's real
``ServerArgs`` on CPU, on an emulated 8x MI355X ROCm node (``probes/hip_emulation.py``), for a
synthetic GLM-5-shaped model, in a handful of scenarios derived from the profile. All scenarios
run in one child process (``probes/flags_probe.py``), so sglang is imported once per tree.

It finds the bug (``bug``) when any of these fails, and ``clean`` when all hold:

- the profile resolves to the aiter all-reduce fusion on and an fp8_e4m3 KV cache on gfx950, and
  so do the profile's *defaults* (the profile without its explicit KV dtype and fusion flags):
  what a user gets without knowing the right flags;
- where the fusion is on but cannot run, a warning says so and names why: the profile itself
  (``--disable-custom-all-reduce``), SGLANG_USE_AITER unset, DP attention, TP 6; and no such
  warning when every gate is open;
- the KV cache stays bfloat16 on gfx942 and when the user asks for bfloat16.
"""

from __future__ import annotations

import json
import re
import tempfile
import time
from pathlib import Path

from sglpatch.pins import Pin
from sglpatch.profile import Profile, load_profile
from sglpatch.witnesses import BUG, CLEAN, UNAVAILABLE, WitnessResult

PROFILE = "glm-5.2-mxfp4-mi355x"
PROBE = Path(__file__).parent / "probes" / "flags_probe.py"
GFX942 = "gfx942:sramecc+:xnack-"
# The emulated GPU for a scenario: an env entry that the probe reads and does not export.
ARCH_KEY = "SGLPATCH_GCN_ARCH"
DROP = "!"  # an argv item "!--flag" removes --flag (and its value) from the profile's arguments
TIMEOUT_S = 900
LEVEL = "server-args-cpu"  # the pin's ServerArgs resolved on CPU, ROCm emulated

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
INERT = "--enable-aiter-allreduce-fusion"  # every inert-fusion warning names the flag
# scenario -> (fusion, kv dtype, reason the inert-fusion warning must name, or False for none)
EXPECTED: dict[str, tuple[bool | None, str | None, str | bool | None]] = {
    "profile": (True, "fp8_e4m3", "--disable-custom-all-reduce"),
    "defaults": (True, "fp8_e4m3", "--disable-custom-all-reduce"),
    "custom-all-reduce": (True, "fp8_e4m3", False),
    "no-SGLANG_USE_AITER": (True, None, "SGLANG_USE_AITER"),
    "dp-attention": (True, None, "DP attention"),
    "tp6": (True, None, "tp_size is 6"),
    "user-bf16": (None, "bfloat16", None),
    "gfx942": (None, "bfloat16", None),
}


class RocmFlagsWitness:
    name = "rocm-flags"

    def __init__(self, profile: Profile | None = None):
        self.profile = profile or load_profile(PROFILE)
        # Cached answers must change when the profile does.
        self.version = f"1-{self.profile.name}-v{self.profile.version}"

    def run(self, tree: Path, pin: Pin) -> WitnessResult:
        started = time.monotonic()
        try:
            resolved = resolve_server_args(tree, pin, SCENARIOS, profile=self.profile)
        except WitnessUnavailable as exc:
            return WitnessResult(self.name, UNAVAILABLE, detail=str(exc))
        failures = [f"{name}: {problem}" for name, problem in check(resolved)]
        took = f"{len(resolved)} scenarios resolved in {time.monotonic() - started:.0f}s"
        if failures:
            return WitnessResult(self.name, BUG, LEVEL, "; ".join(failures) + f" ({took})")
        return WitnessResult(
            self.name, CLEAN, LEVEL, f"fusion on for decode, fp8_e4m3 on gfx950, every inert fusion named ({took})"
        )


class WitnessUnavailable(Exception):
    pass


def check(resolved: dict[str, dict]) -> list[tuple[str, str]]:
    """(scenario, what is wrong) for every expectation that does not hold."""
    problems = []
    for name, (fusion, kv, reason) in EXPECTED.items():
        got = resolved.get(name)
        if got is None:
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
        inert = [w for w in got["warnings"] if INERT in w]
        if reason is False and inert:
            problems.append((name, f"warns although every gate is open: {inert[0]}"))
        elif isinstance(reason, str) and not any(reason in w for w in inert):
            problems.append((name, f"silent: no warning that the fusion cannot run because of {reason}"))
    return problems


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
    ...), ``warnings`` (logged or raised while resolving) and ``error`` (None unless ServerArgs
    rejected the arguments). Raises ``WitnessUnavailable`` when the pin's CPU env cannot be had.
    """
    from sglpatch import pyenv

    profile = profile or load_profile(PROFILE)
    try:
        python = pyenv.cpu_python(pin)
    except pyenv.EnvUnavailable as exc:
        raise WitnessUnavailable(f"no CPU Python for {pin.version}: {exc}") from None
    with tempfile.TemporaryDirectory(prefix="sglpatch-flags-") as work:
        model = Path(work) / "glm5-synthetic"
        model.mkdir()
        (model / "config.json").write_text(json.dumps(GLM5_CONFIG, indent=1))
        spec = {
            "workdir": work,
            "import_env": dict(profile.env),
            "scenarios": {
                name: {
                    "argv": profile_argv(profile, str(model), argv),
                    "env": {k: v for k, v in env.items() if k != ARCH_KEY},
                    "arch": env.get(ARCH_KEY),
                }
                for name, (argv, env) in scenarios.items()
            },
        }
        (Path(work) / "spec.json").write_text(json.dumps(spec))
        out = Path(work) / "out.json"
        try:
            run = python.run([str(PROBE), str(Path(work) / "spec.json"), str(out)], tree=tree, timeout=timeout)
        except OSError as exc:
            raise WitnessUnavailable(f"cannot start the probe: {exc}") from None
        except Exception as exc:  # subprocess.TimeoutExpired
            raise WitnessUnavailable(f"the probe did not finish: {exc}") from None
        if run.returncode != 0 or not out.exists():
            tail = (run.stdout + run.stderr).strip().splitlines()[-8:]
            raise WitnessUnavailable(
                f"the probe failed importing the pin's sglang (exit {run.returncode}): "
                + re.sub(r"\s+", " ", " | ".join(tail))[-600:]
            )
        return json.loads(out.read_text())["scenarios"]
