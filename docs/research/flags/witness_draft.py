#!/usr/bin/env python3
"""CPU witness: resolve an sglang pin's own ServerArgs for GLM-5 on an emulated
8x MI355X (ROCm, gfx950) box and report the aiter all-reduce fusion / KV-cache
dtype decisions.

    python witness.py <dir-holding-the-sglang-package> [--expect patched] [--json]

Each scenario runs in a fresh child process (sglang reads SGLANG_USE_AITER and
is_hip() at import time and mutates process-global env state while resolving).
Nothing is downloaded: the model is a synthetic GLM-5-shaped config.json.

Emulation (applied in the child before sglang is imported):
  torch.version.hip set            -> sglang is_hip() True, is_cuda() False
  torch.cuda.is_available() True   -> get_device() "cuda", ROCm platform
  torch.cuda.get_device_capability -> (9, 5)   (MI355X reports gfx950 as 9.5)
  get_device_properties().gcnArchName = "gfx950:sramecc+:xnack-"  (is_gfx95_supported())
  device_count 8, mem_get_info / total_memory 288 GiB
  a fake `rocminfo` on PATH (get_amdgpu_memory_capacity shells out to it)
Stand-ins: torchvision (PyPI wheel does not load beside torch 2.13 CPU),
sgl_kernel and aiter (GPU-only); every attribute/call result is a placeholder.
"""
import argparse
import importlib.machinery
import json
import os
import subprocess
import sys
import tempfile
import types

# ---------------------------------------------------------------------------
# Launch profile and scenarios
# ---------------------------------------------------------------------------

PROFILE = [
    "--tp-size", "8",
    "--speculative-algorithm", "EAGLE",
    "--speculative-num-steps", "3",
    "--speculative-eagle-topk", "1",
    "--speculative-num-draft-tokens", "4",
    "--disable-custom-all-reduce",
]

# name: (env overrides, argv edits, description)
#   argv edits: list of ("add", [...]) / ("drop", flag) / ("set", flag, value)
SCENARIOS = {
    "profile": ({"SGLANG_USE_AITER": "1"}, [], "pin profile, SGLANG_USE_AITER=1"),
    "profile_custom_ar": (
        {"SGLANG_USE_AITER": "1"},
        [("drop", "--disable-custom-all-reduce")],
        "profile without --disable-custom-all-reduce (all gates met)",
    ),
    "req_no_aiter": (
        {"SGLANG_USE_AITER": None},
        [("add", ["--enable-aiter-allreduce-fusion"])],
        "fusion requested, SGLANG_USE_AITER unset",
    ),
    "req_dp_attn": (
        {"SGLANG_USE_AITER": "1"},
        [("add", ["--enable-aiter-allreduce-fusion", "--enable-dp-attention", "--dp-size", "8"])],
        "fusion requested with DP attention (dp 8)",
    ),
    "req_tp6": (
        {"SGLANG_USE_AITER": "1"},
        [("set", "--tp-size", "6"), ("add", ["--enable-aiter-allreduce-fusion"])],
        "fusion requested with tp 6",
    ),
    "req_ok": (
        {"SGLANG_USE_AITER": "1"},
        [("drop", "--disable-custom-all-reduce"), ("add", ["--enable-aiter-allreduce-fusion"])],
        "fusion requested, all gates met (no warning expected)",
    ),
    "kv_bf16_explicit": (
        {"SGLANG_USE_AITER": "1"},
        [("add", ["--kv-cache-dtype", "bfloat16"])],
        "user keeps --kv-cache-dtype bfloat16",
    ),
    "gfx942": (
        {"SGLANG_USE_AITER": "1", "WITNESS_GCN_ARCH": "gfx942:sramecc+:xnack-"},
        [],
        "same profile on MI300X (gfx942)",
    ),
}

