"""Rendering OpenAI-style message dicts (and tool schemas) to prompt token ids through the model's own chat template.

It lives in the engine because ``RelayEngine.generate(messages)`` renders prompts itself; the chat layer above
(``chat/``) builds on it and never the other way round. Everything a caller hands to the template is checked here
first (:func:`validate_chat`: shapes, tool calls, well-formed Unicode, template variables), so a bad input is a
:class:`MessageError` / :class:`ToolSchemaError` naming the field and the value, never an error from inside the
tokenizer or Jinja. Each input is checked once per request: the chat layer checks messages and tools itself and hands
them on through :func:`chat_of_checked` and :func:`render_chat_ids`, which do not check them again. Control-token
strings in the caller's text are encoded as text (``markup.py``).
"""

from __future__ import annotations

import inspect
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from . import markup
from .settings import GenerationError, shown

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

ROLES = frozenset({"system", "user", "assistant", "tool"})
# Other names for those roles that clients send: "developer" is OpenAI's current name for the system role.
ROLE_ALIASES = {"developer": "system"}
# Text parts are joined with a newline, as vLLM's OpenAI server and LlamaIndex's ChatMessage.content join them, so a
# list of text parts renders like the one string a client would otherwise have sent.
TEXT_PART_SEPARATOR = "\n"
# The names a message's reasoning arrives under; the first is the one chat templates read.
REASONING_KEYS = ("reasoning_content", "reasoning")
MAX_DEPTH = 32  # nesting of tool schemas, arguments and template variables (far deeper than any real schema)
# What a chat template already gets from transformers besides apply_chat_template's own parameters: a template
# variable of one of these names would collide with it (or replace a function the template calls).
_TEMPLATE_NAMES = frozenset({"messages", "raise_exception", "strftime_now"})


class MessageError(GenerationError):
    """The chat input (messages, template variables, assistant prefix) cannot be rendered into a prompt; ``field``
    names the part at fault, such as ``"messages[1].tool_calls[0].function"``."""


class ToolSchemaError(GenerationError):
    """A tool definition (or a tool choice) is not an OpenAI-style function schema; ``field`` names the part."""


@dataclass(frozen=True)
class Chat:
    """Checked chat input, ready for the template."""

    messages: list[dict[str, Any]]
    tools: list[dict[str, Any]] | None
    template_kwargs: dict[str, Any]
    assistant_prefix: str


# -- checks -----------------------------------------------------------------------------------------------------------
def _member(field: str, key: Any) -> str:
    return f"{field}.{key}" if isinstance(key, str) and key.isidentifier() else f"{field}[{key!r}]"


def check_text(text: str, field: str, error: type[GenerationError] = MessageError) -> None:
    """Well-formed Unicode: a lone surrogate (``"\\ud83d"``, half an emoji) is not text any tokenizer can encode."""
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise error(
            f"{field} is not well-formed Unicode: it holds the lone surrogate {text[exc.start]!r} at character "
            f"{exc.start} of {shown(text)}",
            field,
        ) from None


def check_json_data(value: Any, field: str, error: type[GenerationError] = MessageError, depth: int = 0) -> None:
    """Only JSON types (what a template's ``tojson`` writes), string keys, well-formed strings, bounded nesting."""
    if depth > MAX_DEPTH:
        raise error(f"{field} is nested more than {MAX_DEPTH} levels deep", field)
    if isinstance(value, str):
        check_text(value, field, error)
    elif value is None or isinstance(value, (bool, int, float)):
        return
    elif isinstance(value, Mapping):
        for key, item in value.items():
            if not isinstance(key, str):
                raise error(f"{field} has the key {shown(key)}: keys must be strings", field)
            check_text(key, f"{field} (a key)", error)
            check_json_data(item, _member(field, key), error, depth + 1)
    elif isinstance(value, (list, tuple)):
        for index, item in enumerate(value):
            check_json_data(item, f"{field}[{index}]", error, depth + 1)
    else:
        raise error(f"{field} is a {type(value).__name__} ({shown(value)}), not JSON data", field)


