"""Apply the NextN part of the fix to deepseek_nextn.py (layouts 0.5.11-0.5.23).

usage: patch_nextn.py FILE [--fusion-guard]
"""
import sys

p = sys.argv[1]
guard = "--fusion-guard" in sys.argv
s = open(p).read()

SET = '''        if nextn_quant_config is not None and nextn_quant_config.get_name() == "quark":
            # Quark names the MTP layer model.layers.<N>.* (as the weight loader
            # reads it); let the config map this draft's prefixes back to it.
            nextn_quant_config = nextn_quant_config.for_nextn_layer(
                0 if config.num_hidden_layers == 1 else config.num_hidden_layers
            )
'''
GUARD = '''            if self.num_fused_shared_experts > 0 and any(
                nextn_quant_config.is_layer_excluded(
                    add_prefix(f"model.decoder.mlp.shared_experts.{proj}", prefix)
                )
                for proj in ("gate_up_proj", "down_proj")
            ):
                # An unquantized shared expert cannot join the quantized routed
                # experts.
                get_global_server_args().disable_shared_experts_fusion = True
                self.num_fused_shared_experts = 0
'''
block = SET + (GUARD if guard else "")

anchors = [
    # 0.5.11 - 0.5.15: inline whole-layer check
    "            if should_ignore_layer(mapped_prefix, nextn_quant_config.exclude_layers):\n"
    "                nextn_quant_config = None\n",
    # 0.5.16+: _resolve_nextn_quant_config
    "        nextn_quant_config = self._resolve_nextn_quant_config(config, quant_config)\n",
]
for a in anchors:
    if s.count(a) == 1:
        s = s.replace(a, a + "\n" + block if a.startswith("            if") else a + block)
        break
else:
    raise SystemExit("no anchor")
GATE = '''
    @classmethod
    def shared_experts_fusion_disable_reason(cls, hf_config, quant_config):
        if quant_config is not None and quant_config.get_name() == "quark":
            nextn_quant_config = quant_config.for_nextn_layer(
                0 if hf_config.num_hidden_layers == 1 else hf_config.num_hidden_layers
            )
            if any(
                nextn_quant_config.is_layer_excluded(
                    f"model.decoder.mlp.shared_experts.{proj}"
                )
                for proj in ("gate_up_proj", "down_proj")
            ):
                return (
                    "The checkpoint keeps the draft layer's shared expert "
                    "unquantized, so it cannot join the quantized routed experts."
                )
        return super().shared_experts_fusion_disable_reason(hf_config, quant_config)
'''
if "--fusion-gate" in sys.argv:
    a = (
        "    def get_hf_to_sglang_mapper(cls, config) -> WeightsMapper:\n"
        "        return cls.hf_to_sglang_mapper\n"
    )
    assert s.count(a) == 1
    s = s.replace(a, a + GATE)
open(p, "w").write(s)
print("patched", p, "(with fusion guard)" if guard else "")
