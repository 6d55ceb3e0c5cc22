"""What the engine front checks and guards around a request: the prompt ids and the policy it is given, and the
lock that runs requests one at a time without ever letting a thread wait for itself."""

from __future__ import annotations

import contextlib
import operator
import threading
import time
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

from pydantic import ValidationError

from .policy import PolicyConfig
from .settings import PromptError, SettingsError, shown


class EngineBusyError(RuntimeError):
    """A request on an engine from the thread that has one of its streams open. The engine runs one request at a
    time, so the call would wait for that stream, which this thread alone can finish: it would wait forever."""


class RequestLock:
    """The engine lock: one request at a time, remembering which thread holds it and for what, so that a request
    that could only wait for itself fails at once. Other threads queue as with any lock.

    Two threads can stand behind the request that holds it: the thread that runs it (``_owner``: a sync stream's
    caller, or an async request's worker) and, for an async request, the thread whose event loop awaits it
    (``_requester``). A sync request from either would wait for a stream that only it can finish (the sync stream
    it holds open; the event loop it blocks), so it is refused; an async request is refused only from the thread of
    an open sync stream - async requests from one loop queue behind each other, their waiting done on workers."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._owner: int | None = None
        self._requester: int | None = None
        self._holder = ""

    @property
    def holder(self) -> str:
        """What holds the engine now ("" when free)."""
        return self._holder

    def check_async(self, requester: int) -> None:
        """Refuses an async request from a thread that holds a sync stream open (its worker would wait for it)."""
        if self._owner == requester:  # only the requester's own thread can set it to its id: safe to read unlocked
            raise EngineBusyError(
                f"this thread has a stream of this engine open ({self._holder}); an async call here would wait for "
                "it, and only this thread can finish it. Finish or close the stream first (stream.close()), or run "
                "the async call from another thread"
            )

    @contextlib.contextmanager
    def hold(self, what: str, requester: int | None = None) -> Iterator[None]:
        """Holds the lock for one request run by this thread; ``requester``: the thread whose event loop awaits it."""
        me = threading.get_ident()
        if self._owner == me:  # only this thread can set it to its own id, so reading it unlocked is safe
            raise EngineBusyError(
                f"this thread has a stream of this engine open ({self._holder}); the engine runs one request at a "
                "time, so this call would wait for that stream forever. Finish or close the stream first "
                "(stream.close()), or make the call from another thread, where it waits its turn"
            )
        if requester is None and self._requester == me:
            raise EngineBusyError(
                f"this thread's event loop awaits an async stream of this engine ({self._holder}); a blocking call "
                "here would stop that loop until the stream ends. Use the async call (await engine.agenerate(...)) "
                "or finish the stream first"
            )
        with self._lock:
            self._owner, self._requester = me, requester
            self._holder = f"{what}, started {time.strftime('%H:%M:%S')} in thread {_thread_name()}"
            try:
                yield
            finally:
                self._owner, self._requester, self._holder = None, None, ""


def _thread_name() -> str:
    return threading.current_thread().name


def check_prompt_ids(prompt_ids: Any, vocab_size: int) -> list[int]:
    """Integers in ``[0, vocab_size)``; anything else would fail inside the embedding lookup (or be read as
    something else: ``int("12")``, ``int(1.9)``)."""
    if hasattr(prompt_ids, "tolist") and not isinstance(prompt_ids, (list, tuple)):
        prompt_ids = prompt_ids.tolist()  # a tensor or an array of ids
    if isinstance(prompt_ids, (str, bytes, Mapping)) or not isinstance(prompt_ids, Sequence):
        raise PromptError(f"prompt_ids must be a list of token ids, got {shown(prompt_ids)}", "prompt_ids")
    ids: list[int] = []
    for index, token in enumerate(prompt_ids):
        try:
            value = operator.index(token)  # ints (and numpy integers), never floats or strings
        except TypeError:
            value = None
        if value is None or isinstance(token, bool) or not 0 <= value < vocab_size:
            raise PromptError(
                f"prompt_ids[{index}]={shown(token)} is not a token id of this model pair (ids are integers in "
                f"[0, {vocab_size}))",
                f"prompt_ids[{index}]",
            )
        ids.append(value)
    return ids


def policy_config(policy: Any) -> PolicyConfig:
    """A policy given as a PolicyConfig or a dict of its fields; a bad one is a ``SettingsError`` naming the field."""
    if isinstance(policy, PolicyConfig):
        return policy
    if policy is None:
        return PolicyConfig()
    if not isinstance(policy, Mapping):
        raise SettingsError(f"policy must be a PolicyConfig or a dict of its fields, got {shown(policy)}", "policy")
    try:
        return PolicyConfig.model_validate(dict(policy))
    except ValidationError as exc:
        error = exc.errors()[0]
        key = error["loc"][0] if error["loc"] else None
        field = f"policy.{key}" if key is not None else "policy"
        value = policy.get(key) if key is not None else policy
        raise SettingsError(f"invalid policy setting {field}={shown(value)}: {error['msg']}", field) from exc