def validate_tools(tools: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Checks OpenAI-style tool schemas (``{"type": "function", "function": {"name", "parameters"}}``)."""
    if isinstance(tools, (str, bytes, Mapping)) or not isinstance(tools, Sequence):
        raise ToolSchemaError(f"tools must be a list of OpenAI-style tool dicts, got {shown(tools)}", "tools")
    checked = []
    for index, tool in enumerate(tools):
        field = f"tools[{index}]"
        if not isinstance(tool, Mapping):
            raise ToolSchemaError(f"tool {index} is a {type(tool).__name__}, not an OpenAI-style tool dict", field)
        function = tool.get("function")
        if tool.get("type") != "function" or not isinstance(function, Mapping):
            raise ToolSchemaError(f"tool {index} must look like {{'type': 'function', 'function': {{...}}}}", field)
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise ToolSchemaError(f"tool {index} has no function name ({field}.function.name={shown(name)})", field)
        parameters = function.get("parameters", {"type": "object", "properties": {}})
        if not isinstance(parameters, Mapping) or parameters.get("type", "object") != "object":
            raise ToolSchemaError(
                f"tool {name!r}: 'parameters' must be a JSON schema of type 'object', got {shown(parameters)}",
                f"{field}.function.parameters",
            )
        check_json_data(tool, field, ToolSchemaError)
        checked.append(dict(tool))
    return checked


def _check_tool_calls(calls: Any, field: str) -> None:
    """Assistant tool calls in the OpenAI shape the templates render: ``{"function": {"name", "arguments"}}``."""
    if isinstance(calls, (str, bytes, Mapping)) or not isinstance(calls, Sequence):
        raise MessageError(f"{field} must be a list of tool calls, got {shown(calls)}", field)
    for index, call in enumerate(calls):
        where = f"{field}[{index}]"
        function = call.get("function") if isinstance(call, Mapping) else None
        if not isinstance(function, Mapping):
            raise MessageError(
                f"{where} must look like {{'type': 'function', 'function': {{'name': ..., 'arguments': {{...}}}}}}, "
                f"got {shown(call)}",
                f"{where}.function",
            )
        if call.get("type", "function") != "function":
            raise MessageError(f"{where}.type must be 'function', got {shown(call.get('type'))}", f"{where}.type")
        if call.get("id") is not None and not isinstance(call["id"], str):
            raise MessageError(f"{where}.id must be a string, got {shown(call['id'])}", f"{where}.id")
        name = function.get("name")
        if not isinstance(name, str) or not name:
            raise MessageError(
                f"{where}.function.name must be a tool name, got {shown(name)}", f"{where}.function.name"
            )
        arguments = function.get("arguments")
        if not isinstance(arguments, (Mapping, str)):
            raise MessageError(
                f"{where}.function.arguments must be an object (or its JSON text), got {shown(arguments)}",
                f"{where}.function.arguments",
            )


def validate_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """Checks the shape the chat template expects and returns plain dict copies."""
    if isinstance(messages, (str, bytes, Mapping)) or not isinstance(messages, Sequence):
        raise MessageError("messages must be a list of {'role': ..., 'content': ...} dicts", "messages")
    if not messages:
        raise MessageError("messages is empty: give at least one user message", "messages")
    checked: list[dict[str, Any]] = []
    for index, message in enumerate(messages):
        field = f"messages[{index}]"
        if not isinstance(message, Mapping):
            raise MessageError(f"message {index} is a {type(message).__name__}, not a dict", field)
        role = message.get("role")
        role = ROLE_ALIASES.get(role, role) if isinstance(role, str) else role
        if role not in ROLES:
            raise MessageError(
                f"message {index} has unknown role {shown(role)}; use one of {sorted({*ROLES, *ROLE_ALIASES})}",
                f"{field}.role",
            )
        content, calls = message.get("content"), message.get("tool_calls")
        if isinstance(content, (list, tuple)):
            content = text_of_parts(content, index, role, f"{field}.content")
        if content is None and not calls:
            raise MessageError(f"message {index} ({role}) has no content", f"{field}.content")
        if content is not None and not isinstance(content, str):
            raise MessageError(
                f"message {index} ({role}) content must be text or a list of text parts; got {type(content).__name__}",
                f"{field}.content",
            )
        if calls is not None:
            _check_tool_calls(calls, f"{field}.tool_calls")
        for key in ("tool_call_id", "name", *REASONING_KEYS):
            if message.get(key) is not None and not isinstance(message[key], str):
                raise MessageError(f"{field}.{key} must be a string, got {shown(message[key])}", f"{field}.{key}")
        check_json_data(message, field)
        copy = {**message, "role": role}
        if "content" in message:
            copy["content"] = content
        reasoning = _reasoning_of(message, field)
        if reasoning is not None:  # under both names: whichever a template reads, either spelling renders the same
            copy.update(dict.fromkeys(REASONING_KEYS, reasoning))
        checked.append(copy)
    return checked


def _reasoning_of(message: Mapping[str, Any], field: str) -> str | None:
    """A message's reasoning under either name (vLLM >= 0.17 sends ``reasoning``, older servers and DeepSeek
    ``reasoning_content``); chat templates read ``reasoning_content``. Both, with different texts, is ambiguous."""
    given = {key: message[key] for key in REASONING_KEYS if message.get(key) is not None}
    if len(set(given.values())) > 1:
        raise MessageError(
            f"{field}.reasoning and {field}.reasoning_content hold different texts: give one of them (or the same "
            "text under both names)",
            f"{field}.reasoning",
        )
    return next(iter(given.values()), None)


def text_of_parts(parts: Sequence[Any], index: int, role: str, field: str) -> str:
    """OpenAI's content parts as the text they hold: ``{"type": "text", "text": ...}`` parts joined (see
    ``TEXT_PART_SEPARATOR``); any other part is refused, naming its type and where it is (this pair is text-only)."""
    texts: list[str] = []
    for number, part in enumerate(parts):
        where = f"{field}[{number}]"
        kind = part.get("type") if isinstance(part, Mapping) else type(part).__name__
        if kind != "text":
            raise MessageError(
                f"message {index} ({role}) has a content part of type {shown(kind)}: this model pair reads text "
                "only (parts of type 'text'; no images, audio or files)",
                f"{where}.type",
            )
        text = part.get("text")
        if not isinstance(text, str):
            raise MessageError(f"{where}.text must be a string, got {shown(text)}", f"{where}.text")
        texts.append(text)
    if not texts:
        raise MessageError(f"message {index} ({role}) has an empty list of content parts", field)
    return TEXT_PART_SEPARATOR.join(texts)


def reserved_template_names(tokenizer: PreTrainedTokenizerBase) -> frozenset[str]:
    """Names a template variable must not take: what the template gets already (``messages``, ``bos_token``, Jinja's
    and transformers' functions) and ``apply_chat_template``'s own parameters (``documents`` aside: passing documents
    that way is how a RAG template gets them)."""
    from jinja2.defaults import DEFAULT_NAMESPACE

    parameters = inspect.signature(tokenizer.apply_chat_template).parameters.values()
    own = {p.name for p in parameters if p.kind not in (p.VAR_KEYWORD, p.VAR_POSITIONAL)} - {"documents"}
    return frozenset(own | _TEMPLATE_NAMES | set(DEFAULT_NAMESPACE) | set(tokenizer.special_tokens_map))


def validate_template_kwargs(tokenizer: PreTrainedTokenizerBase, kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    if kwargs is None:
        return {}
    if not isinstance(kwargs, Mapping):
        raise MessageError(
            f"chat_template_kwargs must be a dict of template variables, got {shown(kwargs)}", "chat_template_kwargs"
        )
    reserved = reserved_template_names(tokenizer)
    for key in kwargs:
        if not isinstance(key, str):
            raise MessageError(
                f"chat_template_kwargs has the key {shown(key)}: keys must be strings", "chat_template_kwargs"
            )
        if key in reserved:
            raise MessageError(
                f"chat_template_kwargs[{key!r}] collides with a name the chat template gets already; pass messages "
                f"and tools as arguments of their own (taken: {', '.join(sorted(reserved))})",
                f"chat_template_kwargs[{key!r}]",
            )
    check_json_data(dict(kwargs), "chat_template_kwargs")
    return dict(kwargs)


def validate_chat(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    assistant_prefix: str | None = None,
) -> Chat:
    """Everything the template will see, checked before anything renders."""
    checked_tools = validate_tools(tools) if tools is not None else None
    return chat_of_checked(
        tokenizer, validate_messages(messages), checked_tools, chat_template_kwargs, assistant_prefix
    )


def chat_of_checked(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    assistant_prefix: str | None = None,
) -> Chat:
    """:func:`validate_chat` for messages and tools that passed :func:`validate_messages` / :func:`validate_tools`
    already (the chat layer's ``prepare_chat`` checks them before the engine loads, and a request is checked once):
    only the template variables, which need the tokenizer, and the assistant prefix are checked here."""
    template_kwargs = validate_template_kwargs(tokenizer, chat_template_kwargs)
    if assistant_prefix is not None and not isinstance(assistant_prefix, str):
        raise MessageError(f"assistant_prefix must be text, got {shown(assistant_prefix)}", "assistant_prefix")
    check_text(assistant_prefix or "", "assistant_prefix")
    # Plain dicts, as the checks return them (a shallow copy: the template and the markup pass read, never write).
    checked_tools = [dict(tool) for tool in tools] if tools else None
    return Chat([dict(message) for message in messages], checked_tools, template_kwargs, assistant_prefix or "")


# -- rendering --------------------------------------------------------------------------------------------------------
def _template_source(tokenizer: PreTrainedTokenizerBase) -> str:
    template = tokenizer.chat_template
    if template is None:
        raise MessageError("the tokenizer has no chat template; pass prompt token ids instead of messages", "messages")
    return template if isinstance(template, str) else "\n".join(str(t) for t in dict(template).values())


def _render(tokenizer: PreTrainedTokenizerBase, chat: Chat, add_generation_prompt: bool = True) -> str:
    from jinja2 import TemplateError

    _template_source(tokenizer)
    try:
        return tokenizer.apply_chat_template(
            chat.messages,
            tools=chat.tools,
            add_generation_prompt=add_generation_prompt,
            tokenize=False,
            **chat.template_kwargs,
        )
    except (TemplateError, TypeError, ValueError) as exc:  # a template's raise_exception (e.g. roles must alternate)
        raise MessageError(f"the chat template cannot render these messages: {exc}", "messages") from exc


def render_prompt_text(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    add_generation_prompt: bool = True,
) -> str:
    """The rendered prompt as text (for reading: encoding this text would turn control-token strings from the caller
    into tokens; :func:`render_prompt_ids` does not)."""
    return _render(tokenizer, validate_chat(tokenizer, messages, tools, chat_template_kwargs), add_generation_prompt)


def render_prompt_ids(
    tokenizer: PreTrainedTokenizerBase,
    messages: Sequence[Mapping[str, Any]],
    tools: Sequence[Mapping[str, Any]] | None = None,
    chat_template_kwargs: Mapping[str, Any] | None = None,
    assistant_prefix: str | None = None,
    *,
    raw_markup: bool = False,
) -> list[int]:
    """Prompt ids for a chat; the template already holds the special tokens, so none are added on top.

    ``assistant_prefix`` is prefilled into the assistant turn (e.g. ``<tool_call>`` to force a tool call); the
    model continues after it. It is markup, like the template's own text. Control-token strings in the messages,
    tools and template variables are encoded as text unless ``raw_markup`` (then they become tokens).
    """
    _check_raw_markup(raw_markup)
    return _encode(
        tokenizer, validate_chat(tokenizer, messages, tools, chat_template_kwargs, assistant_prefix), raw_markup
    )


def render_chat_ids(tokenizer: PreTrainedTokenizerBase, chat: Chat, *, raw_markup: bool = False) -> list[int]:
    """:func:`render_prompt_ids` of a chat checked already (:func:`validate_chat`, :func:`chat_of_checked`): it is
    rendered, not checked again."""
    _check_raw_markup(raw_markup)
    return _encode(tokenizer, chat, raw_markup)


def _check_raw_markup(raw_markup: Any) -> None:
    if not isinstance(raw_markup, bool):
        raise MessageError(f"raw_markup must be True or False, got {shown(raw_markup)}", "raw_markup")


def _encode(tokenizer: PreTrainedTokenizerBase, chat: Chat, raw_markup: bool) -> list[int]:
    if not raw_markup:
        tokens = markup.control_tokens(tokenizer, _template_source(tokenizer))
        if markup.holds_control_text(tokens, chat.messages, chat.tools, chat.template_kwargs):
            return encode_as_text(tokenizer, chat, tokens)
    text = _render(tokenizer, chat) + chat.assistant_prefix
    return list(tokenizer.encode(text, add_special_tokens=False))


def encode_as_text(tokenizer: PreTrainedTokenizerBase, chat: Chat, tokens: markup.ControlTokens) -> list[int]:
    """The chat with every control-token string from the caller marked, rendered, and encoded as text (``markup``)."""
    values = (chat.messages, chat.tools, chat.template_kwargs, chat.assistant_prefix)
    try:
        start, end = markup.pick_markers(*values)
        marked = Chat(
            markup.mark(chat.messages, tokens, start, end),
            markup.mark(chat.tools, tokens, start, end),
            markup.mark(chat.template_kwargs, tokens, start, end),
            chat.assistant_prefix,
        )
        return markup.encode_marked(tokenizer, _render(tokenizer, marked) + chat.assistant_prefix, tokens, start, end)
    except MessageError:
        raise
    except ValueError as exc:
        raise MessageError(str(exc), "messages") from exc