# What the desired patch must produce (checked with --expect patched).
#   fusion: expected enable_aiter_allreduce_fusion; kv: expected kv_cache_dtype;
#   warn: reason substring that the inert-fusion warning must contain, or
#         False = no inert-fusion warning allowed, None = don't care.
EXPECT_PATCHED = {
    "profile": dict(fusion=True, prefill_off=True, kv="fp8_e4m3", warn="--disable-custom-all-reduce"),
    "profile_custom_ar": dict(fusion=True, prefill_off=True, kv="fp8_e4m3", warn=False),
    "req_no_aiter": dict(fusion=True, kv="fp8_e4m3", warn="SGLANG_USE_AITER is not set"),
    "req_dp_attn": dict(fusion=True, warn="DP attention is enabled"),
    "req_tp6": dict(fusion=True, warn="tp_size is 6"),
    "req_ok": dict(fusion=True, kv="fp8_e4m3", warn=False),
    "kv_bf16_explicit": dict(kv="bfloat16"),
    "gfx942": dict(kv="bfloat16"),
}

INERT_MARK = "will NOT run"
REASON_TAGS = [
    ("not a ROCm", "not-hip"),
    ("SGLANG_USE_AITER is not set", "no-USE_AITER"),
    ("SGLANG_USE_AITER_AR=0", "AITER_AR=0"),
    ("DP attention", "dp-attn"),
    ("tp_size is 6", "tp6"),
    ("tp_size is 1", "tp1"),
    ("--disable-custom-all-reduce", "no-custom-AR"),
]

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

# ---------------------------------------------------------------------------
# Child side: emulation, stand-ins, resolution
# ---------------------------------------------------------------------------


class _Anything:
    """Attribute of a stand-in module: access and calls yield more placeholders."""

    def __init__(self, name):
        self._name = name

    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Anything(f"{self._name}.{item}")

    def __call__(self, *a, **k):
        # import-time calls (e.g. aiter.get_hip_quant(...) under SGLANG_USE_AITER=1)
        # must not fail; the result is just another placeholder.
        return _Anything(f"{self._name}()")

    def __mro_entries__(self, bases):
        return (object,)

    def __repr__(self):
        return f"<stand-in {self._name}>"


class _StandinModule(types.ModuleType):
    def __getattr__(self, item):
        if item.startswith("__"):
            raise AttributeError(item)
        return _Anything(f"{self.__name__}.{item}")


class _StandinFinder:
    def __init__(self, root):
        self.root = root

    def find_spec(self, name, path=None, target=None):
        if name == self.root or name.startswith(self.root + "."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec):
        m = _StandinModule(spec.name)
        m.__path__ = []
        return m

    def exec_module(self, module):
        if module.__name__ == self.root:
            module.__version__ = "0.28.0+standin"


def install_standins(roots=("torchvision", "sgl_kernel", "aiter")):
    import importlib.util

    for root in roots:
        try:
            if root == "torchvision":
                import torchvision  # noqa: F401  a working real one wins

                continue
            if importlib.util.find_spec(root) is not None:
                continue
        except Exception:
            for k in [k for k in sys.modules if k == root or k.startswith(root + ".")]:
                del sys.modules[k]
        sys.meta_path.insert(0, _StandinFinder(root))


