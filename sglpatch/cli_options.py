"""What the verbs share: their flags (``--json``, ``-j``, ``--allow-unavailable``, the ROCm
options), where their text goes, and the parser each verb is registered with."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from sglpatch.plumbing import progress


def add(sub, name: str, run, help: str, *, needs_project: bool = True) -> argparse.ArgumentParser:
    """A verb's parser, with ``run`` as what it does."""
    parser = sub.add_parser(name, help=help, description=help[:1].upper() + help[1:] + ".")
    parser.set_defaults(run=run, needs_project=needs_project)
    return parser


def json_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", action="store_true", help="print one JSON document on stdout; the text goes to stderr")


def witness_mode(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--allow-unavailable",
        action="store_true",
        help="a witness that cannot run here does not fail the pin; every such line says UNPROVEN",
    )


class _Given(argparse.Action):
    """Stores the value and notes that it was given (``args.given``): a verb can refuse a flag that
    means nothing in the mode it runs in, even where the value given equals the default."""

    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


def jobs_flag(parser: argparse.ArgumentParser, what: str) -> None:
    from sglpatch.plumbing import workers  # multiprocessing: only the verbs that take -j pay for it

    parser.add_argument(
        "-j", "--jobs", type=_positive, default=workers.default_jobs(), metavar="N", action=_Given,
        help=f"{what} in N worker processes at once (default: the machine's cores, at most {workers.MAX_DEFAULT_JOBS})",
    )


def _positive(value: str) -> int:
    try:
        number = int(value)
    except ValueError:
        number = 0
    if number < 1:
        raise argparse.ArgumentTypeError(f"{value!r} is not a positive whole number")
    return number


def text(args: argparse.Namespace):
    """Where a verb's human text goes: stdout, or stderr when stdout carries its JSON document."""
    return sys.stderr if getattr(args, "json", False) else sys.stdout


def say(args: argparse.Namespace, line: str = "") -> None:
    progress.stop()
    print(line, file=text(args))


def emit_json(args: argparse.Namespace, document) -> None:
    if getattr(args, "json", False):
        progress.stop()
        print(json.dumps(document, indent=2, default=str))


def rocm_options(parser: argparse.ArgumentParser, prefix: str = "") -> None:
    parser.add_argument("--image", help=f"{prefix}base image for the pin ({{version}} is replaced; default: the pin's rocm_image)")
    parser.add_argument("--model", help=f"{prefix}the model folder (default: the profile's, or $SGLPATCH_MODEL)")
    parser.add_argument("--hf-cache", type=Path,
                        help=f"{prefix}the Hugging Face cache to mount (default: $HF_HOME or ~/.cache/huggingface)")
    parser.add_argument("--server-timeout", type=int, default=2400, help=f"{prefix}seconds for a server to become healthy")


def options_from(args: argparse.Namespace):
    from sglpatch.rocm.options import RocmOptions

    options = RocmOptions(base_image=args.image, model=args.model, server_timeout=args.server_timeout)
    if args.hf_cache:
        options.hf_cache = args.hf_cache
    return options


def keep_record(record, path: Path | None) -> None:
    """Also write a matrix or gate record at ``path`` (nox reads it to report a skip)."""
    if path is None:
        return
    from sglpatch.matrix.records import write_record

    write_record(record, path.parent)
    written = path.parent / f"{record.cell_id}.json"
    if written != path:
        written.replace(path)


def pin_version(project, name: str) -> str:
    return project.pins().select([name])[0].version
