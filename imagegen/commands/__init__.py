"""The shell's commands, one module per group (`ci` and `doctor` included); imagegen.cli parses the
command line and dispatches here. Each command reads its options, plans, and hands the plan to the
steps (render, an executor, finish, the wheelhouse, publish)."""
