"""Python runs this at start-up in every process of the rehearsal's sglang server (this folder is
on its PYTHONPATH, and only there): the server's stand-ins, when ``SGLPATCH_SERVER_STANDINS=1``.
See ``server_standins``."""

import os
import sys

if os.environ.get("SGLPATCH_SERVER_STANDINS") == "1":
    sys.path.insert(1, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    import server_standins

    server_standins.install_from_env()