def install_rocm_emulation(workdir):
    import torch

    arch = os.environ.get("WITNESS_GCN_ARCH", "gfx950:sramecc+:xnack-")
    gfx95 = "gfx95" in arch
    cap = (9, 5) if gfx95 else (9, 4)
    name = "AMD Instinct MI355X" if gfx95 else "AMD Instinct MI300X"
    total = (288 if gfx95 else 192) * 1024**3

    def props(device=None):
        return types.SimpleNamespace(
            name=name, gcnArchName=arch, major=cap[0], minor=cap[1],
            total_memory=total, multi_processor_count=256, warp_size=64,
            L2_cache_size=4 * 1024**2, is_integrated=False,
            is_multi_gpu_board=False, uuid="00000000-0000-0000-0000-000000000000",
        )

    torch.version.hip = "7.0.51831-emulated"
    torch.version.cuda = None
    c = torch.cuda
    c.is_available = lambda: True
    c.device_count = lambda: 8
    c.current_device = lambda: 0
    c.is_initialized = lambda: False
    c.get_device_capability = lambda device=None: cap
    c.get_device_properties = props
    c.get_device_name = lambda device=None: name
    c.mem_get_info = lambda device=None: (total, total)

    bindir = os.path.join(workdir, "bin")
    os.makedirs(bindir, exist_ok=True)
    kb = total // 1024
    with open(os.path.join(bindir, "rocminfo"), "w") as f:
        f.write("#!/bin/sh\n")
        for _ in range(8):
            f.write(
                f"echo '  Name:                    {arch.split(':')[0]}'\n"
                "echo '  Pool 1'\n"
                f"echo '      Size:                    {kb}({kb:#x}) KB'\n"
            )
    os.chmod(os.path.join(bindir, "rocminfo"), 0o755)
    os.environ["PATH"] = bindir + os.pathsep + os.environ.get("PATH", "")


class _Capture:
    def __init__(self):
        import logging

        self.records = []
        outer = self

        class H(logging.Handler):
            def emit(self, record):
                try:
                    msg = record.getMessage()
                except Exception:
                    msg = str(record.msg)
                outer.records.append((record.levelname, record.name, msg))

        root = logging.getLogger()
        root.setLevel(logging.INFO)
        root.addHandler(H(level=logging.INFO))


def apply_edits(argv, edits):
    argv = list(argv)
    for e in edits:
        if e[0] == "add":
            argv += e[1]
        elif e[0] == "drop":
            argv.remove(e[1])
        elif e[0] == "set":
            argv[argv.index(e[1]) + 1] = e[2]
    return argv


def child(parent, scenario, workdir):
    env, edits, _ = SCENARIOS[scenario]
    for k, v in env.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
    install_rocm_emulation(workdir)
    install_standins()
    sys.path.insert(0, os.path.abspath(parent))
    cap = _Capture()

    import sglang

    from sglang.srt.server_args import ServerArgs

    model_dir = os.path.join(workdir, "glm5-synthetic")
    argv = ["--model-path", model_dir, "--device", "cuda"] + apply_edits(PROFILE, edits)
    parser = argparse.ArgumentParser()
    ServerArgs.add_cli_args(parser)
    sa = ServerArgs.from_cli_args(parser.parse_args(argv))
    if hasattr(sa, "resolve_once"):
        sa.resolve_once()
    vals = sa.resolved_dict() if hasattr(sa, "resolved_dict") else vars(sa)

    def g(*names):
        for n in names:
            if n in vals:
                return vals[n]
        return None

    msgs = [m for _, _, m in cap.records]
    aiter_msgs = [
        f"{lvl}: {m}" for lvl, _, m in cap.records
        if "aiter" in m.lower() and "allreduce" in m.lower().replace(" ", "")
    ]
    inert = [m for lvl, _, m in cap.records if lvl == "WARNING" and INERT_MARK in m]
    out = dict(
        scenario=scenario,
        sglang_file=sglang.__file__,
        argv=argv,
        enable_aiter_allreduce_fusion=g("enable_aiter_allreduce_fusion"),
        disable_aiter_allreduce_fusion_in_prefill=g("disable_aiter_allreduce_fusion_in_prefill"),
        kv_cache_dtype=g("kv_cache_dtype"),
        page_size=g("page_size"),
        attention_backend=g("attention_backend"),
        dsa_backends=[g("dsa_prefill_backend", "nsa_prefill_backend"),
                      g("dsa_decode_backend", "nsa_decode_backend")],
        enable_dp_attention=g("enable_dp_attention"),
        tp_size=g("tp_size"),
        disable_custom_all_reduce=g("disable_custom_all_reduce"),
        aiter_fusion_logs=aiter_msgs,
        inert_warning=inert[0] if inert else None,
        kv_logs=[m for m in msgs if "KV cache dtype" in m],
    )
    print("WITNESS_JSON " + json.dumps(out, default=str))


