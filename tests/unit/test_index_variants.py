"""Tests for imagegen.publish.index_variants: which files of a project folder are the index's wheel variants
(what a later run may remove). Writing them, and what a variant-aware installer makes of them:
tests/unit/test_variants.py and tests/integration/test_index_variants.py."""

from __future__ import annotations

from imagegen.publish import index_variants
from tests.unit.executor_fixtures import WHEEL
from tests.unit.test_variants import VARIANTS_JSON, VERSION


def test_variant_support_is_the_variants_module():
    assert index_variants.variant_support().__name__ == "imagegen.publish.variants"


def test_only_the_index_own_variant_files_count_as_its(tmp_path):
    assert index_variants.is_variant_file(f"tiny_kernel-{VERSION}-cp311-cp311-linux_x86_64-cu130_1a2b3c4d.whl")
    assert index_variants.is_variant_file(f"tiny_kernel-{VERSION}-cp311-cp311-linux_x86_64-cu130_1a2b3c4d.whl.metadata")
    assert index_variants.is_variant_file("demo-1.0-1-py3-none-any-null.whl")  # with a build tag
    assert index_variants.is_variant_file(VARIANTS_JSON)
    assert not index_variants.is_variant_file(WHEEL.name)  # a plain wheel, build tag or not
    assert not index_variants.is_variant_file("demo-1.0-1-py3-none-any.whl")
    assert not index_variants.is_variant_file("demo-1.0-py3-none-any-NotALabel.whl")
    assert not index_variants.is_variant_file("index.html")
