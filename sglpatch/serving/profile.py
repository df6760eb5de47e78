"""Launch profiles: the full, versioned flag set for serving a model with the patched sglang.

A profile is a TOML file in ``sglpatch/serving/profiles/``: environment, ``sglang.launch_server`` flags,
the model and its quantization, the workload it is tuned for, variants of it the bench also runs
(``[variants.NAME]``: flags to unset or set), and optionally a tuned aiter MoE config file kept beside
it (read by aiter through ``AITER_CONFIG_FMOE``). The test matrix and the bench read it;
``sglpatch profile NAME`` prints it for people.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import tomllib
from dataclasses import dataclass, field
from pathlib import Path

from sglpatch.plumbing.errors import SglpatchError

PROFILES_DIR = Path(__file__).parent / "profiles"
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*$")
MODEL_ENV = "SGLPATCH_MODEL"


@dataclass(frozen=True)
class Profile:
    name: str
    version: int
    description: str
    model: str
    architecture: str
    env: dict[str, str]
    server: dict[str, object]
    path: Path
    quantization: str = ""
    workload: str = ""  # the bench workload the profile is tuned for: "serving" or "single-stream"
    variants: dict[str, dict] = field(default_factory=dict)  # name -> {"unset": [flags], "set": {flag: value}}
    tuned_moe_config: str = ""  # a file beside the profile, for AITER_CONFIG_FMOE; "" for none

    def variant(self, name: str) -> "Profile":
        """The profile with a variant's flags unset or set; "as-shipped" is the profile itself."""
        if name == "as-shipped":
            return self
        if name not in self.variants:
            raise SglpatchError(f"{self.path}: no variant {name!r}; variants: as-shipped, {', '.join(self.variants)}")
        change = self.variants[name]
        server = {k: v for k, v in self.server.items() if k not in change.get("unset", [])}
        server.update(change.get("set", {}))
        return Profile(**{**self.__dict__, "server": server, "variants": {}})

    def content_digest(self) -> str:
        """A digest of the profile file's bytes and of the tuned MoE config it names: what an
        answer that read the profile depends on (its name and version do not change with an
        edit)."""
        digest = hashlib.sha256(self.path.read_bytes())
        moe = self.moe_config_path()
        if moe is not None:
            digest.update(b"\0" + moe.read_bytes())
        return digest.hexdigest()

    def moe_config_path(self) -> Path | None:
        """The tuned MoE config the profile names, where it exists (a tuning run writes it)."""
        if not self.tuned_moe_config:
            return None
        path = self.path.parent / self.tuned_moe_config
        return path if path.is_file() else None

    def with_depth(self, depth: int) -> "Profile":
        """Speculative depth d: EAGLE with d steps, top-k 1 and d + 1 draft tokens; the description
        says the depth it now launches at (where it named the profile's own, that is replaced)."""
        check_depth(depth)
        server = {
            **self.server,
            "speculative-algorithm": "EAGLE",
            "speculative-num-steps": depth,
            "speculative-eagle-topk": 1,
            "speculative-num-draft-tokens": depth + 1,
        }
        own = self.server.get("speculative-num-steps")
        said = re.compile(rf"\bdepth {own}\b")
        description = (said.sub(f"depth {depth}", self.description) if own is not None and said.search(self.description)
                       else f"{self.description}; speculative depth {depth}".lstrip("; "))
        return Profile(**{**self.__dict__, "server": server, "description": description})

    def server_args(self, model: str | None = None) -> list[str]:
        """The profile as ``sglang.launch_server`` arguments."""
        args = ["--model-path", model or os.environ.get(MODEL_ENV) or self.model]
        for flag, value in self.server.items():
            if value is True:
                args.append(f"--{flag}")
            elif value is not False:
                args += [f"--{flag}", str(value)]
        return args

    def command(self, model: str | None = None) -> str:
        env = " ".join(f"{key}={shlex.quote(value)}" for key, value in self.env.items())
        argv = ["python3", "-m", "sglang.launch_server", *self.server_args(model)]
        return f"{env} {shlex.join(argv)}".strip()


DEPTHS = range(1, 17)  # speculative depths a profile is launched at (the matrix checks 1 to 6: matrix.cells.DEPTHS)
DEPTHS_SAID = f"a whole number of draft steps from {DEPTHS[0]} to {DEPTHS[-1]}"


def check_depth(depth: int) -> int:
    """``depth`` where it is a speculative depth a profile can launch at; refused, saying which are."""
    if depth not in DEPTHS:
        raise SglpatchError(f"speculative depth {depth}: a depth is {DEPTHS_SAID}")
    return depth


def profile_names() -> list[str]:
    return sorted(path.stem for path in PROFILES_DIR.glob("*.toml"))


def load_profile(name: str) -> Profile:
    if not NAME_RE.match(name or ""):
        raise SglpatchError(f"launch profile name {name!r} is not a profile name (letters, digits, '.', '-', '_')")
    path = PROFILES_DIR / f"{name}.toml"
    if not path.is_file():
        raise SglpatchError(f"no launch profile {name!r} in {PROFILES_DIR}; known: {', '.join(profile_names())}")
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as exc:
        raise SglpatchError(f"{path}: not valid TOML: {exc}") from None
    missing = [key for key in ("name", "version", "model", "architecture", "server") if key not in data]
    if missing:
        raise SglpatchError(f"{path}: missing {', '.join(missing)}")
    if data["name"] != name:
        raise SglpatchError(f"{path}: name {data['name']!r} must be the file's name, {name!r}")
    if isinstance(data["version"], bool) or not isinstance(data["version"], int) or data["version"] < 1:
        raise SglpatchError(f"{path}: version must be a whole number from 1 (got {data['version']!r})")
    for key in ("model", "architecture", "description"):
        if not isinstance(data.get(key, ""), str):
            raise SglpatchError(f"{path}: {key} must be a string")
    for table in ("env", "server"):
        if not isinstance(data.get(table, {}), dict):
            raise SglpatchError(f"{path}: [{table}] must be a table")
    bad = [flag for flag, value in data["server"].items() if not isinstance(value, (str, int, float, bool))]
    if bad:
        raise SglpatchError(f"{path}: server flag {bad[0]} must be a string, number or true/false")
    return Profile(
        name=data["name"],
        version=int(data["version"]),
        description=data.get("description", ""),
        model=data["model"],
        architecture=data["architecture"],
        env={key: str(value) for key, value in data.get("env", {}).items()},
        server=dict(data["server"]),
        path=path,
        quantization=str(data.get("quantization", "")),
        workload=str(data.get("workload", "")),
        variants={name: dict(change) for name, change in data.get("variants", {}).items()},
        tuned_moe_config=str(data.get("tuned_moe_config", "")),
    )
