"""What a backend is: the source of the two models' tokens behind the engine front.

:class:`~relaygen_integrations.engine.engine.RelayEngine` plans and validates a request, owns the switching policy and
the transcript, and runs the one generation loop (``core/loop.drive``). A backend supplies only what differs: where
the tokens come from. A new backend (a batching scheduler, another serving protocol) implements :class:`Backend` and
a per-request :class:`GenerationSession`; everything else - text, spans, stops, usage, streaming, adapters - comes
for free and stays identical across backends.

Backends today, one folder each: ``local/`` (``LocalBackend``: two transformers models, one KV cache each) and
``remote/`` (``RemoteBackend``: two OpenAI-compatible completion servers). A new backend is one more folder and one
constructor on the front (as ``RelayEngine.from_endpoints``); this package never imports a backend.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol, runtime_checkable

from .settings import GenerationError, GenerationPlan
from .spans import FinishReason, ModelRole
from .transcript import BackendUsage, Fed, Transcript

if TYPE_CHECKING:
    from transformers import PreTrainedModel

    from ..constraints.grammar import GrammarTokenizer


class BackendCapabilityError(GenerationError):
    """The backend cannot do what the request or command asks for (``capability`` names it; ``field`` the setting
    that asked, where one did)."""

    def __init__(self, backend: str, capability: str, why: str, field: str | None = None) -> None:
        super().__init__(f"the {backend} backend cannot {capability}: {why}", field)
        self.backend = backend
        self.capability = capability


# A token's log probability as a backend computed it: sequence position, token id, logprob, the model, and the top
# alternatives as (token id, logprob).
LogprobRow = tuple[int, int, float, ModelRole, Sequence[tuple[int, float]]]


@dataclass
class Step:
    """What one step of a session did, returned to ``drive``, the only writer of the transcript: the tokens written,
    the forward passes run (``passes``: model and the sequence positions ``[start, end)`` each read; the transcript
    knows whose tokens those were, so whether a pass was prefill, catch-up or the writer's own), log probabilities
    (where the request asked for them), a backend's own end of the generation (the model ended, nothing more to
    write) and, from :meth:`GenerationSession.verify`, the verdict on the pending small run: the index within it of
    the first token the rule rejects, None when all are kept."""

    tokens: list[int] = field(default_factory=list)
    passes: list[tuple[ModelRole, int, int]] = field(default_factory=list)
    logprobs: list[LogprobRow] = field(default_factory=list)
    end: FinishReason | None = None
    rejected: int | None = None


@runtime_checkable
class GenerationSession(Protocol):
    """One request's token source, driven by ``core/loop.drive``. A session reads the transcript and never writes
    it: each call returns a :class:`Step` and the loop records it."""

    def next_tokens(self, writer: ModelRole) -> Step:
        """The next token(s) ``writer`` writes after ``transcript.ids`` (several for a speculative round or a
        streamed chunk; none when the backend needs another round trip), and the passes that produced them."""
        ...

    def verify(self) -> Step:
        """Verified relay: score ``transcript.pending_run()`` with the large model and apply ``transcript.verify``
        (the rule): ``Step.rejected`` is the verdict, which the loop hands to ``transcript.settle_run`` (it keeps
        the run or cuts it there, after which the large model writes). A session that cuts brings its own state
        (caches, the large model's token at the cut) to the kept sequence before returning. Only called when the
        plan asks for verification, which ``Backend.check`` may refuse."""
        ...

    def after_feed(self, fed: Fed) -> None:
        """Called after each batch went through the transcript (e.g. crop caches, close a request on a switch)."""
        ...

    def close(self, failed: bool) -> None:
        """The generation is over (``failed``: an error interrupted it, so no half-written state may survive)."""
        ...

    def usage(self) -> BackendUsage:
        """The Usage fields only the backend knows."""
        ...


@runtime_checkable
class Backend(Protocol):
    """Two models (or one: then only modes that need one model run) that share one tokenizer."""

    kind: str  # "local", "remote": named in error messages
    large_name: str
    small_name: str
    context_window: int
    eos_ids: frozenset[int]
    vocab_size: int  # the token ids every model of the pair can read (the front refuses a prompt id beyond it)
    serialized: bool  # whether requests must run one at a time (local caches hold one sequence)
    grammars: bool  # whether it can mask tokens by a grammar (``GenerationSettings.grammar``)
    # The tokenizer as the grammar library reads it (``engine/constraints/grammar.py``), where ``grammars``; the chat
    # layer builds its tool and schema grammars with it.
    grammar_tokenizer: GrammarTokenizer | None

    @property
    def roles(self) -> frozenset[ModelRole]: ...

    def check(self, plan: GenerationPlan) -> None:
        """Raises :class:`BackendCapabilityError` for a request this backend cannot run, before any work."""
        ...

    def open(self, plan: GenerationPlan, transcript: Transcript) -> GenerationSession: ...

    def token_margins(self, role: ModelRole, prompt_ids: Sequence[int], completion_ids: Sequence[int]) -> list[float]:
        """Teacher-forced top1 - top2 probability of ``role``'s model at each completion token (cue calibration)."""
        ...

    def local_model(self, role: ModelRole) -> PreTrainedModel:
        """The in-process model (transformers baselines in the benchmark); raises where there is none."""
        ...

    def close(self) -> None: ...
