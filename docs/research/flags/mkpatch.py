"""Generate draft patches patches/<version>.diff for sglang pins.

Run: python mkpatch.py   (reads pristine trees under /tmp/dl/x, writes patches/)
"""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from mkpatch_lib import Tree  # noqa: E402

PARENTS = {
    "0.5.10": "/tmp/dl/x/0.5.10/sglang-0.5.10",
    "0.5.10.post1": "/tmp/dl/x/0.5.10.post1/sglang-0.5.10.post1",
    "0.5.11": "/tmp/dl/x/0.5.11",
    "0.5.13": "/tmp/dl/x/0.5.13",
    "0.5.16": "/tmp/dl/x/0.5.16",
    "0.5.19": "/tmp/dl/x/0.5.19",
    "0.5.21": "/tmp/dl/x/0.5.21",
    "0.5.23": "/tmp/dl/x/0.5.23",
}
SA = "sglang/srt/server_args.py"
COMM = "sglang/srt/layers/communicator.py"
OVR = "sglang/srt/arg_groups/overrides.py"
PH = "sglang/srt/arg_groups/parallel_hook.py"
MH = "sglang/srt/arg_groups/model_hook.py"

PREFILL_HELP = (
    "Keep --enable-aiter-allreduce-fusion for decode batches only; prefill "
    "batches (EXTEND / MIXED / SPLIT_PREFILL) use the plain all-reduce."
)

# ---------------------------------------------------------------------------
# communicator.py (0.5.10 .. 0.5.19): decode-only gate for the aiter fusion.
# ---------------------------------------------------------------------------


def comm_gate(t, args_getter):
    """args_getter: expression returning the object that carries the comm
    flags, e.g. 'get_global_server_args()' or 'get_exec().comm'."""
    t.sub(
        COMM,
        "def apply_aiter_all_reduce_fusion(input_tensor: torch.Tensor):\n",
        "def apply_aiter_all_reduce_fusion(\n"
        "    input_tensor: torch.Tensor, forward_batch: Optional[ForwardBatch] = None\n"
        "):\n",
    )
    t.sub(
        COMM,
        f"        and not is_dp_attention_enabled()\n"
        f"        and {args_getter}.enable_aiter_allreduce_fusion\n"
        f"    )\n",
        f"        and not is_dp_attention_enabled()\n"
        f"        and {args_getter}.enable_aiter_allreduce_fusion\n"
        f"        and not aiter_all_reduce_fusion_skips_batch(forward_batch)\n"
        f"    )\n"
        f"\n"
        f"\n"
        f"def aiter_all_reduce_fusion_skips_batch(\n"
        f"    forward_batch: Optional[ForwardBatch],\n"
        f") -> bool:\n"
        f"    # --disable-aiter-allreduce-fusion-in-prefill: fuse decode batches only.\n"
        f"    return (\n"
        f"        forward_batch is not None\n"
        f"        and {args_getter}.disable_aiter_allreduce_fusion_in_prefill\n"
        f"        and forward_batch.forward_mode.is_extend_without_speculative()\n"
        f"    )\n",
    )
    # both call sites have a forward_batch in scope
    t.sub(
        COMM,
        "apply_aiter_all_reduce_fusion(hidden_states)\n",
        "apply_aiter_all_reduce_fusion(hidden_states, forward_batch)\n",
        count=2,
    )


def comm_should_fuse(t, old_block, new_block):
    t.sub(COMM, old_block, new_block)


# ---------------------------------------------------------------------------
# Monolithic server_args.py (0.5.10, 0.5.10.post1, 0.5.11, 0.5.13)
# ---------------------------------------------------------------------------

WARN_METHOD_MONO = '''
    def _handle_aiter_allreduce_fusion(self):
        # The fused AllReduce+RMSNorm only runs when every gate in
        # layers/communicator.py and the TP group's custom all-reduce
        # communicator agree; say so instead of silently running unfused.
        if not self.enable_aiter_allreduce_fusion:
            return
        reasons = []
        if not is_hip():
            reasons.append("not a ROCm (HIP) build")
        if not get_bool_env_var("SGLANG_USE_AITER"):
            reasons.append("SGLANG_USE_AITER is not set")
        if not get_bool_env_var("SGLANG_USE_AITER_AR", default="true"):
            reasons.append("SGLANG_USE_AITER_AR=0")
        if self.enable_dp_attention:
            reasons.append("DP attention is enabled")
        if self.tp_size == 6:
            reasons.append("tp_size is 6")
        if self.tp_size == 1:
            reasons.append("tp_size is 1")
        if self.disable_custom_all_reduce:
            reasons.append(
                "--disable-custom-all-reduce is set (the fused kernel lives on "
                "the custom all-reduce communicator)"
            )
        if reasons:
            logger.warning(
                "--enable-aiter-allreduce-fusion is ON but the fused "
                "AllReduce+RMSNorm kernel will NOT run: "
                + "; ".join(reasons)
                + ". Falling back to the unfused all-reduce."
            )
'''

