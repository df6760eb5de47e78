"""A fork server for the CPU probes: the box prepared and the environment's packages imported
once, then one forked child per tree.

    python zygote.py CONFIG.json      (then one JSON request per line on stdin)

Preparing the box (``rocm_box.prepare_box``: the profile's environment, the stand-ins, torch and
triton emulating the MI355X) and importing the environment's third-party packages (torch,
transformers, triton, pydantic, ...: CONFIG's ``preload``, the modules the previous runs imported
from site-packages) take most of a probe run and are the same for every tree of one environment.
This process does them once; for each request ``{"spec": ..., "out": ..., "log": ...}`` it forks
a child that imports the tree's own sglang and runs ``runner.main`` with the prepared box. Nothing
of sglang is imported here, so every child imports its tree's sglang from scratch.

Answers on stdout, one JSON line each: ``{"ready": ..., "preloaded": n, "failed": [...]}`` once,
then per request ``{"pid": child}`` and ``{"exit": code}``. The child leads its own process group,
so the parent can kill it and whatever it started. EOF on stdin ends the server.

No sglpatch imports: this file runs in the pin's interpreter, not ours.
"""

from __future__ import annotations

import importlib
import json
import os
import sys
import time
import traceback


def _say(message: dict) -> None:
    sys.stdout.write(json.dumps(message) + "\n")
    sys.stdout.flush()


def _preload(names: list[str]) -> tuple[int, list[str]]:
    loaded, failed = 0, []
    for name in names:
        if name in sys.modules:
            continue
        try:
            importlib.import_module(name)
            loaded += 1
        except BaseException as exc:  # noqa: BLE001 - a module that needs what only sglang sets up
            if isinstance(exc, KeyboardInterrupt):
                raise
            failed.append(f"{name}: {type(exc).__name__}")
    return loaded, failed


def main(config_path: str) -> int:
    started = time.monotonic()
    with open(config_path) as handle:
        config = json.load(handle)
    import warnings

    warnings.filterwarnings("ignore")
    if config.get("bytecode_cache"):
        import bytecode

        bytecode.install(bytecode.environment_roots(), config["bytecode_cache"])
    import rocm_box

    box = rocm_box.prepare_box(config.get("import_env", {}), config.get("arch") or rocm_box.MI355X, config["workdir"])
    loaded, failed = _preload([n for n in config.get("preload", []) if not n.split(".")[0] == "sglang"])
    if any(name == "sglang" or name.startswith("sglang.") for name in sys.modules):
        raise RuntimeError("the fork server imported sglang; children must import their tree's own")
    _say({"ready": round(time.monotonic() - started, 2), "preloaded": loaded, "failed": failed[:20]})
    import runner

    for line in sys.stdin:
        request = json.loads(line)
        pid = os.fork()
        if pid == 0:  # the child: its own process group, its output to the request's log
            code = 1
            try:
                os.setpgid(0, 0)
                log = os.open(request["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(log, 1)
                os.dup2(log, 2)
                sys.stdin.close()
                import torch

                # Forked after torch was imported: keep its intra-op work on this thread, so no
                # thread pool inherited half-made from the server is ever entered.
                torch.set_num_threads(1)
                code = runner.main(request["spec"], request["out"], box=box)
            except BaseException:  # noqa: BLE001
                traceback.print_exc()
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
                os._exit(code)  # no interpreter teardown: nothing to clean that the OS does not
        _say({"pid": pid})
        _, status = os.waitpid(pid, 0)
        _say({"exit": os.waitstatus_to_exitcode(status)})
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
