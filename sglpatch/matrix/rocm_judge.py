"""The ROCm tier's judgement: the matrix's checks (``sglpatch.matrix.cells.CHECKS``, the same the
CPU tier uses) applied to the figures the in-image check scripts (``sglpatch/rocm/checks/``)
print, in the patched ROCm image on AMD GPUs. Running the checks is ``sglpatch.rocm.job``'s: one
job per pin, one server per launch configuration, shared by the checks that launch the same one;
a cell alone is a job of one cell.
"""

from __future__ import annotations

from sglpatch.matrix.cells import Cell
from sglpatch.matrix.records import FAILED, PASSED, SKIPPED, CellRecord, Part, last_json
from sglpatch.rocm.constants import SGLANG_CI_ACCEPT_LENGTH, SGLANG_CI_DEPTH
from sglpatch.rocm.containers import ContainerRun


def _chain_accept_length(acceptance: float, depth: int) -> float:
    return sum(acceptance**k for k in range(depth + 1))


def _acceptance_for(depth: int, length: float) -> float:
    low, high = 0.0, 1.0
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if _chain_accept_length(middle, depth) < length else (low, middle)
    return low


# Accept length floors: sglang's AMD CI figure at its depth (SGLANG_CI_ACCEPT_LENGTH, at most d + 1
# tokens per verify step); the other depths take the same per-token acceptance a: a chain of d
# drafts accepts 1 + a + ... + a^d tokens per step, and a is the one that gives 5.0 at depth 5.
ACCEPTANCE = _acceptance_for(SGLANG_CI_DEPTH, SGLANG_CI_ACCEPT_LENGTH)
ACCEPT_LENGTH_FLOORS = {d: round(_chain_accept_length(ACCEPTANCE, d), 2) for d in range(1, 7)}
ACCEPT_LENGTH_FLOORS[SGLANG_CI_DEPTH] = SGLANG_CI_ACCEPT_LENGTH
# Greedy decoding with EAGLE verification emits the target model's own tokens, so the text must
# match the non-speculative run's; bf16/fp8 kernels with other batch shapes may diverge late, so the
# floor is on the mean share of each output that matches as a prefix, not on exact equality.
PREFIX_MATCH_FLOOR = 0.8
# Decode speed at depth d against the same profile without speculative decoding, below which it
# has collapsed. Working speculation decodes faster than none; the missing ROCm guard shows as a
# ~30x drop (the kernel's compile is retried on every step), far below this. Not against depth 3:
# depth 3 is a speculative launch itself, and its own cell would be compared with itself.
COLLAPSE_RATIO = 0.5
COLLAPSE_PART = "decode speed not collapsed against the non-speculative decode"
BURST = 32


def judge(cell: Cell, run: ContainerRun, record: CellRecord) -> None:
    """The check definitions applied to what the container printed."""
    figures = run_figures(cell.check, run, record)
    if figures is not None:
        if cell.check == "build":
            figures["exit"] = run.exit_code  # a compile script that crashed after printing fails too
        judge_figures(cell, figures, record)


def run_figures(check: str, run: ContainerRun, record: CellRecord) -> dict | None:
    """The figures a check container printed last; None, with the failed part recorded, where it
    did not start, timed out or printed none."""
    where = f"{check} in the patched image"
    if run.start_error:
        record.parts.append(Part(where, FAILED, f"the container did not start: {run.start_error}"[:600]))
        return None
    if run.timed_out:
        record.parts.append(Part(where, FAILED, "timed out"))
        return None
    figures = last_json(run.log)
    if figures is None:
        record.parts.append(Part(where, FAILED, f"exit {run.exit_code}, no figures printed: {run.log.strip()[-400:]}"))
    return figures


def judge_figures(cell: Cell, figures: dict, record: CellRecord, synthetic: bool = False) -> None:
    """A build, load or spec cell's parts from its figures (what its check printed, or, where its
    server never became healthy, what the server's container reported). ``synthetic``: served
    from the synthetic checkpoint, whose zeroed final norms force accept length and greedy
    agreement: they are recorded, not judged."""
    record.gpu = str(figures.pop("gpu", ""))
    record.figures.update(figures)
    if cell.check == "build":
        kernels = figures.get("kernels", {})
        failed = {k: v for k, v in kernels.items() if v}
        ok = kernels and not failed and figures.get("exit", 0) == 0
        detail = f"compiled {', '.join(kernels)}" if ok else f"{failed or 'nothing compiled'}"
        record.parts.append(Part("JIT compile of the touched kernels in the container", PASSED if ok else FAILED, detail))
        return
    healthy = figures.get("healthy_s")
    record.parts.append(
        Part("server healthy", PASSED if healthy is not None else FAILED,
             f"after {healthy} s" if healthy is not None else f"not healthy: {figures.get('error', 'see the log')}")
    )
    mismatches = figures.get("mismatch_lines") or []
    record.parts.append(Part("no shape mismatch in the server log", FAILED if mismatches else PASSED, "; ".join(mismatches)[:400]))
    record.figures["checkpoint"] = "synthetic" if synthetic else "model"
    if healthy is not None:
        record.parts.append(compile_part(figures))
    if cell.check == "load":
        text = figures.get("generate")
        record.parts.append(Part("one generate", PASSED if text else FAILED, repr(text)[:200]))
        if healthy is not None:
            record.parts.append(flags_part(figures))
        return
    for part in spec_parts(cell.depth, record.figures, synthetic):  # derived figures land in the record
        record.parts.append(part)


