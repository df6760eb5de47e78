"""Edit the pristine checkouts /tmp/flags-work/<v>/python in place (asserted anchors)."""
import sys
sys.path.insert(0, "/tmp/flags-work/gen")
from mkpatch_lib import Tree

SA = "sglang/srt/server_args.py"
COMM = "sglang/srt/layers/communicator.py"
OVR = "sglang/srt/arg_groups/overrides.py"
PH = "sglang/srt/arg_groups/parallel_hook.py"
MH = "sglang/srt/arg_groups/model_hook.py"

PREFILL_HELP = ("Use the aiter AllReduce+RMSNorm fusion for decode batches only; "
                "prefill batches keep the unfused all-reduce.")
KV_COMMENT = "# MI355X (gfx950) reports SM9x; GLM-5 still serves an fp8 KV cache."
FUSE_COMMENT = [
    "# GLM-5 decode is all-reduce bound on a single node: fuse the",
    "# all-reduce with the next RMSNorm there, keep prefill unfused.",
]
FUSE_LOG = "Enable Aiter AllReduce Fusion for decode batches of GlmMoeDsaForCausalLM"


def reasons_body(i, *, hip, dp, tp, custom_ar):
    """The inert-fusion warning: every gate of the fused kernel that is closed."""
    s = " " * i
    return (
        f"{s}reasons = []\n"
        f"{s}if not {hip}:\n"
        f'{s}    reasons.append("not a ROCm build")\n'
        f'{s}if not get_bool_env_var("SGLANG_USE_AITER"):\n'
        f'{s}    reasons.append("SGLANG_USE_AITER is not set")\n'
        f'{s}if not get_bool_env_var("SGLANG_USE_AITER_AR", default="true"):\n'
        f'{s}    reasons.append("SGLANG_USE_AITER_AR=0")\n'
        f"{s}if {dp}:\n"
        f'{s}    reasons.append("DP attention is enabled")\n'
        f"{s}if {tp} == 6:\n"
        f'{s}    reasons.append("tp_size is 6")\n'
        f"{s}if {custom_ar}:\n"
        f"{s}    # The fused kernel runs on the custom all-reduce communicator.\n"
        f'{s}    reasons.append("--disable-custom-all-reduce is set")\n'
        f"{s}if reasons:\n"
        f"{s}    logger.warning(\n"
        f'{s}        "--enable-aiter-allreduce-fusion has no effect: "\n'
        f'{s}        + "; ".join(reasons)\n'
        f'{s}        + ". The unfused all-reduce is used."\n'
        f"{s}    )\n"
    )


def comm_gate(t, getter):
    t.sub(COMM,
          "def apply_aiter_all_reduce_fusion(input_tensor: torch.Tensor):\n",
          "def apply_aiter_all_reduce_fusion(\n"
          "    input_tensor: torch.Tensor, forward_batch: Optional[ForwardBatch] = None\n"
          "):\n")
    t.sub(COMM,
          f"        and not is_dp_attention_enabled()\n"
          f"        and {getter}.enable_aiter_allreduce_fusion\n"
          f"    )\n",
          f"        and not is_dp_attention_enabled()\n"
          f"        and {getter}.enable_aiter_allreduce_fusion\n"
          f"        and not _aiter_all_reduce_fusion_skips(forward_batch)\n"
          f"    )\n"
          f"\n"
          f"\n"
          f"def _aiter_all_reduce_fusion_skips(forward_batch: Optional[ForwardBatch]) -> bool:\n"
          f"    return (\n"
          f"        forward_batch is not None\n"
          f"        and {getter}.disable_aiter_allreduce_fusion_in_prefill\n"
          f"        and forward_batch.forward_mode.is_extend_without_speculative()\n"
          f"    )\n")
    t.sub(COMM, "apply_aiter_all_reduce_fusion(hidden_states)\n",
          "apply_aiter_all_reduce_fusion(hidden_states, forward_batch)\n", count=2)
    t.sub(COMM,
          f"                    and {getter}.enable_aiter_allreduce_fusion\n"
          f"                )\n",
          f"                    and {getter}.enable_aiter_allreduce_fusion\n"
          f"                    and not _aiter_all_reduce_fusion_skips(forward_batch)\n"
          f"                )\n")


