"""``sglpatch image``: the pin's patched image, built FROM its released ROCm image."""

from __future__ import annotations

from sglpatch import exitcodes, progress
from sglpatch.commands import add, pin_version, say


def register(sub) -> None:
    parser = add(sub, "image", run, "build the pin's patched image FROM its released ROCm image (docker)")
    parser.add_argument("pin")
    parser.add_argument("--image", help="base image ({version} is replaced; default: the pin's rocm_image or $SGLPATCH_ROCM_IMAGE)")
    parser.add_argument("--docker-url", help="the docker engine (default: $DOCKER_HOST or the local socket)")


def run(project, args) -> int:
    from sglpatch.matrix import containers
    from sglpatch.matrix import rocm as rocm_tier
    from sglpatch.matrix.pin import prepare_pin

    version = pin_version(project, args.pin)
    client = containers.connect(args.docker_url)
    put = prepare_pin(project, version)
    options = rocm_tier.RocmOptions(base_image=args.image, docker_url=args.docker_url, gpu=False)
    with progress.step(f"image for sglang {version}") as shown:
        spec, image_id = rocm_tier.build_patched_image(client, put, options, shown.update)
    say(args, f"{spec.tag}  {image_id}")
    for key, value in sorted(spec.labels.items()):
        say(args, f"  {key}={value}")
    applied = ", ".join(name for name, _ in spec.patches) or "nothing to apply"
    say(args, f"  checkout: {spec.checkout} (the series: {applied})")
    return exitcodes.OK
