"""``sglpatch image``: the pin's patched image, built FROM its released ROCm image."""

from __future__ import annotations

from sglpatch import exitcodes
from sglpatch.cli_options import add, pin_version, say
from sglpatch.plumbing import progress


def register(sub) -> None:
    parser = add(sub, "image", run, "build the pin's patched image FROM its released ROCm image (docker)")
    parser.add_argument("pin")
    parser.add_argument("--image", help="base image ({version} is replaced; default: the pin's rocm_image or $SGLPATCH_ROCM_IMAGE)")
    parser.add_argument("--docker-url", help="the docker engine (default: $DOCKER_HOST or the local socket)")
    parser.add_argument(
        "--witness",
        action="store_true",
        help="prove the series here with its witnesses first (builds their environments), instead of "
        "taking it as series.lock pins it",
    )


def run(project, args) -> int:
    from sglpatch.rocm import containers, image
    from sglpatch.rocm.options import RocmOptions

    version = pin_version(project, args.pin)
    client = containers.connect(args.docker_url)
    options = RocmOptions(base_image=args.image, docker_url=args.docker_url, gpu=False)
    spec, proof = _witnessed_spec(project, version, options) if args.witness else _locked_spec(project, version, options)
    with progress.step(f"image for sglang {version}") as shown:
        shown.update(f"# building {spec.tag} FROM {spec.base_image}")
        image_id = image.build_image(client, spec, shown.update)
    say(args, f"{spec.tag}  {image_id}")
    for key, value in sorted(spec.labels.items()):
        say(args, f"  {key}={value}")
    applied = ", ".join(name for name, _ in spec.patches) or "nothing to apply"
    say(args, f"  checkout: {spec.checkout} (the series: {applied}; {proof})")
    return exitcodes.OK


def _locked_spec(project, version: str, options):
    """The series as series.lock pins it (``into.locked_series``): no witness runs."""
    from sglpatch.apply.index_apply import commit_as_patch
    from sglpatch.apply.into import locked_series
    from sglpatch.rocm.image import image_spec

    pin = project.pins().select([version])[0]
    series = project.series()
    with locked_series(project, pin) as locked:
        patches = [(name, commit_as_patch(locked.repo, commit)) for (name, _), commit in zip(locked.renditions, locked.commits)]
        return image_spec(pin, series.version, series.digest(), patches, options), f"as locked ({locked.proof})"


def _witnessed_spec(project, version: str, options):
    from sglpatch.apply.pin_under_test import prepare_pin
    from sglpatch.rocm.image import patched_image

    put = prepare_pin(project, version)
    return patched_image(put, options), "witnessed here"
