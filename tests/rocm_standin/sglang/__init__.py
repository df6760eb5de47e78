"""A TEST DOUBLE of the sglang package (see tests/rocm_standin/README.md); not sglang."""
