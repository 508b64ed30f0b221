"""Set Diffusion language models and the benchmark suite around them."""

__version__ = "0.1.0"
