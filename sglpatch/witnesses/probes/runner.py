"""Child side of every CPU witness: one process per tree imports the tree's sglang once and runs
each requested probe in turn.

    python runner.py SPEC.json OUT_DIR

Runs in the pin's CPU interpreter with the tree's ``python/`` folder first on the path (see
``sglpatch.witnesses.probe_runs``). SPEC::

    {"workdir": "...", "import_env": {...}, "arch": "gfx950:sramecc+:xnack-", "tree": ".../python",
     "probes": [{"name": "mtp", "module": "mtp_probe", "limit_s": 120, "spec": {...}}, ...]}

The box is prepared once (``rocm_box``: the profile's environment, the emulated MI355X, the
stand-ins), sglang is imported once, then each probe module's ``run(spec, context)`` is called
and its answer written to ``OUT_DIR/<name>.json`` as soon as it returns, so one probe that fails
or hangs costs only its own answer. Each probe runs under its own time limit (``limit_s``,
enforced with SIGALRM); a probe past it answers ``{"ok": false, "timed_out": true, "phase": ...}``
naming the phase it was in. ``OUT_DIR/progress`` gets one line per phase as it starts, so the
parent can name what hung if this whole process has to be killed; ``OUT_DIR/runner.json`` holds
the timings (import, each probe) and what the box emulated and stood in for.

No sglpatch imports: this file runs in the pin's interpreter, not ours.
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import signal
import sys
import time
import traceback
import warnings


class ProbeTimeout(BaseException):
    """Raised in the probe by SIGALRM; a BaseException so that a probe's ``except Exception``
    cannot swallow it."""


class Context:
    """What a probe gets besides its spec: the box, and a way to say which phase it is in."""

    def __init__(self, out_dir: str, box: dict, workdir: str, tree: str | None = None):
        self.out_dir = out_dir
        self.box = box
        self.workdir = workdir
        self.tree = tree  # the tree's python/ folder, as the spec names it
        self.probe = ""
        self.phase_name = ""

    def phase(self, name: str) -> None:
        self.phase_name = name
        with open(os.path.join(self.out_dir, "progress"), "a") as handle:
            handle.write(f"{time.time():.3f} {self.probe}: {name}\n")


def _write(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=1, default=str)
    os.replace(tmp, path)


def main(spec_path: str, out_dir: str, box: dict | None = None) -> int:
    """Run the spec's probes; ``box`` when the box was prepared already (``zygote.py``)."""
    with open(spec_path) as handle:
        spec = json.load(handle)
    context = Context(out_dir, {}, spec["workdir"], spec.get("tree"))
    timings: dict[str, float] = {}
    report: dict = {"ok": False, "seconds": timings}
    try:
        version = _prepare(spec, context, timings, report, box)
    except BaseException as exc:  # noqa: BLE001 - no probe can run; the parent says why
        report.update(phase=context.phase_name, error=f"{type(exc).__name__}: {exc}"[:2000],
                      traceback=traceback.format_exc(limit=-10))
        _write(os.path.join(out_dir, "runner.json"), report)
        return 1
    _run_probes(spec, context, timings, version)
    report["ok"] = True
    report["third_party"] = third_party_modules(spec.get("tree"))
    _write(os.path.join(out_dir, "runner.json"), {**report, **context.box})
    return 0


def third_party_modules(tree: str | None) -> list[str]:
    """Modules imported from the environment's site-packages, in import order: what a fork
    server can import ahead for the next tree (``zygote.py``), none of sglang's."""
    import bytecode

    roots = tuple(bytecode.environment_roots())
    tree = os.path.abspath(tree) if tree else None
    found = []
    for name, module in list(sys.modules.items()):
        path = getattr(module, "__file__", None) or ""
        if path and path.startswith(roots) and not (tree and path.startswith(tree)):
            found.append(name)
    return found


def _prepare(spec: dict, context: Context, timings: dict, report: dict, box: dict | None) -> str:
    started = time.monotonic()
    warnings.filterwarnings("ignore")
    context.probe = "runner"
    context.phase("prepare the emulated MI355X box")
    tree = spec.get("tree")
    if spec.get("bytecode_cache"):
        import bytecode

        report["bytecode"] = bytecode.install([*([tree] if tree else []), *bytecode.environment_roots()],
                                              spec["bytecode_cache"])
    import rocm_box

    if box is None:
        context.box = rocm_box.prepare_box(spec.get("import_env", {}), spec.get("arch") or rocm_box.MI355X,
                                           spec["workdir"])
    else:
        import hip_emulation

        context.box = dict(box, process="forked from a fork server that prepared the box")
        hip_emulation.set_arch(spec.get("arch") or rocm_box.MI355X)  # as the box was made, whatever ran before
    if tree and tree not in sys.path:
        sys.path.insert(0, tree)
    context.box.update(rocm_box.prepare_tree(tree, spec.get("registry_archs")))
    timings["box"] = round(time.monotonic() - started, 2)
    context.phase("import sglang")
    import_started = time.monotonic()
    # What every probe needs first; each probe imports the rest of what it uses.
    import sglang
    from sglang.srt.server_args import ServerArgs  # noqa: F401

    if tree and not os.path.abspath(sglang.__file__).startswith(os.path.abspath(tree)):
        raise RuntimeError(f"sglang was imported from {sglang.__file__}, not from the tree {tree}")
    timings["import"] = round(time.monotonic() - import_started, 2)
    import standins

    # What sglang's import read from the named stand-ins other than by ``from m import name``
    # (module-level constants, feature checks), for the answer; each probe then counts its own.
    context.box["standin_reads_at_import"] = standins.reads()
    standins.reset_calls()
    # Below warnings is quiet, as a server logs by default; the probes collect what they judge.
    logging.getLogger().setLevel(logging.WARNING)
    return getattr(sglang, "__version__", "?")


def _run_probes(spec: dict, context: Context, timings: dict, version: str) -> None:
    def alarm(signum, frame):
        raise ProbeTimeout()

    signal.signal(signal.SIGALRM, alarm)
    started = time.monotonic()
    import_environ = dict(os.environ)
    for probe in spec["probes"]:
        # Every probe starts from the import environment: sglang's resolution writes to it.
        os.environ.clear()
        os.environ.update(import_environ)
        name = probe["name"]
        context.probe = name
        context.phase("start")
        probe_started = time.monotonic()
        answer: dict
        signal.alarm(max(1, int(probe.get("limit_s", 300))))
        try:
            module = importlib.import_module(probe["module"])
            answer = module.run(probe.get("spec", {}), context)
            answer["ok"] = True
        except ProbeTimeout:
            answer = {"ok": False, "timed_out": True, "phase": context.phase_name,
                      "error": f"ran past its {probe.get('limit_s')} s limit while in: {context.phase_name}"}
        except BaseException as exc:  # noqa: BLE001 - the parent reports it; SystemExit too
            if isinstance(exc, KeyboardInterrupt):
                raise
            answer = {"ok": False, "phase": context.phase_name, "error": f"{type(exc).__name__}: {exc}"[:2000],
                      "traceback": traceback.format_exc(limit=-10)}
        finally:
            signal.alarm(0)
        seconds = round(time.monotonic() - probe_started, 2)
        timings[name] = seconds
        answer.setdefault("seconds", seconds)
        answer.setdefault("sglang", version)
        answer.setdefault("emulated_gpu", context.box.get("emulated_gpu"))
        answer.setdefault("standins", context.box.get("standins"))
        _write(os.path.join(context.out_dir, f"{name}.json"), answer)
    timings["probes"] = round(time.monotonic() - started, 2)


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
