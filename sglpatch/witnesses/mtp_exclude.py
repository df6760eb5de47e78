"""Witness ``mtp-quark-exclude``: the MTP draft must build the modules a Quark checkpoint keeps in
bf16 unquantized, and load their full-width bf16 tensors.

A Quark MXFP4 checkpoint lists the modules it keeps in bf16 in ``quantization_config["exclude"]``
under the checkpoint's names, ``model.layers.{num_hidden_layers}.*`` for the MTP layer. sglang
builds that layer as ``model.decoder.*`` (and ``model.eh_proj`` ...), so without the fix the
exclusion misses and the bf16 shared expert gets a half-width MXFP4 slot.

The check runs ``probes/mtp_probe.py`` once per tree in the pin's CPU Python
(``sglpatch.pyenv``): sglang's own Quark config, draft class and layers, with tiny safetensors
checkpoints that keep the MTP shared expert and ``eh_proj`` bf16, spelled three ways (fused
``gate_up_proj`` names, the unfused ``gate_proj``/``up_proj`` names Quark writes, ``re:``
patterns). The answer is

- ``bug`` when, for any spelling, an excluded module gets MXFP4 or its bf16 tensor does not load
  exactly (shape mismatch, or a silent narrowing cast), or the draft fuses the excluded shared
  expert into the MXFP4 routed experts on the emulated gfx950;
- ``clean`` when every excluded module is unquantized and loads exactly for every spelling;
- ``unavailable`` when the CPU environment cannot be built or the probe cannot tell (a control
  that must stay quantized did not, or the probe failed), with the reason.

``resolve_mtp_modules`` is the same probe for any checkpoint folder (the test matrix's load cell).
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

from sglpatch.errors import SglpatchError
from sglpatch.pins import Pin
from sglpatch.witnesses import BUG, CLEAN, UNAVAILABLE, WitnessResult

PROBE_MODULE = "mtp_probe"
PROBE_TIMEOUT_S = 300
EXCLUDED_SPELLINGS = ("fused", "unfused", "regex")
CONTROL_SPELLING = "none"
# The modules each spelling keeps bf16; eh_proj only where the release builds it quantizable.
EXCLUDED_MODULES = ("shared_experts.gate_up_proj", "shared_experts.down_proj", "eh_proj")
SHARED_EXPERT = ("shared_experts.gate_up_proj", "shared_experts.down_proj")
CONTROL_MODULE = "self_attn.o_proj"


class ProbeFailed(SglpatchError):
    """The probe ran but gave no answer; the message has its error."""


def resolve_mtp_modules(tree: Path, pin: Pin, *, checkpoint: Path | None = None) -> dict:
    """What the pin's sglang builds for the MTP draft layer, per module, and how its tensors load.

    ``tree`` is a checkout in upstream's layout (``python/sglang/...``). Without ``checkpoint`` the
    probe writes its own tiny checkpoints, one case per exclude-list spelling (``fused``,
    ``unfused``, ``regex``, and ``none``, nothing excluded); with it (a folder holding
    ``config.json`` with a Quark ``quantization_config`` and ``*.safetensors``) there is one case,
    ``checkpoint``. The answer::

        {"sglang": ..., "draft_class": "GlmMoeDsaForCausalLMNextN", "emulated_gpu": "gfx950:...",
         "standins": [...], "import_s": 12.3, "total_s": 14.0,
         "cases": {case: {"draft_prefix": "model", "draft_quant_config": "QuarkConfig" | None,
                          "exclude": [...], "draft_fusion": "on" | "off" | "unknown (...)",
                          "modules": {"shared_experts.gate_up_proj": {
                              "prefix": "model.decoder.mlp.shared_experts.gate_up_proj",
                              "checkpoint_names": [...], "quant_method": "UnquantizedLinearMethod",
                              "unquantized": True, "load": "ok", "load_detail": "..."}, ...}}}}

    ``load`` is ``ok`` (loaded exactly), ``shape-mismatch`` (the weight loader refused it),
    ``silent-wrong`` (loaded without error into a narrower or other-typed parameter),
    ``wrong-values``, or ``absent`` (no tensor for it in the checkpoint). A case whose draft could
    not be built has ``error`` instead. Raises ``sglpatch.pyenv.EnvUnavailable`` when the pin's CPU
    environment cannot be built and ``ProbeFailed`` when the probe gives no answer.
    """
    from sglpatch import pyenv

    python = pyenv.cpu_python(pin)
    with tempfile.TemporaryDirectory(prefix="sglpatch-mtp-probe-") as work:
        out = Path(work) / "answer.json"
        args = ["-m", PROBE_MODULE, "--out", str(out)]
        if checkpoint is not None:
            args += ["--checkpoint", str(Path(checkpoint).resolve())]
        tree = Path(tree).resolve()
        run = python.run(args, tree=tree, env={"SGLPATCH_TREE": str(tree / "python")}, timeout=PROBE_TIMEOUT_S, cwd=Path(work))
        if not out.is_file():
            tail = (run.stderr or run.stdout or "").strip()[-600:]
            raise ProbeFailed(f"the MTP probe gave no answer (exit {run.returncode}): {tail}")
        answer = json.loads(out.read_text())
    if not answer.get("ok"):
        raise ProbeFailed(f"the MTP probe failed: {answer.get('error')}\n{answer.get('traceback', '')[-800:]}")
    return answer


class MtpQuarkExcludeWitness:
    name = "mtp-quark-exclude"
    version = "1"

    def run(self, tree: Path, pin: Pin) -> WitnessResult:
        from sglpatch import pyenv

        try:
            answer = resolve_mtp_modules(tree, pin)
        except pyenv.EnvUnavailable as exc:
            return WitnessResult(self.name, UNAVAILABLE, detail=f"CPU environment: {exc}")
        except (ProbeFailed, OSError, ValueError) as exc:
            return WitnessResult(self.name, UNAVAILABLE, detail=str(exc)[:1000])
        return judge(answer, self.name)


def judge(answer: dict, name: str = MtpQuarkExcludeWitness.name) -> WitnessResult:
    """The witness's answer from the probe's (see ``resolve_mtp_modules``)."""
    gpu = str(answer.get("emulated_gpu", "")).split(":")[0]
    level = f"build+load {gpu}".strip()
    cases = answer.get("cases") or {}
    missing = [case for case in (*EXCLUDED_SPELLINGS, CONTROL_SPELLING) if case not in cases]
    if missing:
        return WitnessResult(name, UNAVAILABLE, level, f"the probe answered no case for {', '.join(missing)}")
    errors = [f"{case}: {cases[case]['error']}" for case in cases if "error" in cases[case]]
    if errors:
        return WitnessResult(name, UNAVAILABLE, level, "the draft could not be built: " + "; ".join(errors))
    # Controls: without them a "clean" could mean the probe built nothing quantized at all.
    insane = []
    for case, found in cases.items():
        control = found["modules"].get(CONTROL_MODULE)
        if control is None or control["unquantized"]:
            insane.append(f"{case}: {CONTROL_MODULE} (never excluded) is not quantized")
    for module in SHARED_EXPERT:
        if cases[CONTROL_SPELLING]["modules"][module]["unquantized"]:
            insane.append(f"{CONTROL_SPELLING}: {module} is unquantized with nothing excluded")
    if insane:
        return WitnessResult(name, UNAVAILABLE, level, "the probe cannot tell: " + "; ".join(insane))
    failures: dict[str, list[str]] = {}  # problems -> the spellings that have them
    for case in EXCLUDED_SPELLINGS:
        found = cases[case]
        problems = []
        for module in EXCLUDED_MODULES:
            got = found["modules"].get(module)
            if got is None:
                continue  # eh_proj before 0.5.11: a plain nn.Linear, never quantized
            if not got["unquantized"] or got["load"] != "ok":
                problems.append(f"{module} {_short(got['quant_method'])}/{got['load']}")
        if found.get("draft_fusion") == "on":
            problems.append(f"shared expert fused into the MXFP4 routed experts on {gpu}")
        if problems:
            failures.setdefault("; ".join(problems), []).append(case)
    checked = sorted({m for case in EXCLUDED_SPELLINGS for m in cases[case]["modules"] if m in EXCLUDED_MODULES})
    fusion = ", ".join(f"{case} {cases[case].get('draft_fusion')}" for case in EXCLUDED_SPELLINGS)
    if failures:
        detail = " | ".join(f"{', '.join(spellings)}: {problems}" for problems, spellings in failures.items())
        return WitnessResult(name, BUG, level, f"{detail} [draft fusion: {fusion}]")
    return WitnessResult(
        name,
        CLEAN,
        level,
        f"{', '.join(checked)} unquantized and loaded exactly for spellings {', '.join(EXCLUDED_SPELLINGS)}; "
        f"{CONTROL_MODULE} stays {cases['fused']['modules'][CONTROL_MODULE]['quant_method']} [draft fusion: {fusion}]",
    )


def _short(method: str) -> str:
    """``QuarkLinearMethod(QuarkW4A4MXFP4)`` -> ``QuarkW4A4MXFP4``; others as they are."""
    return method[method.index("(") + 1 : -1] if method.endswith(")") and "(" in method else method
