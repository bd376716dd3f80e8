"""Plan: from a request (flags > config > defaults) to validated cells, and the proofs before anything
compiles: the matrix and its policy, the options and config, git refs, the compatibility tables' refresh,
the base-image lock, the dependency resolution and the gencode audit."""