COMPILE_PART = "the fused metadata-copy kernel did not fail to compile"


def compile_part(figures: dict) -> Part:
    """The missing ROCm guard's own signature: the pin's Python caller logs every failed JIT
    compile and falls back, and the failure is not cached, so a count above one is the compile
    retried step after step."""
    failures = figures.get("compile_failures") or 0
    if not failures:
        return Part(COMPILE_PART, PASSED, "no failed compile in the server log")
    retried = " (retried: the failure is not cached)" if failures > 1 else ""
    return Part(COMPILE_PART, FAILED, f"{failures} failed compile(s){retried}: {figures.get('compile_failure_line', '')}"[:400])


FLAGS_PART = "the launch's flags resolve as asked"


def flags_part(figures: dict) -> Part:
    """The flags the launch asked for (``asked``), as the running server reports them: a flag it
    reports otherwise fails; one it does not report leaves the part unchecked, never passed."""
    asked, resolved = figures.get("flags_asked") or {}, figures.get("flags_resolved") or {}
    if not asked:
        return Part(FLAGS_PART, PASSED, "the launch asks for none of the checked flags")
    wrong = {flag: (value, resolved[flag]) for flag, value in asked.items() if flag in resolved and resolved[flag] != value}
    unknown = sorted(flag for flag in asked if flag not in resolved)
    findings = "; ".join(figures.get("flag_findings") or [])
    if wrong:
        return Part(FLAGS_PART, FAILED, "; ".join(f"{flag}: asked {a!r}, the server runs {r!r}" for flag, (a, r) in wrong.items())[:400])
    if unknown:
        return Part(FLAGS_PART, SKIPPED, f"the server's /server_info does not report {', '.join(unknown)}")
    return Part(FLAGS_PART, PASSED, ", ".join(f"{flag}={value!r}" for flag, value in asked.items())
                + (f"; the server log says: {findings}" if findings else ""))


def spec_parts(depth: int, figures: dict, synthetic: bool = False) -> list[Part]:
    parts = []
    match = figures.get("prefix_match")
    if synthetic:
        if match:
            figures["prefix_match_mean"] = round(sum(match) / len(match), 3)
        # The checkpoint's zeroed final norms make every logit 0, so target and draft both emit
        # token 0 whatever the layers computed: agreement and acceptance are forced, and prove
        # nothing of the draft. Recorded; judged on the full model (the gate's accept length).
        figures["not_judged"] = ["accept_length", "prefix_match"]
    elif match is None:
        parts.append(Part("greedy outputs against the non-speculative run", FAILED, "no comparison was made"))
    else:
        mean = sum(match) / len(match)
        figures["prefix_match_mean"] = round(mean, 3)
        parts.append(Part("greedy outputs against the non-speculative run", PASSED if mean >= PREFIX_MATCH_FLOOR else FAILED,
                          f"{figures.get('exact_match')} of {len(match)} identical, mean prefix match {mean:.2f}"
                          f" (floor {PREFIX_MATCH_FLOOR})"))
    accept = figures.get("accept_length")
    floor = ACCEPT_LENGTH_FLOORS[depth]
    source = "sglang's AMD CI" if depth == SGLANG_CI_DEPTH else f"from sglang's AMD CI {SGLANG_CI_ACCEPT_LENGTH} at depth {SGLANG_CI_DEPTH}"
    if not synthetic:
        parts.append(Part(f"accept length at least {floor}", PASSED if accept is not None and accept >= floor else FAILED,
                          f"{accept} (floor {floor}, {source})"))
    speed, base = figures.get("decode_tok_s"), figures.get("plain_decode_tok_s")
    if not speed or not base:
        parts.append(Part(COLLAPSE_PART, FAILED, f"depth {depth}: {speed}, without speculative decoding: {base}"))
    else:
        ratio = speed / base
        figures["decode_ratio_vs_plain"] = round(ratio, 3)
        parts.append(Part(COLLAPSE_PART, PASSED if ratio >= COLLAPSE_RATIO else FAILED,
                          f"{speed:.1f} tok/s at depth {depth} vs {base:.1f} without speculative decoding"
                          f" (x{ratio:.2f}, floor x{COLLAPSE_RATIO})"))
    completed = figures.get("burst_completed") or 0
    parts.append(Part(f"{BURST} concurrent requests complete", PASSED if completed == BURST else FAILED,
                      f"{completed} of {BURST}; {figures.get('burst_errors') or ''}"))
    return parts
