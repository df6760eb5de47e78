"""Apply the QuarkConfig part of the MTP-exclude fix to one quark.py (any layout 0.5.10-0.5.23)."""
import re
import sys

p = sys.argv[1]
# --ckpt-only (layouts <= 0.5.15): MTP modules are matched by checkpoint name
# only, since the draft's exclude list was rewritten by a mapper that assumes
# DeepSeek-V3's layer count.
CKPT_ONLY = "--ckpt-only" in sys.argv
s = open(p).read()


def rep(old, new, count=1):
    global s
    n = s.count(old)
    assert n == count, (old, n)
    s = s.replace(old, new)


if "\nimport copy\n" not in s:
    rep("\nimport fnmatch\n", "\nimport copy\nimport fnmatch\n")
if "from sglang.srt.layers.quantization.quark.utils import deep_compare, should_ignore_layer\n" in s:
    rep(
        "from sglang.srt.layers.quantization.quark.utils import deep_compare, should_ignore_layer\n",
        "from sglang.srt.layers.quantization.quark.utils import (\n"
        "    check_equal_or_regex_match,\n"
        "    deep_compare,\n"
        "    should_ignore_layer,\n"
        ")\n",
    )
else:
    rep(
        "from sglang.srt.layers.quantization.quark.utils import (\n    Nvfp4SourceConfig,\n    deep_compare,\n",
        "from sglang.srt.layers.quantization.quark.utils import (\n    Nvfp4SourceConfig,\n"
        "    check_equal_or_regex_match,\n    deep_compare,\n",
    )
rep(
    "logger = logging.getLogger(__name__)\n",
    "logger = logging.getLogger(__name__)\n"
    "\n"
    "# Modules that a NextN (MTP) draft builds as model.<name> while the checkpoint\n"
    "# stores them as model.layers.<N>.<name>.\n"
    '_NEXTN_SPEC_MODULES = ("eh_proj", "enorm", "hnorm", "shared_head")\n'
    "# The checkpoint keeps the halves of SGLang's fused gate_up_proj separate.\n"
    '_CHECKPOINT_SHARDS = {"gate_up_proj": ["gate_proj", "up_proj"]}\n',
)
rep(
    '        self.packed_modules_mapping = self.quant_config["packed_modules_mapping"]\n',
    '        self.packed_modules_mapping = self.quant_config["packed_modules_mapping"]\n'
    "        # Checkpoint index of the MTP layer this config serves; set through\n"
    "        # for_nextn_layer() by NextN draft models only.\n"
    "        self.nextn_layer_id: Optional[int] = None\n",
)
IS_OR = '''    def is_layer_excluded(self, prefix: str) -> bool:
        if should_ignore_layer(
            prefix,
            ignore=self.exclude_layers,
            fused_mapping=self.packed_modules_mapping,
        ):
            return True
        ckpt_name = self._nextn_checkpoint_name(prefix)
        if ckpt_name is None:
            return False
        # Match the exclude list as written in the checkpoint: the model's
        # hf_to_sglang_mapper may have rewritten self.exclude_layers.
        ckpt_exclude = self.quant_config.get("exclude") or []
        return check_equal_or_regex_match(ckpt_name, ckpt_exclude) or (
            should_ignore_layer(
                ckpt_name,
                ignore=ckpt_exclude,
                fused_mapping={**_CHECKPOINT_SHARDS, **self.packed_modules_mapping},
            )
        )

'''
IS_CKPT_ONLY = '''    def is_layer_excluded(self, prefix: str) -> bool:
        ckpt_name = self._nextn_checkpoint_name(prefix)
        if ckpt_name is None:
            return should_ignore_layer(
                prefix,
                ignore=self.exclude_layers,
                fused_mapping=self.packed_modules_mapping,
            )
        # A module of the MTP layer: match the exclude list as the checkpoint
        # writes it. self.exclude_layers went through the draft model's
        # hf_to_sglang_mapper, whose model.layers.61 rule fits DeepSeek-V3 only.
        ckpt_exclude = self.quant_config.get("exclude") or []
        return check_equal_or_regex_match(ckpt_name, ckpt_exclude) or (
            should_ignore_layer(
                ckpt_name,
                ignore=ckpt_exclude,
                fused_mapping={**_CHECKPOINT_SHARDS, **self.packed_modules_mapping},
            )
        )

'''
METHODS = '''    def for_nextn_layer(self, layer_id: int) -> "QuarkConfig":
        """Return a copy for a NextN draft model.

        The draft builds the MTP layer as model.decoder.* (and model.eh_proj,
        model.enorm, ...), while Quark's exclude list names it as in the
        checkpoint, model.layers.<layer_id>.*. The copy also matches the
        checkpoint names, so modules the checkpoint keeps unquantized stay so.
        """
        config = copy.copy(self)
        config.nextn_layer_id = layer_id
        return config

    def _nextn_checkpoint_name(self, prefix: str) -> Optional[str]:
        if self.nextn_layer_id is None:
            return None
        layer_prefix = f"model.layers.{self.nextn_layer_id}"
        if prefix.startswith("model.decoder."):
            return layer_prefix + prefix[len("model.decoder") :]
        for name in _NEXTN_SPEC_MODULES:
            if prefix == f"model.{name}" or prefix.startswith(f"model.{name}."):
                return f"{layer_prefix}.{prefix[len('model.'):]}"
        return None

@@IS_LAYER_EXCLUDED@@'''
METHODS = METHODS.replace("@@IS_LAYER_EXCLUDED@@", IS_CKPT_ONLY if CKPT_ONLY else IS_OR)
rep("    def get_linear_method(self)", METHODS + "    def get_linear_method(self)")
s, n = re.subn(
    r"(        # Check if the layer is skipped for quantization\.\n\n?)"
    r"        if should_ignore_layer\(\n"
    r"            prefix,\n"
    r"            ignore=self\.exclude_layers,\n"
    r"            fused_mapping=self\.packed_modules_mapping,\n"
    r"        \):\n",
    r"\1        if self.is_layer_excluded(prefix):\n",
    s,
)
assert n == 1, n
# 0.5.23: is_linear_unquantized answers the same question from the exclude list
old = (
    "        return self.excluded_fp8_config is None and should_ignore_layer(\n"
    "            prefix,\n"
    "            ignore=self.exclude_layers,\n"
    "            fused_mapping=self.packed_modules_mapping,\n"
    "        )\n"
)
if old in s:
    rep(old, "        return self.excluded_fp8_config is None and self.is_layer_excluded(prefix)\n")
open(p, "w").write(s)
print("patched", p)
