"""imagegen: build CUDA-extension wheels for an exact torch x CUDA x Python x GPU-arch cell.

Data flow: request -> plan (validated cells) -> render (Dockerfile, bake) -> execute -> collect
-> verify -> publish. Each step lives in its own module.
"""

__version__ = "0.1.0"
# The name pip installs imagegen by (PyPI's "imagegen" is another project); the command and this
# package are imagegen.
DISTRIBUTION = "imagegen-wheels"
