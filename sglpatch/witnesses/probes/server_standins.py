"""The stand-ins the rehearsal's real sglang server needs on CPU (``sglpatch.rehearsal``), and
nothing else: named test doubles for packages that cannot exist on this machine.

- ``sgl_kernel``: no CPU build exists on any registry (its CPU ops are built from sglang's own
  sources). sglang imports it on the server's paths; the served CPU path (``SGLANG_USE_CPU_ENGINE=1``,
  ``--attention-backend torch_native``, no speculative decoding) calls none of it. Import-only:
  anything used from it raises ``StandinCalled`` and says so in the server log.
- ``torchvision``: the wheel on the index is a CUDA build that does not load beside torch CPU; the
  witnesses' catch-all stand-in (only its ``InterpolationMode`` is real), as their probes use it.
  sglang imports it for its multimodal processors, which a text-only Llama never runs.

Installed in every process of the server (the launcher and the scheduler and detokenizer processes
it spawns) by ``server_site/sitecustomize.py`` when ``SGLPATCH_SERVER_STANDINS=1``; each process
prints ``STANDIN_LINE`` once, so the server log says that the run leaned on them. A rehearsal
line that ran against such a server says so, and is never a verdict on a pin.
"""

from __future__ import annotations

import os
import sys

ENV = "SGLPATCH_SERVER_STANDINS"
STANDIN_LINE = "sglpatch stand-ins in this sglang process (not sglang's own code):"
CALLED = "sglpatch stand-in:"  # the start of what an import-only stand-in prints when it is used


def install() -> list[str]:
    import standins

    stood_in = []
    if standins.install_import_only("sgl_kernel"):
        stood_in.append("sgl_kernel (import-only)")
    stood_in += [f"{root} (catch-all)" for root in standins.install("torchvision")]
    return stood_in


def install_from_env() -> None:
    if os.environ.get(ENV) != "1":
        return
    stood_in = install()
    print(f"{STANDIN_LINE} {', '.join(stood_in) or 'none'} (pid {os.getpid()})", file=sys.stderr, flush=True)
