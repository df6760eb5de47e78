"""A dress rehearsal of the ROCm job's in-image checks against the pin's real sglang server on CPU
(``runner``); see docs/rehearsal.md."""
