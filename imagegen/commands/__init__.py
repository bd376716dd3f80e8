"""The shell's commands, one module per group; imagegen.cli parses the command line and dispatches
here. Each command reads its options, plans, and hands the plan to the steps (render, an executor,
finish, publish)."""