DEFAULT_MONO_OLD = '''            elif is_hip():
                if not self.enable_dp_attention and self.nnodes == 1:
                    # TODO (Hubert): Put this back later
                    # self.enable_aiter_allreduce_fusion = True
                    logger.info(
                        "Enable Aiter AllReduce Fusion for DeepseekV3ForCausalLM"
                    )
'''
DEFAULT_MONO_NEW = '''            elif is_hip():
                if not self.enable_dp_attention and self.nnodes == 1:
                    # TODO (Hubert): Put this back later
                    # self.enable_aiter_allreduce_fusion = True
                    if (
                        model_arch == "GlmMoeDsaForCausalLM"
                        and not self.enable_aiter_allreduce_fusion
                        and self.attn_cp_size == 1
                        and self.moe_dp_size == 1
                    ):
                        self.enable_aiter_allreduce_fusion = True
                        self.disable_aiter_allreduce_fusion_in_prefill = True
                        logger.info(
                            "Enable Aiter AllReduce Fusion on decode phase for GlmMoeDsaForCausalLM"
                        )
'''

KV_MONO_OLD = '''        if self.kv_cache_dtype == "auto":
            if major >= 10:
                self.kv_cache_dtype = "fp8_e4m3"
            else:
'''
KV_MONO_NEW = '''        if self.kv_cache_dtype == "auto":
            if major >= 10:
                self.kv_cache_dtype = "fp8_e4m3"
            elif (
                is_gfx95_supported()
                and self.get_model_config().hf_config.architectures[0]
                == "GlmMoeDsaForCausalLM"
            ):
                # MI355X (gfx950): GLM-5 DSA serves from an FP8 KV cache.
                self.kv_cache_dtype = "fp8_e4m3"
            else:
'''

SHOULD_FUSE_MONO_OLD = '''                or (
                    _use_aiter
                    and batch_size > 0
                    and get_tensor_model_parallel_world_size() != 6
                    and get_global_server_args().enable_aiter_allreduce_fusion
                )
'''
SHOULD_FUSE_MONO_NEW = '''                or (
                    _use_aiter
                    and batch_size > 0
                    and get_tensor_model_parallel_world_size() != 6
                    and get_global_server_args().enable_aiter_allreduce_fusion
                    and not aiter_all_reduce_fusion_skips_batch(forward_batch)
                )
'''


def monolithic(ver):
    t = Tree(PARENTS[ver])
    # imports
    if ver in ("0.5.10", "0.5.10.post1"):
        t.sub(SA, "    is_flashinfer_available,\n    is_hip,\n",
              "    is_flashinfer_available,\n    is_gfx95_supported,\n    is_hip,\n")
    else:
        t.sub(SA, "    cpu_has_amx_support,\n    get_device,\n",
              "    cpu_has_amx_support,\n    get_bool_env_var,\n    get_device,\n")
        t.sub(SA, "    is_flashinfer_available,\n    is_hip,\n",
              "    is_flashinfer_available,\n    is_gfx95_supported,\n    is_hip,\n")
    # field
    t.sub(SA, "    enable_aiter_allreduce_fusion: bool = False\n",
          "    enable_aiter_allreduce_fusion: bool = False\n"
          "    disable_aiter_allreduce_fusion_in_prefill: bool = False\n")
    # CLI
    t.sub(SA,
          '            "--enable-aiter-allreduce-fusion",\n'
          '            action="store_true",\n'
          '            help="Enable Aiter AllReduce Fusion.",\n'
          '        )\n',
          '            "--enable-aiter-allreduce-fusion",\n'
          '            action="store_true",\n'
          '            help="Enable Aiter AllReduce Fusion.",\n'
          '        )\n'
          '        parser.add_argument(\n'
          '            "--disable-aiter-allreduce-fusion-in-prefill",\n'
          '            action="store_true",\n'
          f'            help="{PREFILL_HELP}",\n'
          '        )\n')
    # kv cache dtype default
    t.sub(SA, KV_MONO_OLD, KV_MONO_NEW)
    # fusion default for GLM-5 on ROCm
    t.sub(SA, DEFAULT_MONO_OLD, DEFAULT_MONO_NEW)
    # late check: after DP/CP and deterministic handling are final
    if ver == "0.5.13":
        anchor = ("        # Handle context parallelism.\n"
                  "        self._handle_context_parallelism()\n")
        t.sub(SA, anchor, anchor + "        self._handle_aiter_allreduce_fusion()\n")
    else:
        anchor = ("        # Handle deterministic inference.\n"
                  "        self._handle_deterministic_inference()\n")
        t.sub(SA, anchor, anchor + "        self._handle_aiter_allreduce_fusion()\n")
    t.sub(SA, "    def _handle_deterministic_inference(self):\n",
          WARN_METHOD_MONO.lstrip("\n") + "\n    def _handle_deterministic_inference(self):\n")
    # communicator decode-only gate
    comm_gate(t, "get_global_server_args()")
    t.sub(COMM, SHOULD_FUSE_MONO_OLD, SHOULD_FUSE_MONO_NEW)
    return t


