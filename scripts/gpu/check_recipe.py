#!/usr/bin/env python3
"""Run a recipe's GPU check (its `smoke.gpu_check`, e.g. sageattn against torch SDPA) against the
wheel installed in the current environment. Usage: python scripts/gpu/check_recipe.py sageattention"""

import sys
import time

from imagegen.recipes import load_catalogue

recipe = load_catalogue().get(sys.argv[1])
code = recipe.smoke.gpu_check
if not code.strip():
    sys.exit(f"{recipe.name} has no gpu_check")
t0 = time.time()
exec(compile(code, f"<{recipe.name} gpu_check>", "exec"), {})  # noqa: S102 - the recipe's own check
print(f"gpu_check of {recipe.name} passed in {time.time() - t0:.1f} s")
