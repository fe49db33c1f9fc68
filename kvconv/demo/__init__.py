"""Inputs ``kvconv demo`` builds for itself, shipped in the package (a generator, not the dump's bytes: the wheel
stays small and the demo works from any install).

    >>> from kvconv.demo import qwen3_14b          # the reconstructed Qwen3-14B run, 7.4 MB once written
"""