BUILDERS = {}
for _v in ("0.5.10", "0.5.10.post1", "0.5.11", "0.5.13"):
    BUILDERS[_v] = (lambda v: (lambda: monolithic(v)))(_v)

# ---------------------------------------------------------------------------
# Shared: DSA kv-cache default in arg_groups/overrides.py (0.5.16 .. 0.5.23)
# ---------------------------------------------------------------------------


def kv_overrides(t, sinks):
    if not sinks:
        old = ('    if kv_cache_dtype == "auto":\n'
               '        kv_cache_dtype = "fp8_e4m3" if major >= 10 else "bfloat16"\n')
        new = old + (
            '        if (\n'
            '            hf_config.architectures[0] == "GlmMoeDsaForCausalLM"\n'
            '            and is_gfx95_supported()\n'
            '        ):\n'
            '            # MI355X (gfx950): GLM-5 DSA serves from an FP8 KV cache.\n'
            '            kv_cache_dtype = "fp8_e4m3"\n')
    else:
        old = ('    if kv_cache_dtype == "auto":\n'
               '        kv_cache_dtype = (\n'
               '            "fp8_e4m3" if major >= 10 and not has_attention_sinks else "bfloat16"\n'
               '        )\n')
        new = old + (
            '        if (\n'
            '            hf_config.architectures[0] == "GlmMoeDsaForCausalLM"\n'
            '            and is_gfx95_supported()\n'
            '            and not has_attention_sinks\n'
            '        ):\n'
            '            # MI355X (gfx950): GLM-5 DSA serves from an FP8 KV cache.\n'
            '            kv_cache_dtype = "fp8_e4m3"\n')
    t.sub(OVR, old, new)


def warn_body(indent, view, dp_expr, hip_expr):
    i = " " * indent
    return (
        f"{i}if not {view}.enable_aiter_allreduce_fusion:\n"
        f"{i}    return\n"
        f"{i}reasons = []\n"
        f"{i}if not {hip_expr}:\n"
        f'{i}    reasons.append("not a ROCm (HIP) build")\n'
        f'{i}if not get_bool_env_var("SGLANG_USE_AITER"):\n'
        f'{i}    reasons.append("SGLANG_USE_AITER is not set")\n'
        f'{i}if not get_bool_env_var("SGLANG_USE_AITER_AR", default="true"):\n'
        f'{i}    reasons.append("SGLANG_USE_AITER_AR=0")\n'
        f"{i}if {dp_expr}:\n"
        f'{i}    reasons.append("DP attention is enabled")\n'
        f"{i}if {view}.tp_size == 6:\n"
        f'{i}    reasons.append("tp_size is 6")\n'
        f"{i}if {view}.tp_size == 1:\n"
        f'{i}    reasons.append("tp_size is 1")\n'
        f"{i}if {view}.disable_custom_all_reduce:\n"
        f"{i}    reasons.append(\n"
        f'{i}        "--disable-custom-all-reduce is set (the fused kernel lives on "\n'
        f'{i}        "the custom all-reduce communicator)"\n'
        f"{i}    )\n"
        f"{i}if reasons:\n"
        f"{i}    logger.warning(\n"
        f'{i}        "--enable-aiter-allreduce-fusion is ON but the fused "\n'
        f'{i}        "AllReduce+RMSNorm kernel will NOT run: "\n'
        f'{i}        + "; ".join(reasons)\n'
        f'{i}        + ". Falling back to the unfused all-reduce."\n'
        f"{i}    )\n"
    )


WARN_COMMENT = (
    "# The fused AllReduce+RMSNorm only runs when every gate in the layer\n"
    "# communicator and the TP group's custom all-reduce communicator agree;\n"
    "# say so instead of silently running unfused.\n"
)

