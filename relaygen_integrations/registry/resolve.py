"""Answering "where is model X?" without side effects beyond an optional fetch: the cached directories of a
pair, what is cached for every pair, and a user's model reference turned into a ``from_pretrained`` argument.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import cast

# KNOWN_PAIRS is read as `specs.KNOWN_PAIRS`, never imported by name: replacing that one module attribute (as
# the tests do to install a fake pair) then reaches every lookup, here and in specs.get_pair alike.
from . import specs
from .build import fetch_pair
from .cache import dir_size, gguf_size_ok, model_dir, model_dir_valid, relaygen_home
from .errors import RegistryError
from .specs import DTYPES, ROLES, PairInfo, PairPaths, Role, get_pair, normalize_dtype

__all__ = ["list_pairs", "pair_gguf_paths", "pair_paths", "resolve_model"]

# ``owner/name`` with the characters the Hub allows; anything else (not a dir, not a pair) is a typo.
_HUB_ID = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


def pair_paths(name: str = "demo", dtype: str = "bf16") -> PairPaths | None:
    """The pair's directories if both are cached and complete, else None. Never downloads."""
    pair = get_pair(name)
    dt = normalize_dtype(dtype)
    home = relaygen_home()
    if all(model_dir_valid(pair, role, dt, home) for role in ROLES):
        return PairPaths(large=model_dir(pair.name, "large", dt, home), small=model_dir(pair.name, "small", dt, home))
    return None


def pair_gguf_paths(name: str = "demo") -> PairPaths | None:
    """The pair's downloaded GGUF files (what llama.cpp serves) if both are kept with their published sizes, else
    None (not fetched, or fetched with ``keep_gguf=False``). Never downloads."""
    pair = get_pair(name)
    home = relaygen_home()
    large, small = (gguf_size_ok(pair.model(role), home) for role in ("large", "small"))
    return PairPaths(large=large, small=small) if large is not None and small is not None else None


def list_pairs() -> list[PairInfo]:
    """Every known pair with what is cached for it locally."""
    home = relaygen_home()
    infos: list[PairInfo] = []
    for name in sorted(specs.KNOWN_PAIRS):
        pair = specs.KNOWN_PAIRS[name]
        cached: dict[str, PairPaths] = {}
        sizes: dict[str, int] = {}
        for dt in DTYPES:
            paths = pair_paths(name, dt)
            if paths is not None:
                cached[dt] = paths
                sizes[dt] = dir_size(paths.large) + dir_size(paths.small)
        infos.append(
            PairInfo(
                name=name,
                description=pair.description,
                large_model=pair.large.model_name,
                small_model=pair.small.model_name,
                cached=cached,
                sizes=sizes,
                gguf={spec.role: gguf_size_ok(spec, home) for spec in pair.models()},
            )
        )
    return infos


def resolve_model(ref: str, role: Role, dtype: str = "bf16", fetch: bool = True) -> str:
    """Turn a user's model reference into something ``from_pretrained`` accepts.

    * ``"demo"`` / ``"demo:large"`` / ``"demo:small"``: the cached directory of that pair's role (an explicit
      ``:role`` wins over ``role``), fetched first when missing and ``fetch`` is true;
    * an existing local directory: returned as is;
    * ``owner/name``: returned unchanged, as a Hugging Face Hub id.

    Anything else raises ValueError naming the known pairs (a typo should not become a Hub lookup).
    """
    if role not in ROLES:
        raise ValueError(f"role must be one of {', '.join(ROLES)}, got {role!r}")
    pair_name, sep, suffix = ref.partition(":")
    if pair_name in specs.KNOWN_PAIRS and (not sep or suffix in ROLES):
        which = cast(Role, suffix) if sep else role
        paths = pair_paths(pair_name, dtype)
        if paths is None:
            if not fetch:
                raise RegistryError(
                    f"model pair {pair_name!r} ({normalize_dtype(dtype)}) is not cached; "
                    f"run `relaygen models fetch {pair_name} --dtype {normalize_dtype(dtype)}`"
                )
            paths = fetch_pair(pair_name, dtype)
        return str(paths.for_role(which))
    if sep and pair_name in specs.KNOWN_PAIRS:
        raise ValueError(f"{ref!r}: the role after ':' must be one of {', '.join(ROLES)}")
    if Path(ref).expanduser().is_dir():
        return ref
    if _HUB_ID.match(ref):
        return ref
    raise ValueError(
        f"{ref!r} is not a known model pair, an existing directory or a Hub id (owner/name); "
        f"known pairs: {', '.join(sorted(specs.KNOWN_PAIRS))}"
    )
