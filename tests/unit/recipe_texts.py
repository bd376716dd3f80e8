"""Shared by the recipe tests (test_recipes, test_recipe_file, test_recipe_reader): a good recipe file
and a writer for it."""

from __future__ import annotations

import textwrap
from pathlib import Path

GOOD = textwrap.dedent("""\
    schema: 1
    name: demo
    aliases: [dm]
    description: "a demo"
    source:
      git: https://github.com/example/demo.git
    versions:
      "1.0":
        ref: v1.0
        commit: 0123456789abcdef0123456789abcdef01234567
        archs: ["8.0", "9.0"]
    arch:
      env: DEMO_ARCHS
      style: numeric
      ptx: none
    build:
      force_env: {DEMO_FORCE_BUILD: "TRUE"}
      env: {DEMO_FLAG: "1"}
    smoke:
      imports: [demo]
    obsolete_patches:
      - name: "old patch"
        reason: "fixed upstream"
    """)


def write(tmp_path: Path, text: str, name: str = "demo.yaml") -> Path:
    p = tmp_path / name
    p.write_text(text)
    return p
