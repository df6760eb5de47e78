"""Scripts that run inside the patched ROCm image (standard library only, copied to
/opt/sglpatch/checks); the host imports the ones it shares (bench_metrics, power) from here."""