# ---------------------------------------------------------------------------
# Parent side
# ---------------------------------------------------------------------------


def run_scenario(parent, scenario, workdir):
    env = dict(os.environ)
    p = subprocess.run(
        [sys.executable, os.path.abspath(__file__), parent, "--child", scenario,
         "--workdir", workdir],
        capture_output=True, text=True, env=env, timeout=600,
    )
    for line in p.stdout.splitlines():
        if line.startswith("WITNESS_JSON "):
            return json.loads(line[len("WITNESS_JSON "):])
    tail = (p.stdout + p.stderr).strip().splitlines()[-15:]
    return dict(scenario=scenario, error="\n".join(tail))


def check(res, exp):
    fails = []
    if "error" in res:
        return ["resolution failed"]
    if "fusion" in exp and res["enable_aiter_allreduce_fusion"] != exp["fusion"]:
        fails.append(f"fusion={res['enable_aiter_allreduce_fusion']} want {exp['fusion']}")
    if "prefill_off" in exp and bool(res["disable_aiter_allreduce_fusion_in_prefill"]) != exp["prefill_off"]:
        fails.append(f"prefill_off={res['disable_aiter_allreduce_fusion_in_prefill']} want {exp['prefill_off']}")
    if "kv" in exp and res["kv_cache_dtype"] != exp["kv"]:
        fails.append(f"kv={res['kv_cache_dtype']} want {exp['kv']}")
    w = exp.get("warn")
    if w is False and res["inert_warning"]:
        fails.append("unexpected inert-fusion warning")
    elif isinstance(w, str) and not (res["inert_warning"] and w in res["inert_warning"]):
        fails.append(f"no inert-fusion warning naming {w!r}")
    return fails


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("parent", help="directory that contains the sglang/ package")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--workdir", help=argparse.SUPPRESS)
    ap.add_argument("--scenarios", default=",".join(SCENARIOS))
    ap.add_argument("--expect", choices=["patched"], help="assert the desired (patched) behaviour")
    ap.add_argument("--json", action="store_true", help="print raw results as JSON")
    a = ap.parse_args()

    if a.child:
        child(a.parent, a.child, a.workdir)
        return 0

    if not os.path.isdir(os.path.join(a.parent, "sglang")):
        ap.error(f"{a.parent} has no sglang/ package")
    workdir = tempfile.mkdtemp(prefix="sglpatch-witness-")
    os.makedirs(os.path.join(workdir, "glm5-synthetic"))
    with open(os.path.join(workdir, "glm5-synthetic", "config.json"), "w") as f:
        json.dump(GLM5_CONFIG, f, indent=1)

    results, bad = [], 0
    print(f"# sglang tree: {os.path.abspath(a.parent)}")
    print(f"# profile: {' '.join(PROFILE)}  (device cuda, emulated 8x MI355X gfx950)")
    print(f"{'scenario':18} {'fusion':6} {'prefill_off':11} {'kv':9} {'page':4} {'inert-fusion warning (reasons)':34} check")
    for name in a.scenarios.split(","):
        res = run_scenario(a.parent, name, workdir)
        results.append(res)
        fails = check(res, EXPECT_PATCHED.get(name, {})) if a.expect else []
        bad += bool(fails)
        if "error" in res:
            print(f"{name:18} ERROR\n{res['error']}")
            continue
        warn = res["inert_warning"]
        if warn:
            warn = ",".join(tag for key, tag in REASON_TAGS if key in warn) or "?"
        print(
            f"{name:18} {str(res['enable_aiter_allreduce_fusion']):6} "
            f"{str(res['disable_aiter_allreduce_fusion_in_prefill']):11} "
            f"{str(res['kv_cache_dtype']):9} {str(res['page_size']):4} "
            f"{(warn or '-'):34} {('FAIL: ' + '; '.join(fails)) if fails else ('ok' if a.expect else '')}"
        )
    if a.json:
        print(json.dumps(results, indent=1, default=str))
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main())
