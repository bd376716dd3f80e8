"""The finish step: a built wheel verified (the requested SASS/PTX really is in its .so files: verify,
fatbin), handed to imagegen.wheelhouse.collect, which places it with its log and manifest entry, and
checked on a GPU (check). finisher.finish is the one path every executor's wheel takes; the command
hands it to the executors."""