# ---------------------------------------------------------------------------
# 0.5.16: server_args.py monolith + arg_groups/overrides.py
# ---------------------------------------------------------------------------


def v0516():
    t = Tree(PARENTS["0.5.16"])
    t.sub(SA, "    SUPPORTED_LORA_TARGET_MODULES,\n    get_device,\n",
          "    SUPPORTED_LORA_TARGET_MODULES,\n    get_bool_env_var,\n    get_device,\n")
    t.sub(SA,
          '    enable_aiter_allreduce_fusion: A[\n'
          '        bool,\n'
          '        Arg(help="Enable Aiter AllReduce Fusion.", resolvable=True),\n'
          '    ] = False\n',
          '    enable_aiter_allreduce_fusion: A[\n'
          '        bool,\n'
          '        Arg(help="Enable Aiter AllReduce Fusion.", resolvable=True),\n'
          '    ] = False\n'
          '    disable_aiter_allreduce_fusion_in_prefill: A[\n'
          '        bool,\n'
          '        Arg(\n'
          '            help=(\n'
          '                "Keep --enable-aiter-allreduce-fusion for decode batches only; "\n'
          '                "prefill batches (EXTEND / MIXED / SPLIT_PREFILL) use the "\n'
          '                "plain all-reduce."\n'
          '            ),\n'
          '            resolvable=True,\n'
          '        ),\n'
          '    ] = False\n')
    t.sub(SA,
          '                if not self._resolved().enable_dp_attention and self.nnodes == 1:\n'
          '                    # TODO (Hubert): Put this back later\n'
          '                    # self.enable_aiter_allreduce_fusion = True\n'
          '                    logger.info(\n'
          '                        "Enable Aiter AllReduce Fusion for DeepseekV3ForCausalLM"\n'
          '                    )\n',
          '                if not self._resolved().enable_dp_attention and self.nnodes == 1:\n'
          '                    # TODO (Hubert): Put this back later\n'
          '                    # self.enable_aiter_allreduce_fusion = True\n'
          '                    if (\n'
          '                        model_arch == "GlmMoeDsaForCausalLM"\n'
          '                        and not self._resolved().enable_aiter_allreduce_fusion\n'
          '                        and self._resolved().attn_cp_size == 1\n'
          '                        and self.moe_dp_size == 1\n'
          '                    ):\n'
          '                        self.enable_aiter_allreduce_fusion = True\n'
          '                        self.disable_aiter_allreduce_fusion_in_prefill = True\n'
          '                        logger.info(\n'
          '                            "Enable Aiter AllReduce Fusion on decode phase for GlmMoeDsaForCausalLM"\n'
          '                        )\n')
    anchor = ("        # Handle context parallelism.\n"
              "        self._handle_context_parallelism()\n")
    t.sub(SA, anchor, anchor + "        self._handle_aiter_allreduce_fusion()\n")
    method = (
        "    def _handle_aiter_allreduce_fusion(self):\n"
        + "".join("        " + l + "\n" for l in WARN_COMMENT.splitlines())
        + "        view = self._resolved()\n"
        + warn_body(8, "view", "view.enable_dp_attention", "is_hip()")
        + "\n"
    )
    t.sub(SA, "    def _handle_data_parallelism(self):\n",
          method + "    def _handle_data_parallelism(self):\n")
    kv_overrides(t, sinks=False)
    comm_gate(t, "get_server_args()")
    t.sub(COMM,
          "                    and get_moe_a2a_backend().is_none()\n"
          "                    and get_server_args().enable_aiter_allreduce_fusion\n"
          "                )\n",
          "                    and get_moe_a2a_backend().is_none()\n"
          "                    and get_server_args().enable_aiter_allreduce_fusion\n"
          "                    and not aiter_all_reduce_fusion_skips_batch(forward_batch)\n"
          "                )\n")
    return t


# ---------------------------------------------------------------------------
# 0.5.19 / 0.5.21 / 0.5.23: resolution pipeline (arg_groups/*)
# ---------------------------------------------------------------------------


