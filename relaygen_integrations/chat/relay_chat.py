"""One chat turn over the engine with tools: what both framework adapters call.

It binds the pieces the adapters would otherwise each repeat: tool-schema checks, the tool-choice prefill, and turning
engine events into content deltas (tagged with the model that wrote them), completed tool calls, switches and the
final parsed result.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
from collections.abc import AsyncIterator, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ..engine.core.prompt import check_json_data, validate_messages
from ..engine.core.settings import SettingsError, shown
from ..engine.core.spans import FinalEvent, SwitchEvent, TextEvent
from .constraints import json_item, response_grammar, turn_grammar
from .reasoning import (
    REASONING_START,
    ReasoningFormat,
    ReasoningSplitter,
    starts_in_reasoning,
    thinking_template_kwargs,
)
from .tool_calls import (
    InvalidToolCall,
    ParsedOutput,
    ToolCall,
    ToolCallStreamParser,
    call_from_data,
    check_tool_choice,
    forced_prefix,
    forces_nothing,
    tool_names,
    validate_tools,
)
from .tool_formats import HERMES, StreamParser, chat_parser, chat_tool_format

if TYPE_CHECKING:
    from ..engine.core.settings import GenerationPlan, GenerationSettings
    from ..engine.core.spans import ModelRole, RelayResult, StreamEvent, SwitchEvent, TokenLogprob
    from ..engine.engine import RelayEngine


@dataclass
class ChatDelta:
    """One streamed piece of a chat turn. Exactly one of text / reasoning / tool_call / switch / result is
    meaningful (``reasoning``: a piece of the reasoning, told apart from the answer; ``chat/reasoning.py``), except
    that ``logprobs`` (the entries of the tokens the piece's event completed, when asked for) rides on the first
    piece of a text event, or on a piece of its own when the event's text is still held back by the tool-call
    parser."""

    text: str = ""
    reasoning: str = ""
    model: ModelRole | None = None
    span_index: int = 0
    tool_call: ToolCall | InvalidToolCall | None = None
    switch: SwitchEvent | None = None
    result: RelayResult | None = None
    parsed: ParsedOutput | None = None
    logprobs: tuple[TokenLogprob, ...] = ()


@dataclass(frozen=True)
class ChatRequest:
    """One chat turn, as :func:`prepare_chat` builds it: its messages and tools are checked already, and the engine
    renders them without checking them again (``RelayEngine.encode_messages(..., checked=True)``)."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    prefix: str | None
    chat_template_kwargs: Mapping[str, Any] | None
    settings: GenerationSettings
    raw_markup: bool = False  # control-token strings in the messages become tokens (the caller passes chat markup)
    tool_choice: Any = None  # checked; forced choices are enforced by the prefill, or by the grammar when constrained
    response_format: Mapping[str, Any] | None = None  # checked
    parallel_tool_calls: bool = False  # under a grammar: more calls may follow the first
    constrained: bool = False  # runs under a grammar (set by ``_as_run`` for an engine whose backend masks tokens)
    # The adapters' ``reasoning`` switch; it needs the pair's chat template, so it is applied where the chat renders
    # (``reasoning.thinking_template_kwargs``). None: the pair's default.
    reasoning: bool | None = None


RESPONSE_FORMATS = ("text", "json_object", "json_schema")


def response_schema(response_format: Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    """Checks an OpenAI-style ``response_format`` and returns its JSON schema, if it has one: ``{"type":
    "json_schema", "json_schema": {"name": ..., "schema": {...}}}`` (OpenAI) or ``{"type": "json_schema", "schema":
    {...}}`` (LangChain). A bad one is a ``SettingsError`` naming the field."""
    if response_format is None:
        return None
    if not isinstance(response_format, Mapping):
        raise SettingsError(
            f"response_format must be a dict such as {{'type': 'json_object'}}, got {shown(response_format)}",
            "response_format",
        )
    kind = response_format.get("type")
    if kind is not None and kind not in RESPONSE_FORMATS:
        raise SettingsError(
            f"unsupported response_format type {shown(kind)}; use one of {list(RESPONSE_FORMATS)}",
            "response_format.type",
        )
    wrapper = response_format.get("json_schema")
    if wrapper is not None and not isinstance(wrapper, Mapping):
        raise SettingsError(
            f"response_format.json_schema must be an object such as {{'name': 'answer', 'schema': {{...}}}}, got "
            f"{shown(wrapper)}",
            "response_format.json_schema",
        )
    schema = response_format.get("schema") or (wrapper or {}).get("schema")
    field = "response_format.schema" if response_format.get("schema") else "response_format.json_schema.schema"
    if schema is not None and not isinstance(schema, Mapping):
        raise SettingsError(f"{field} must be a JSON schema object, got {shown(schema)}", field)
    check_json_data(schema, field, SettingsError)
    return schema


def asks_json(response_format: Mapping[str, Any] | None) -> bool:
    """Whether ``response_format`` (checked) asks for a JSON object (``json_object`` / ``json_schema``)."""
    return response_format is not None and response_format.get("type") in ("json_object", "json_schema")


def call_or_answer(request: ChatRequest) -> bool:
    """Whether the turn is a tool call or a JSON answer, nothing else: tools the model may call (the choice forces
    none) together with a JSON response format (``create_agent(model, tools, response_format=...)``)."""
    return bool(request.tools) and forces_nothing(request.tool_choice) and asks_json(request.response_format)


def bare_call(text: str, names: Iterable[str]) -> ToolCall | None:
    """``text`` as a call where it is exactly one call object of a bound tool (``{"name": ..., "arguments":
    {...}}``, nothing else): how a reply that is a call or a JSON answer writes a call without the tag. Else None:
    it is the answer."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        return None
    if not isinstance(data, dict) or set(data) != {"name", "arguments"} or data["name"] not in set(names):
        return None
    call = call_from_data(data, text.strip())
    return call if isinstance(call, ToolCall) else None


# Added to the system message of a chat whose history holds a tool's result. Measured on the demo pair (the ten tasks
# of benchmarks/agent_loops.py, the turn after the result, greedy): without it the 1.5B model answered with the
# result 2 times in 10 ("I apologize, but I cannot generate a response based on the provided XML structure"), with it
# 10 in 10 ("It's 18 degrees Celsius and cloudy in Paris.").
TOOL_RESULT_INSTRUCTION = (
    "You can call tools. When a tool's result comes back inside <tool_response></tool_response>, answer the user's "
    "question with that result in one short sentence."
)


def add_system_text(chat: list[dict[str, Any]], text: str) -> None:
    """Appends ``text`` to the chat's system message (one is added first where there is none)."""
    if chat and chat[0].get("role") == "system":
        chat[0]["content"] = f"{chat[0].get('content') or ''}\n\n{text}".strip()
    else:
        chat.insert(0, {"role": "system", "content": text})


def json_instruction(response_format: Mapping[str, Any], tools: bool = False) -> str:
    """System-prompt text asking for a bare JSON object (optionally matching a schema); with ``tools`` (the model
    may call them instead) it asks that of the answer only, so that it does not read as "never call a tool"."""
    schema = response_schema(response_format)
    lead = "When you answer rather than call a tool, respond" if tools else "Respond"
    if schema:
        return f"{lead} with a single JSON object, and nothing else, that matches this JSON schema:\n" + json.dumps(
            schema, ensure_ascii=False
        )
    return f"{lead} with a single JSON object and nothing else."


def prepare_chat(
    messages: Sequence[Mapping[str, Any]],
    settings: GenerationSettings,
    tools: Sequence[Mapping[str, Any]] | None = None,
    tool_choice: str | Mapping[str, Any] | bool | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    response_format: Mapping[str, Any] | None = None,
    raw_markup: bool = False,
    parallel_tool_calls: bool = False,
    reasoning: bool | None = None,
) -> ChatRequest:
    """Validates the request and derives the prefill; ``tool_choice="none"`` hides the tools from the model, and a
    forced tool choice with no tools bound is a ``ToolSchemaError`` (never silently free text). ``settings``: the
    call's generation settings, merged once by the caller (``merge_settings``).

    ``response_format`` (OpenAI style: ``{"type": "json_object"}`` or ``{"type": "json_schema", "schema": ...}``)
    adds a JSON instruction to the system message and, unconstrained, prefills ``{`` so the answer starts as JSON -
    unless tools are bound: then the reply may be a call, which a brace would rule out.
    ``parallel_tool_calls``: under a grammar, more calls may follow the first (default: one call a turn).
    ``reasoning``: thinking on/off through the chat template's switch (None: the pair's default).
    """
    chat = validate_messages(messages)
    checked = validate_tools(tools) if tools is not None else None
    check_tool_choice(tool_choice, checked)
    response_schema(response_format)
    if tool_choice == "none":
        checked = None
    prefix = forced_prefix(tool_choice, checked) if checked else None
    has_result = any(message.get("role") == "tool" for message in chat)
    if checked and TOOL_RESULT_INSTRUCTION and has_result:
        add_system_text(chat, TOOL_RESULT_INSTRUCTION)
    if response_format is not None and asks_json(response_format):
        # With tools and no tool result yet the turn is most likely a call: asked for the JSON answer up front, the
        # demo pair answered at once in 17 of 20 such turns (tests/test_tools_with_format_real.py). The grammar
        # still admits the answer; the instruction comes with the result.
        if not checked or has_result:
            add_system_text(chat, json_instruction(response_format, tools=bool(checked)))
        prefix = prefix if checked else "{"  # with tools: a forced call's prefill, or none (a call or the answer)
    if not isinstance(parallel_tool_calls, bool):
        raise SettingsError(
            f"parallel_tool_calls must be true or false, got {shown(parallel_tool_calls)}", "parallel_tool_calls"
        )
    if reasoning is not None and not isinstance(reasoning, bool):  # checked before the engine loads
        raise SettingsError(f"reasoning must be true, false or None, got {shown(reasoning)}", "reasoning")
    return ChatRequest(
        chat, checked or None, prefix, chat_template_kwargs, settings, raw_markup, tool_choice, response_format,
        parallel_tool_calls, reasoning=reasoning,
    )  # fmt: skip


def _as_run(engine: RelayEngine, request: ChatRequest) -> ChatRequest:
    """The request as it runs on ``engine``: under a grammar (``chat/constraints.py``) when it has tools or a JSON
    response format, ``constrain`` is on, no grammar of its own was given and the backend can mask tokens; then the
    grammar enforces what the prefill would have (a forced call, the opening brace), so there is no prefill."""
    if request.constrained:
        return request
    fmt = chat_tool_format(engine.tokenizer, request.settings.tool_format)
    if request.tools and not forces_nothing(request.tool_choice) and fmt is not HERMES:
        # prepare_chat (engine-free) prefills a forced call in the default, Hermes form: this model's template
        # writes calls in another (``tool_formats``).
        request = dataclasses.replace(request, prefix=fmt.forced_prefix(request.tool_choice, request.tools))
    settings = request.settings
    wanted = bool(request.tools) or asks_json(request.response_format)
    if not wanted or not settings.constrain or settings.grammar is not None:
        return request
    if engine.grammar_tokenizer is None:
        return request  # a remote pair: the prefill and the parser, as without constraints
    return dataclasses.replace(request, prefix=None, constrained=True)


@dataclass(frozen=True)
class PreparedTurn:
    """A chat turn ready to run, decided once (:func:`prepare_turn`) for the sync and async streams and the server:
    the request as it runs on the engine (under a grammar, or with a prefill), its plan (prompt ids, settings,
    grammar), and whether the prompt leaves a reasoning block open (None: the output decides)."""

    engine: RelayEngine
    request: ChatRequest
    plan: GenerationPlan
    opens_reasoning: bool | None

    def assembler(self) -> ChatStreamAssembler:
        """A fresh assembler of this turn's deltas (each stream of the turn parses from the start)."""
        engine, request = self.engine, self.request
        return ChatStreamAssembler(
            request.prefix,
            tool_names(request.tools) if request.tools else (),
            reasoning_splitter(engine, request, self.opens_reasoning),
            call_or_answer(request),
            chat_parser(engine.tokenizer, request.settings.tool_format, request.tools),
        )


def prepare_turn(engine: RelayEngine, request: ChatRequest) -> PreparedTurn:
    """The CPU work before any model work, done once: grammar or prefill (:func:`_as_run`), the prompt rendered and
    tokenized, its reasoning state read off its tail, and the plan (its length checked, its grammar compiled)."""
    request = _as_run(engine, request)
    prompt_ids = _prompt_ids(engine, request)
    marker = engine.policy_config.reasoning_end or engine.policy_config.answer_marker
    # The generation prompt and what it opened: its last tokens are enough.
    opens = starts_in_reasoning(engine.tokenizer.decode(prompt_ids[-32:]), marker) if marker else None
    return PreparedTurn(engine, request, _run_plan(engine, request, prompt_ids, opens), opens)


def _run_plan(
    engine: RelayEngine, request: ChatRequest, prompt_ids: list[int], opens_reasoning: bool | None
) -> GenerationPlan:
    """``request`` (as :func:`_as_run` left it) planned over its ``prompt_ids``; under its grammar when constrained,
    and with tools offered (``"auto"``), deciding between a call and text at its first token (``opening.py``). With
    a JSON response format as well, the grammar is a call or the answer's JSON (:func:`call_or_answer`)."""
    if not request.constrained:
        return engine.plan(prompt_ids, request.settings)
    tokenizer = engine.grammar_tokenizer
    assert tokenizer is not None  # _as_run constrained the request: the backend masks tokens
    answer = json_item(response_schema(request.response_format)) if call_or_answer(request) else None
    fmt = chat_tool_format(engine.tokenizer, request.settings.tool_format)
    if request.tools:
        rules, turn = fmt.grammar(request.tools, request.tool_choice, tokenizer, request.parallel_tool_calls, answer)
    else:
        rules, turn = response_grammar(request.response_format or {}, response_schema(request.response_format))
    end = engine.policy_config.reasoning_end
    # A thinking pair's reasoning comes first where the prompt leaves a reasoning block open (as the splitter says).
    opened = end is not None and bool(opens_reasoning)
    # Where the prompt left no block open, a thinking pair's output may open one itself (``<think>``) first.
    may_open = REASONING_START if end == "</think>" and not opened else None
    grammar = turn_grammar(rules, turn, end if (opened or may_open) else None, tokenizer, may_open)
    plan = engine.plan(prompt_ids, request.settings.model_copy(update={"grammar": grammar}))
    # The decision is the turn's first token, which for a thinking pair is the reasoning's: there the grammar alone
    # decides (the tag or text). A JSON answer opens with a brace, which this decision reads as a call: the grammar
    # decides there too, at the first key (``tool_call_grammar``).
    decides = bool(request.tools) and forces_nothing(request.tool_choice) and end is None and answer is None
    tag = fmt.call_tag(tokenizer) if decides else None
    return dataclasses.replace(plan, call_tag=tag) if tag is not None else plan


class ChatStreamAssembler:
    """Turns engine events into ChatDeltas and collects the parsed turn.

    The prefill is fed to the parser first, so a forced tool call (whose opening the model never writes) parses
    whole; the final ParsedOutput is built from exactly the pieces that were streamed, so streamed and final tool
    calls carry the same ids. ``bare_calls``: the reply is a call or a JSON answer (:func:`call_or_answer`), so text
    that opens with a brace is held until the turn ends and then given as the call it is (:func:`bare_call`) or as
    the answer.
    """

    def __init__(
        self,
        prefix: str | None,
        tool_names: Iterable[str] = (),
        reasoning: ReasoningSplitter | None = None,
        bare_calls: bool = False,
        parser: StreamParser | None = None,
    ) -> None:
        self.parser: StreamParser = parser or ToolCallStreamParser(tool_names)
        self._held: str | None = "" if bare_calls else None  # None: nothing is held (any more)
        self._names = frozenset(tool_names)  # whatever the format's parser keeps, a bare call names a bound tool
        self.parsed = ParsedOutput(content="", reasoning="" if reasoning else None)
        self.reasoning = reasoning  # None: the whole text is content ('inline', or a pair without a reasoning end)
        # A tool-call prefill only opens a tag (nothing to show); a JSON prefill ("{") is content the model did not
        # write but the answer starts with, so it is streamed before the first piece.
        self._prefill: list[str | ToolCall | InvalidToolCall] = list(self.parser.feed(prefix or ""))

    def _take_prefill(self, model: ModelRole | None) -> list[ChatDelta]:
        pieces, self._prefill = self._prefill, []
        return self._pieces(pieces, model, 0)

    def on_event(self, event: StreamEvent) -> list[ChatDelta]:
        if isinstance(event, TextEvent):
            head = self._take_prefill(event.model)
            pieces = [*head, *self._split(event.text, event.model, event.span_index)]
            if event.logprobs:
                if not pieces:
                    pieces.append(ChatDelta(model=event.model, span_index=event.span_index))
                pieces[0].logprobs = event.logprobs
            return pieces
        if isinstance(event, SwitchEvent):
            return [ChatDelta(model=event.to_model, span_index=event.span_index, switch=event)]
        if isinstance(event, FinalEvent):
            model, index = event.model, max(0, event.span_index)
            tail = [
                *self._take_prefill(model),
                *self._split("", model, index, final=True),
                *self._pieces(self._hold(self.parser.finish(), final=True), model, index),
            ]
            if self.reasoning is not None:
                self.parsed.reasoning_tokens = self.reasoning.tokens_before_answer(event.result.token_ends)
            return [*tail, ChatDelta(model=model, span_index=index, result=event.result, parsed=self.parsed)]
        return []

    def _split(self, text: str, model: ModelRole, index: int, final: bool = False) -> list[ChatDelta]:
        """Reasoning pieces as they are; the answer through the tool-call parser."""
        if self.reasoning is None:
            return self._pieces(self._hold(self.parser.feed(text)), model, index)
        deltas = []
        for kind, piece in self.reasoning.finish() if final else self.reasoning.feed(text):
            if kind == "reasoning":
                self.parsed.reasoning = (self.parsed.reasoning or "") + piece
                deltas.append(ChatDelta(reasoning=piece, model=model, span_index=index))
            else:
                deltas += self._pieces(self._hold(self.parser.feed(piece)), model, index)
        return deltas

    def _hold(
        self, pieces: Iterable[str | ToolCall | InvalidToolCall], final: bool = False
    ) -> list[str | ToolCall | InvalidToolCall]:
        """The parser's pieces, with the text of a reply that may be a bare call held back while it may still be
        one: it opens with a brace (or has not opened yet). Released when the turn ends, or when text shows it is
        not one."""
        out: list[str | ToolCall | InvalidToolCall] = []
        for piece in pieces:
            if self._held is None:
                out.append(piece)
            elif isinstance(piece, str):
                self._held += piece
                if self._held.lstrip()[:1] not in ("", "{"):
                    out += self._release()
            else:
                out += [*self._release(), piece]
        return [*out, *self._release()] if final else out

    def _release(self) -> list[str | ToolCall | InvalidToolCall]:
        held, self._held = self._held, None
        if not held:
            return []
        return [bare_call(held, self._names) or held]

    def _collect(self, piece: str | ToolCall | InvalidToolCall) -> None:
        if isinstance(piece, str):
            self.parsed.content += piece
        elif isinstance(piece, ToolCall):
            self.parsed.tool_calls.append(piece)
        else:
            self.parsed.invalid_tool_calls.append(piece)

    def _pieces(
        self, pieces: Iterable[str | ToolCall | InvalidToolCall], model: ModelRole | None, index: int
    ) -> list[ChatDelta]:
        """Deltas for parsed pieces. A call identical to one earlier in the turn (same tool, same arguments: it can
        only give the same result) is dropped - a small model allowed several calls writes one call again."""
        deltas = []
        for piece in pieces:
            if isinstance(piece, ToolCall) and any(
                (c.name, c.arguments) == (piece.name, piece.arguments) for c in self.parsed.tool_calls
            ):
                continue
            deltas.append(self._piece(piece, model, index))
        return deltas

    def _piece(self, piece: str | ToolCall | InvalidToolCall, model: ModelRole | None, index: int) -> ChatDelta:
        self._collect(piece)
        if isinstance(piece, str):
            return ChatDelta(text=piece, model=model, span_index=index)
        return ChatDelta(model=model, span_index=index, tool_call=piece)


def reasoning_format(engine: RelayEngine, settings: GenerationSettings) -> ReasoningFormat:
    """The request's ``reasoning_format``, or the pair's default: 'separate' for a thinking pair, else 'inline'."""
    config = engine.policy_config
    if settings.reasoning_format == "separate" and not (config.reasoning_end or config.answer_marker):
        raise SettingsError(
            "reasoning_format='separate' needs a pair whose policy ends its reasoning (a reasoning_end such as "
            "'</think>', or an answer_marker); this pair has neither: leave it 'inline' or configure the policy",
            "reasoning_format",
        )
    return settings.reasoning_format or ("separate" if config.reasoning_end else "inline")


def reasoning_splitter(
    engine: RelayEngine, request: ChatRequest, opens_reasoning: bool | None
) -> ReasoningSplitter | None:
    """The splitter of a 'separate' turn (None: 'inline', or a prefilled answer: a forced tool call or JSON);
    ``opens_reasoning``: whether the prompt leaves a reasoning block open (:func:`prepare_turn` read it)."""
    if reasoning_format(engine, request.settings) != "separate" or request.prefix:
        return None
    marker = engine.policy_config.reasoning_end or engine.policy_config.answer_marker
    assert marker is not None
    return ReasoningSplitter(marker, opens_reasoning)


def _prompt_ids(engine: RelayEngine, request: ChatRequest) -> list[int]:
    # prepare_chat checked the messages and tools: the engine renders them without checking them a second time.
    return engine.encode_messages(
        request.messages,
        request.tools,
        thinking_template_kwargs(engine, request.chat_template_kwargs, request.reasoning),
        request.prefix,
        raw_markup=request.raw_markup,
        checked=True,
    )


def stream_chat(engine: RelayEngine, request: ChatRequest, cancel: Any = None) -> Iterator[ChatDelta]:
    turn = prepare_turn(engine, request)
    assembler = turn.assembler()
    for event in engine.run_plan(turn.plan, cancel):
        yield from assembler.on_event(event)


async def astream_chat(
    engine: RelayEngine, request: ChatRequest, turn: PreparedTurn | None = None
) -> AsyncIterator[ChatDelta]:
    """The async stream of a chat request. ``turn``: :func:`prepare_turn`'s, if the caller made it already;
    otherwise it is made on a worker thread, since rendering and tokenizing a long chat would stall the event loop."""
    if turn is None:
        turn = await asyncio.to_thread(prepare_turn, engine, request)
    assembler = turn.assembler()
    events = engine.astream_plan(turn.plan)
    async for event in events:
        for delta in assembler.on_event(event):
            yield delta
