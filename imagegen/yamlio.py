"""YAML loading for imagegen's data files: the libyaml loader when PyYAML has it (about ten times
faster, which keeps `imagegen plan` well under a second), the pure-Python safe loader otherwise.

:func:`load` is for imagegen's own files. :func:`load_untrusted` is for files other people write
(recipes): it refuses aliases (a 300-byte "billion laughs" alias tree expands to gigabytes in anything
that walks it), nesting deeper than a recipe needs (libyaml's composer recurses and crashes the
interpreter on a few hundred thousand ``[``), more nodes than a recipe has, and turns a value the
constructor cannot build (a 5000-digit integer, ``!!int foo``) into a YAMLError.
"""

from __future__ import annotations

from typing import Any

import yaml

try:
    _Loader = yaml.CSafeLoader
except AttributeError:  # PyYAML built without libyaml
    _Loader = yaml.SafeLoader

YAMLError = yaml.YAMLError

# Far beyond any real recipe (the largest catalogue recipe has a few hundred nodes, depth 7).
MAX_DEPTH = 32
MAX_NODES = 50_000


class UntrustedYAMLError(yaml.MarkedYAMLError):
    """A document refused before it is built: an alias, too deep, too many nodes, a bad value."""


class _UntrustedLoader(_Loader):  # type: ignore[misc, valid-type]
    def construct_object(self, node, deep=False):  # noqa: ANN001 - PyYAML's signature
        try:
            return super().construct_object(node, deep)
        except YAMLError:
            raise
        except (ValueError, OverflowError, TypeError, RecursionError, MemoryError) as exc:
            raise UntrustedYAMLError(problem=f"a value that cannot be read ({exc.__class__.__name__})",
                                     problem_mark=node.start_mark) from None


def load(text: str) -> Any:
    return yaml.load(text, Loader=_Loader)  # noqa: S506 - a safe loader either way


def load_untrusted(text: str, *, max_depth: int = MAX_DEPTH, max_nodes: int = MAX_NODES) -> Any:
    """Load one YAML document written by someone else; every refusal is a YAMLError with a problem
    (and, where known, a problem_mark naming the line)."""
    _validate_events(text, max_depth, max_nodes)
    loader = _UntrustedLoader(text)
    try:
        return loader.get_single_data()
    except YAMLError:
        raise
    except (ValueError, OverflowError, TypeError, RecursionError, MemoryError) as exc:
        raise UntrustedYAMLError(problem=f"a value that cannot be read ({exc.__class__.__name__})") from None
    finally:
        loader.dispose()


def _validate_events(text: str, max_depth: int, max_nodes: int) -> None:
    """Walk the event stream (libyaml's parser is iterative, so this never recurses) before
    anything is composed or constructed."""
    depth = nodes = 0
    try:
        for event in yaml.parse(text, Loader=_Loader):
            if isinstance(event, yaml.AliasEvent):
                raise UntrustedYAMLError(problem="aliases (*name) are not allowed in recipe files; write the value out",
                                         problem_mark=event.start_mark)
            if isinstance(event, (yaml.ScalarEvent, yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                nodes += 1
                if nodes > max_nodes:
                    raise UntrustedYAMLError(problem=f"more than {max_nodes} values", problem_mark=event.start_mark)
            if isinstance(event, (yaml.SequenceStartEvent, yaml.MappingStartEvent)):
                depth += 1
                if depth > max_depth:
                    raise UntrustedYAMLError(problem=f"nested deeper than {max_depth} levels",
                                             problem_mark=event.start_mark)
            elif isinstance(event, (yaml.SequenceEndEvent, yaml.MappingEndEvent)):
                depth -= 1
    except UntrustedYAMLError:
        raise
    except YAMLError as exc:
        # PyYAML >= 6.0.4 stops deep nesting in its own parser: the same refusal, in the same words.
        if "nesting depth" in str(getattr(exc, "problem", None) or exc):
            raise UntrustedYAMLError(problem=f"nested deeper than {max_depth} levels",
                                     problem_mark=getattr(exc, "problem_mark", None)) from None
        raise


def dump(data: Any) -> str:
    """``data`` as block YAML in the order given (what imagegen writes for people to read)."""
    return yaml.safe_dump(data, sort_keys=False, default_flow_style=None, width=120, allow_unicode=False)
