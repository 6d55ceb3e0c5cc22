"""Pydantic fields for the generation settings, built from :class:`GenerationSettings`, their one declaration.

Both adapters' fields (``model_fields.py``) and the HTTP server's request model (``serve/app.py``) come from here, so
a setting added to ``GenerationSettings`` becomes a field of each of them with its type, default, bounds and
description. Each caller names, in one small mapping of its own, where its fields differ (another name, a type that
says what a caller writes rather than what the engine keeps, a setting it does not offer) and why.
"""

from __future__ import annotations

import functools
import operator
import types
from collections.abc import Collection, Mapping, Sequence
from typing import Annotated, Any, Union, get_args, get_origin

from pydantic import BaseModel, Field, create_model
from pydantic.fields import FieldInfo
from pydantic.types import Strict

from ..engine.core.settings import GenerationSettings

DECLARED: Any = object()  # "as GenerationSettings declares it" (None is a real default, so it cannot mean that)


def _flat(metadata: Sequence[Any]) -> list[Any]:
    # A Field(...) inside Annotated carries its constraints as metadata of its own.
    return [item for entry in metadata for item in (entry.metadata if isinstance(entry, FieldInfo) else [entry])]


def caller_type(annotation: Any, metadata: Sequence[Any] = (), bounds: bool = True) -> Any:
    """The type a caller's field takes for a setting: ``annotation`` with its bounds (``metadata``, and the
    ``Annotated`` ones inside a union) but without strictness, so a caller's field converts values as pydantic fields
    ordinarily do ("5" for an int), as the adapters' fields always did; ``merge_settings`` then gets the converted
    value. ``bounds=False`` drops the bounds too: the server leaves them to ``merge_settings``, whose error names the
    setting."""
    origin = get_origin(annotation)
    if origin is Annotated:
        inner, *extra = get_args(annotation)
        return caller_type(inner, [*_flat(extra), *metadata], bounds)
    if origin in (Union, types.UnionType):
        annotation = functools.reduce(operator.or_, (caller_type(arg, (), bounds) for arg in get_args(annotation)))
    # Bounds given for a whole "X | None" stay on it: pydantic applies them to X, as GenerationSettings does.
    kept = [item for item in _flat(metadata) if bounds and not isinstance(item, Strict)]
    return Annotated[(annotation, *kept)] if kept else annotation


def setting_field(
    name: str, *, annotation: Any = DECLARED, default: Any = DECLARED, bounds: bool = True, **options: Any
) -> tuple[Any, FieldInfo]:
    """A ``create_model`` field definition of the setting ``name``: GenerationSettings' type (see
    :func:`caller_type`), default and description, each replaced where given; ``options`` go to ``Field`` (e.g.
    ``validation_alias``)."""
    declared = GenerationSettings.model_fields[name]
    if annotation is DECLARED:
        annotation = caller_type(declared.annotation, declared.metadata, bounds)
    options.setdefault("description", " ".join((declared.description or "").split()) or None)
    return annotation, Field(default=declared.default if default is DECLARED else default, **options)


def settings_model(
    model_name: str,
    *,
    exclude: Collection[str] = (),
    rename: Mapping[str, str] | None = None,
    differ: Mapping[str, Mapping[str, Any]] | None = None,
    **common: Any,
) -> type[BaseModel]:
    """A pydantic model with one field per setting, in GenerationSettings' order, for a caller's class to inherit:
    every setting but ``exclude``, named as ``rename`` says (else its own name), built by :func:`setting_field` with
    ``common`` and the setting's own ``differ`` entry (which wins)."""
    rename, differ = rename or {}, differ or {}
    stale = {*exclude, *rename, *differ} - set(GenerationSettings.model_fields)
    if stale:  # a mapping that names a setting GenerationSettings no longer has would otherwise go unnoticed
        raise ValueError(f"{model_name}: {sorted(stale)} are not generation settings")
    fields = {
        rename.get(name, name): setting_field(name, **{**common, **differ.get(name, {})})
        for name in GenerationSettings.model_fields
        if name not in exclude
    }
    return create_model(model_name, **fields)  # type: ignore[call-overload]
