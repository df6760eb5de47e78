"""The rehearsal's launch: the load cell's own launch (``job_plan.Launches().shipped()``: the
single-stream profile as the ROCm job serves it), changed only where a CPU cannot follow it, each
change named with why. The checks read back what this launch asks for, as on the node."""

from __future__ import annotations

from dataclasses import dataclass, field

from sglpatch.matrix.job_plan import Launches

# A tiny model needs a sliver of memory: the KV pool is sized from this fraction of the
# machine's (the 24 GiB here are shared), and capped at this many tokens.
MEM_FRACTION_STATIC = "0.05"
MAX_TOTAL_TOKENS = "32768"
CPU_ENV = {
    # Without it `--device cpu` still imports vllm's custom ops on the GPU path.
    "SGLANG_USE_CPU_ENGINE": "1",
}


@dataclass
class CpuLaunch:
    argv: list[str]
    env: dict[str, str]
    changes: list[str] = field(default_factory=list)  # what differs from the node's launch, and why
    not_asked: dict[str, str] = field(default_factory=dict)  # checked flags dropped -> why


def cpu_launch(checkpoint: str, *, launches: Launches | None = None) -> CpuLaunch:
    shipped = (launches or Launches()).shipped()
    argv, env = list(shipped.argv), dict(shipped.env)
    changes, not_asked = [], {}
    argv[argv.index("--model-path") + 1] = checkpoint
    changes.append(f"--model-path {checkpoint}: the rehearsal's 2-layer Llama (byte-level tokenizer), "
                   "not the synthetic GLM checkpoint (its MoE and sparse-attention kernels need a GPU)")
    if "--tp-size" in argv:
        at = argv.index("--tp-size")
        changes.append(f"--tp-size {argv[at + 1]} -> 1: one CPU rank")
        argv[at + 1] = "1"
    if "--kv-cache-dtype" in argv:
        at = argv.index("--kv-cache-dtype")
        if argv[at + 1].startswith("fp8"):
            # Still asked explicitly, so the load check reads back a value that is not the default.
            changes.append(f"--kv-cache-dtype {argv[at + 1]} -> bf16: sglang's CPU fp8 KV cache needs Intel AMX "
                           "(\"CPU FP8 KV cache requires Intel AMX support\"), which this CPU lacks")
            argv[at + 1] = "bf16"
    speculative = [a for a in argv if a.startswith("--speculative-")]
    if speculative:
        kept = []
        skip = False
        for arg in argv:
            if skip:
                skip = False
                continue
            if arg.startswith("--speculative-"):
                skip = True
                continue
            kept.append(arg)
        argv = kept
        why = ("speculative decoding needs sgl_kernel's CPU KV-copy op (copy_all_layer_kv_cache_cpu), "
               "which no registry ships")
        changes.append(f"{' '.join(speculative)} dropped: {why}")
        not_asked["speculative_num_steps"] = why
    for name in [name for name in env if name == "SGLANG_USE_AITER"]:
        changes.append(f"{name}={env.pop(name)} dropped: aiter is a ROCm library")
    argv += ["--device", "cpu", "--attention-backend", "torch_native",
             "--mem-fraction-static", MEM_FRACTION_STATIC, "--max-total-tokens", MAX_TOTAL_TOKENS]
    changes.append("--device cpu --attention-backend torch_native (no AMX here), "
                   f"--mem-fraction-static {MEM_FRACTION_STATIC} --max-total-tokens {MAX_TOTAL_TOKENS}: a tiny model")
    env.update(CPU_ENV)
    changes.append("SGLANG_USE_CPU_ENGINE=1: sglang's CPU engine")
    return CpuLaunch(argv, env, changes, not_asked)