def fuse_default_mono(t, prefix, enable_expr):
    """After the HIP branch's misleading log, really turn the fusion on for GLM-5."""
    p = prefix
    old = (f'{p}# self.enable_aiter_allreduce_fusion = True\n'
           f'{p}logger.info(\n'
           f'{p}    "Enable Aiter AllReduce Fusion for DeepseekV3ForCausalLM"\n'
           f'{p})\n')
    new = (f'{p}# self.enable_aiter_allreduce_fusion = True\n'
           f'{p}logger.info(\n'
           f'{p}    "Enable Aiter AllReduce Fusion for DeepseekV3ForCausalLM"\n'
           f'{p})\n'
           f'{p}if (\n'
           f'{p}    model_arch == "GlmMoeDsaForCausalLM"\n'
           f'{p}    and not {enable_expr}\n'
           f'{p}):\n'
           + "".join(f"{p}    {c}\n" for c in FUSE_COMMENT) +
           f'{p}    self.enable_aiter_allreduce_fusion = True\n'
           f'{p}    self.disable_aiter_allreduce_fusion_in_prefill = True\n'
           f'{p}    logger.info(\n'
           f'{p}        "{FUSE_LOG}"\n'
           f'{p}    )\n')
    t.sub(SA, old, new)


def kv_mono(t):
    t.sub(SA,
          '        if self.kv_cache_dtype == "auto":\n'
          '            if major >= 10:\n'
          '                self.kv_cache_dtype = "fp8_e4m3"\n'
          '            else:\n',
          '        if self.kv_cache_dtype == "auto":\n'
          '            if major >= 10:\n'
          '                self.kv_cache_dtype = "fp8_e4m3"\n'
          '            elif (\n'
          '                is_gfx95_supported()\n'
          '                and self.get_model_config().hf_config.architectures[0]\n'
          '                == "GlmMoeDsaForCausalLM"\n'
          '            ):\n'
          f'                {KV_COMMENT}\n'
          '                self.kv_cache_dtype = "fp8_e4m3"\n'
          '            else:\n')


def kv_overrides(t, sinks):
    if sinks:
        old = ('        kv_cache_dtype = (\n'
               '            "fp8_e4m3" if major >= 10 and not has_attention_sinks else "bfloat16"\n'
               '        )\n')
        extra = '            and not has_attention_sinks\n'
    else:
        old = '        kv_cache_dtype = "fp8_e4m3" if major >= 10 else "bfloat16"\n'
        extra = ''
    t.sub(OVR, old, old +
          '        if (\n'
          '            is_gfx95_supported()\n'
          '            and hf_config.architectures[0] == "GlmMoeDsaForCausalLM"\n'
          + extra +
          '        ):\n'
          f'            {KV_COMMENT}\n'
          '            kv_cache_dtype = "fp8_e4m3"\n')


def warn_method_mono(t, call_anchor, method_anchor, view_line=None):
    t.sub(SA, call_anchor, call_anchor + "        self._warn_inert_aiter_allreduce_fusion()\n")
    v = "view" if view_line else "self"
    body = ("    def _warn_inert_aiter_allreduce_fusion(self):\n"
            + (f"        {view_line}\n" if view_line else "")
            + f"        if not {v}.enable_aiter_allreduce_fusion:\n"
            "            return\n"
            + reasons_body(8, hip="is_hip()", dp=f"{v}.enable_dp_attention",
                           tp=f"{v}.tp_size", custom_ar=f"{v}.disable_custom_all_reduce")
            + "\n")
    t.sub(SA, method_anchor, body + method_anchor)


def import_after(t, rel, anchor, name):
    t.sub(rel, anchor, anchor + f"    {name},\n")


def v0510(parent):
    t = Tree(parent)
    import_after(t, SA, "    is_flashinfer_available,\n", "is_gfx95_supported")
    t.sub(SA, "    enable_aiter_allreduce_fusion: bool = False\n",
          "    enable_aiter_allreduce_fusion: bool = False\n"
          "    disable_aiter_allreduce_fusion_in_prefill: bool = False\n")
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
    kv_mono(t)
    fuse_default_mono(t, " " * 20, "self.enable_aiter_allreduce_fusion")
    warn_method_mono(t, "        # Handle deterministic inference.\n        self._handle_deterministic_inference()\n",
                     "    def _handle_deterministic_inference(self):\n")
    comm_gate(t, "get_global_server_args()")
    return t


A_FIELD_OLD = '    enable_aiter_allreduce_fusion: A[bool, "Enable Aiter AllReduce Fusion."] = False\n'
A_FIELD_NEW = A_FIELD_OLD + (
    "    disable_aiter_allreduce_fusion_in_prefill: A[\n"
    "        bool,\n"
    f'        "{PREFILL_HELP}",\n'
    "    ] = False\n")


