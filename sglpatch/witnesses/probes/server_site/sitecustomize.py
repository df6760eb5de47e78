"""Python runs this at start-up in every process of the rehearsal's sglang server (this folder is
on its PYTHONPATH, and only there): the server's stand-ins, when ``SGLPATCH_SERVER_STANDINS=1``,
and the probes' content-keyed bytecode cache (``bytecode.py``), when ``SGLPATCH_BYTECODE_CACHE``
names it, for the folders ``SGLPATCH_BYTECODE_ROOTS`` lists and the environment's site-packages.
See ``server_standins``."""

import os
import sys

if os.environ.get("SGLPATCH_SERVER_STANDINS") == "1" or os.environ.get("SGLPATCH_BYTECODE_CACHE"):
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

if os.environ.get("SGLPATCH_BYTECODE_CACHE"):
    import bytecode

    roots = [root for root in os.environ.get("SGLPATCH_BYTECODE_ROOTS", "").split(os.pathsep) if root]
    bytecode.install([*roots, *bytecode.environment_roots()], os.environ["SGLPATCH_BYTECODE_CACHE"])

if os.environ.get("SGLPATCH_SERVER_STANDINS") == "1":
    import server_standins

    server_standins.install_from_env()
