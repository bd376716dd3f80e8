"""Generators, one per output: the builder Dockerfile and the cell document, bake definitions and
the repository's generated files, the Windows script, the CI workflow."""