def v0514(parent):
    t = Tree(parent)
    import_after(t, SA, "    get_device,\n", "get_bool_env_var") if False else None
    t.sub(SA, "    is_flashinfer_available,\n    is_hip,\n",
          "    is_flashinfer_available,\n    is_gfx95_supported,\n    is_hip,\n")
    t.sub(SA, A_FIELD_OLD, A_FIELD_NEW)
    kv_mono(t)
    fuse_default_mono(t, " " * 20, "self.enable_aiter_allreduce_fusion")
    warn_method_mono(t, "        # Handle context parallelism.\n        self._handle_context_parallelism()\n",
                     "    def _handle_deterministic_inference(self):\n")
    comm_gate(t, "get_global_server_args()")
    return t


def v0515(parent):
    t = Tree(parent)
    t.sub(SA, A_FIELD_OLD, A_FIELD_NEW)
    fuse_default_mono(t, " " * 20, "self.enable_aiter_allreduce_fusion")
    warn_method_mono(t, "        # Handle context parallelism.\n        self._handle_context_parallelism()\n",
                     "    def _handle_deterministic_inference(self):\n")
    import_after(t, OVR, "    is_flashinfer_available,\n", "is_gfx95_supported")
    kv_overrides(t, sinks=False)
    comm_gate(t, "get_global_server_args()")
    return t


def ph_warn(t, dp_expr):
    t.sub(PH, "from sglang.srt.utils.common import parse_connector_type\n",
          "from sglang.srt.utils.common import get_bool_env_var, parse_connector_type\n")
    anchor = ("    init_cp_strategy(\n"
              "        enable_prefill_cp=bool(cfg.enable_prefill_cp),\n"
              "        cp_size=cfg.attn_cp_size,\n"
              "        cp_strategy=cfg.cp_strategy,\n"
              "    )\n")
    t.sub(PH, anchor, anchor + "\n    warn_inert_aiter_allreduce_fusion(server_args)\n"
          "\n\ndef warn_inert_aiter_allreduce_fusion(server_args: Any):\n"
          "    view = resolved_view(server_args)\n"
          "    if not view.enable_aiter_allreduce_fusion:\n"
          "        return\n"
          + reasons_body(4, hip="get_platform().is_hip", dp=dp_expr, tp="view.tp_size",
                         custom_ar="view.disable_custom_all_reduce"))


def v0519(parent):
    t = Tree(parent)
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
          f'        Arg(help="{PREFILL_HELP}", resolvable=True),\n'
          '        NS("exec.comm"),\n'
          '    ] = False\n')
    p = " " * 16
    old = (f'{p}# server_args.enable_aiter_allreduce_fusion = True\n'
           f'{p}logger.info("Enable Aiter AllReduce Fusion for DeepseekV3ForCausalLM")\n')
    t.sub(MH, old, old +
          f'{p}if (\n'
          f'{p}    model_arch == "GlmMoeDsaForCausalLM"\n'
          f'{p}    and not cfg.enable_aiter_allreduce_fusion\n'
          f'{p}):\n'
          + "".join(f"{p}    {c}\n" for c in FUSE_COMMENT) +
          f'{p}    declare_resolution(\n'
          f'{p}        server_args,\n'
          f'{p}        "_handle_model_specific_adjustments",\n'
          f'{p}        enable_aiter_allreduce_fusion=True,\n'
          f'{p}        disable_aiter_allreduce_fusion_in_prefill=True,\n'
          f'{p}    )\n'
          f'{p}    logger.info(\n'
          f'{p}        "{FUSE_LOG}"\n'
          f'{p}    )\n')
    kv_overrides(t, sinks=False)
    ph_warn(t, "view.enable_dp_attention")
    comm_gate(t, "get_exec().comm")
    return t


def v0523(parent):
    t = Tree(parent)
    kv_overrides(t, sinks=True)
    ph_warn(t, "attn_dp_enabled_of(view)")
    return t


BUILDERS = {"0.5.10": v0510, "0.5.10.post1": v0510, "0.5.14": v0514, "0.5.15": v0515,
            "0.5.19": v0519, "0.5.23": v0523}

if __name__ == "__main__":
    import os
    for v in sys.argv[1:] or BUILDERS:
        parent = f"/tmp/flags-work/{v}/python"
        t = BUILDERS[v](parent)
        for rel, (a, b) in t.files.items():
            if a != b:
                with open(os.path.join(parent, rel), "w") as f:
                    f.write(b)
        print(v, "edited", [r for r, (a, b) in t.files.items() if a != b])
