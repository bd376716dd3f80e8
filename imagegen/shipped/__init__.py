"""Code shipped out of imagegen: the scripts a builder image runs (builder/: the build, its environment,
fetch, resume, supervision, the gencode audit's stand-in compilers, the checks) and the helper a Windows
script runs (windows/). Standard library only, each run as a plain script beside its siblings; the parts
imagegen itself uses too (builder/imagegen_rules.py, imagegen_wheeltools.py, imagegen_records.py) are the
one implementation of what both sides must agree on."""
