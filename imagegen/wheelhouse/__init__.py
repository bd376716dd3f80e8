"""The wheelhouse: where a cell's wheel goes, what its folder's manifest says (read by the executors
before building and by publish and index after), and its one writer, collect, with the build records it
verifies each wheel against."""
