"""The bench: the write-up's workloads on a patched pin, with sglang's own client, on a ROCm node.

Read it one file at a time:

- ``client``     the pin's own benchmark client: its module and the flags it has, read from its source
- ``workloads``  serving (20k in / 1k out, 60% shared prefix, a rate sweep to the knee) and single
                 stream (10k in / 1.5k out), as the client's exact arguments; the write-up's figures
- ``scan``       silent slow paths named in server logs (untuned aiter MoE shapes, inert fusion)
- ``records``    one receipt per run: pin, series, image, GPU, ROCm, profile, model, commands, raw files
- ``report``     the write-up's table with tok/s/W, and the plot
- ``compare``    per-figure ratios between two record sets (pristine image against patched)
- ``accuracy``   the GSM8K and accept-length gate, with sglang's own AMD CI thresholds
- ``on_rocm_node`` the door: the patched image, the container, the records (skips here, saying why)

Inside the image the measuring is done by ``sglpatch/rocm/checks/bench_run.py`` (figures:
``bench_metrics``, power: ``power``); the containers, the image and the profiles each workload
launches are ``sglpatch.rocm``'s.
"""