def ph_warn(t, dp_expr):
    t.sub(PH, "from sglang.srt.utils.common import parse_connector_type\n",
          "from sglang.srt.utils.common import get_bool_env_var, parse_connector_type\n")
    t.sub(PH,
          "    init_cp_strategy(\n"
          "        enable_prefill_cp=bool(cfg.enable_prefill_cp),\n"
          "        cp_size=cfg.attn_cp_size,\n"
          "        cp_strategy=cfg.cp_strategy,\n"
          "    )\n",
          "    init_cp_strategy(\n"
          "        enable_prefill_cp=bool(cfg.enable_prefill_cp),\n"
          "        cp_size=cfg.attn_cp_size,\n"
          "        cp_strategy=cfg.cp_strategy,\n"
          "    )\n"
          "\n"
          "    warn_inert_aiter_allreduce_fusion(server_args)\n"
          "\n"
          "\n"
          "def warn_inert_aiter_allreduce_fusion(server_args: Any):\n"
          + "".join("    " + l + "\n" for l in WARN_COMMENT.splitlines())
          + "    view = resolved_view(server_args)\n"
          + warn_body(4, "view", dp_expr, "get_platform().is_hip"))


def v0519():
    t = Tree(PARENTS["0.5.19"])
    t.sub(SA,
          '    enable_aiter_allreduce_fusion: A[\n'
          '        bool,\n'
          '        Arg(help="Enable Aiter AllReduce Fusion.", resolvable=True),\n'
          '        NS("exec.comm"),\n'
          '    ] = False\n',
          '    enable_aiter_allreduce_fusion: A[\n'
          '        bool,\n'
          '        Arg(help="Enable Aiter AllReduce Fusion.", resolvable=True),\n'
          '        NS("exec.comm"),\n'
          '    ] = False\n'
          '    disable_aiter_allreduce_fusion_in_prefill: A[\n'
          '        bool,\n'
          '        Arg(\n'
          '            help=(\n'
          '                "Keep --enable-aiter-allreduce-fusion for decode batches only; "\n'
          '                "prefill batches (EXTEND / MIXED / SPLIT_PREFILL) use the "\n'
          '                "plain all-reduce."\n'
          '            ),\n'
          '            resolvable=True,\n'
          '        ),\n'
          '        NS("exec.comm"),\n'
          '    ] = False\n')
    t.sub(MH,
          '            if not resolved_view(server_args).enable_dp_attention and cfg.nnodes == 1:\n'
          '                # TODO (Hubert): Put this back later\n'
          '                # server_args.enable_aiter_allreduce_fusion = True\n'
          '                logger.info("Enable Aiter AllReduce Fusion for DeepseekV3ForCausalLM")\n',
          '            if not resolved_view(server_args).enable_dp_attention and cfg.nnodes == 1:\n'
          '                # TODO (Hubert): Put this back later\n'
          '                # server_args.enable_aiter_allreduce_fusion = True\n'
          '                if (\n'
          '                    model_arch == "GlmMoeDsaForCausalLM"\n'
          '                    and not cfg.enable_aiter_allreduce_fusion\n'
          '                    and resolved_view(server_args).attn_cp_size == 1\n'
          '                    and cfg.moe_dp_size == 1\n'
          '                ):\n'
          '                    declare_resolution(\n'
          '                        server_args,\n'
          '                        "_handle_model_specific_adjustments",\n'
          '                        enable_aiter_allreduce_fusion=True,\n'
          '                        disable_aiter_allreduce_fusion_in_prefill=True,\n'
          '                    )\n'
          '                    logger.info(\n'
          '                        "Enable Aiter AllReduce Fusion on decode phase for GlmMoeDsaForCausalLM"\n'
          '                    )\n')
    kv_overrides(t, sinks=False)
    ph_warn(t, "view.enable_dp_attention")
    comm_gate(t, "get_exec().comm")
    t.sub(COMM,
          "                    and get_moe_a2a_backend().is_none()\n"
          "                    and get_exec().comm.enable_aiter_allreduce_fusion\n"
          "                )\n",
          "                    and get_moe_a2a_backend().is_none()\n"
          "                    and get_exec().comm.enable_aiter_allreduce_fusion\n"
          "                    and not aiter_all_reduce_fusion_skips_batch(forward_batch)\n"
          "                )\n")
    return t


def v0521():
    t = Tree(PARENTS["0.5.21"])
    kv_overrides(t, sinks=True)
    ph_warn(t, "view.enable_dp_attention")
    return t


def v0523():
    t = Tree(PARENTS["0.5.23"])
    kv_overrides(t, sinks=True)
    ph_warn(t, "attn_dp_enabled_of(view)")
    return t


BUILDERS.update({"0.5.16": v0516, "0.5.19": v0519, "0.5.21": v0521, "0.5.23": v0523})

if __name__ == "__main__":
    only = sys.argv[1:] or list(BUILDERS)
    for v in only:
        d = BUILDERS[v]().diff()
        with open(f"/tmp/research/flags/patches/{v}.diff", "w") as f:
            f.write(d)
        print(v, "hunks:", d.count("\n@@"), "lines:", d.count("\n"))
