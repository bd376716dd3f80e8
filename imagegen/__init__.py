"""imagegen: build CUDA-extension wheels for an exact torch x CUDA x Python x GPU-arch cell.

Data flow: request -> plan (validated cells) -> render (Dockerfile, bake) -> execute -> collect
-> verify -> publish. Each step lives in its own module.
"""

__version__ = "0.1.0"
