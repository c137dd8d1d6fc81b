"""The gateway's request and response types (pydantic): OpenAI's chat and completions dialects,
SGLang's native ``/generate``, and PEARL's extensions.

OpenAI requests (chat, completions, tokenize) accept unknown fields, as vLLM does, and an
explicit ``null`` means a field's default; :mod:`pearl.gateway.fields` refuses by name those that
would change the output and that PEARL does not implement yet, and names the others in a header.
SGLang's ``/generate`` forbids unknown fields, as SGLang's sampling parameters do. Numbers are
finite, and a seed is a signed 64-bit integer (vLLM's range), so whatever passes can be encoded
for a worker host. Text
with a lone surrogate (JSON ``"\\ud800"``) is found by :func:`bad_text`; the routes refuse it,
naming the field. Extension fields (vLLM's ``return_token_ids``, ``token_ids``,
``prompt_token_ids``, ``ignore_eos``; PEARL's ``weight_version`` and ``weight_versions``) are
documented in docs/gateway.md.
"""

from __future__ import annotations

import functools
import itertools
import types
import typing
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, Strict, model_validator

INT64_MIN, INT64_MAX = -(1 << 63), (1 << 63) - 1
Seed = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]  # what vLLM, torch and the sim engine take
# vLLM's sampling fields: a number, never a bool or a numeric string (their ranges:
# pearl.gateway.sampling.knobs)
Int = Annotated[int, Strict()]
Num = Annotated[float, Strict()]
MAX_RID = 256  # characters of a client's request id


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", allow_inf_nan=False)


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow", allow_inf_nan=False)


def drop_nulls(data: Any) -> Any:
    """A request body without its explicit ``null`` values: each means the field's default."""
    if isinstance(data, dict):
        return {k: v for k, v in data.items() if v is not None}
    return data


class _Request(_Open):
    """An OpenAI-dialect request: unknown fields kept (``model_extra``), nulls dropped."""

    @model_validator(mode="before")
    @classmethod
    def _nulls(cls, data: Any) -> Any:
        return drop_nulls(data)


def _is_text(s: str) -> bool:
    if s.isascii():
        return True
    try:
        s.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


_SCALARS = (int, float, bool, type(None))


def _holds_no_text(tp: Any) -> bool:
    """Whether every value of annotation ``tp`` is a number, a boolean, None, or a list or
    tuple of them: once validated, no string can be in it."""
    if tp in _SCALARS:
        return True
    origin = typing.get_origin(tp)
    if origin is Annotated:
        return _holds_no_text(typing.get_args(tp)[0])
    if origin in (list, tuple, typing.Union, types.UnionType):
        return all(a is Ellipsis or _holds_no_text(a) for a in typing.get_args(tp))
    return False


@functools.cache
def _textless(cls: type[BaseModel]) -> frozenset[str]:
    """The fields of ``cls`` that hold no text (token ids, numbers): never walked."""
    return frozenset(n for n, f in cls.model_fields.items() if _holds_no_text(f.annotation))


def _where(value: Any) -> list[str] | None:
    """The path of the first string in ``value`` that is not text, innermost key first (a bad
    key: its mapping's path); None when every string is text. A model's fields that hold no
    text are skipped (:func:`_textless`), and numbers at once: a request's token ids are most
    of its values, and none can hold text."""
    if isinstance(value, str):
        return None if _is_text(value) else []
    if isinstance(value, BaseModel):
        skip = _textless(type(value))
        fields = ((k, v) for k, v in value.__dict__.items() if k not in skip)
        value = dict(itertools.chain(fields, (value.model_extra or {}).items()))
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(k, str) and not _is_text(k):
                return []
            if isinstance(v, _SCALARS):
                continue
            found = _where(v)
            if found is not None:
                found.append(str(k))
                return found
    elif isinstance(value, list | tuple):
        for i, v in enumerate(value):
            if isinstance(v, _SCALARS):
                continue
            found = _where(v)
            if found is not None:
                found.append(str(i))
                return found
    return None


def bad_text(value: Any, path: str = "") -> str | None:
    """Where the first string in ``value`` that is not valid Unicode text (a lone surrogate: it
    cannot be encoded as UTF-8) is: its path (``messages.0.content``; a bad key: the path of its
    mapping, "" at the top), or None when every string is text. A model is walked as its dump
    would be (field names, then the extra fields), without dumping it; the path is built only
    for a string that is not text."""
    found = _where(value)
    if found is None:
        return None
    return ".".join([*([path] if path else []), *reversed(found)])


# --- requests -----------------------------------------------------------------------------------


class ContentPart(_Open):
    type: str
    text: str | None = None


class FunctionCall(_Open):
    name: str
    arguments: str | dict[str, Any] = "{}"


class ToolCall(_Open):
    id: str | None = None
    type: Literal["function"] = "function"
    function: FunctionCall


class ChatMessage(_Open):
    """One message; extra fields (``reasoning_content``, ...) reach the chat template."""

    role: Literal["system", "developer", "user", "assistant", "tool"]
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCall] | None = None
    tool_call_id: str | None = None


class FunctionDef(_Open):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(_Open):
    type: Literal["function"] = "function"
    function: FunctionDef


class StreamOptions(_Request):
    include_usage: bool | None = None


class _Sampled(_Request):
    """What chat and completions requests share."""

    model: str
    stream: bool = False
    stream_options: StreamOptions | None = None
    max_tokens: int | None = Field(default=None, ge=1)
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    seed: Seed | None = None
    n: Int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None  # vLLM's extension
    presence_penalty: Num | None = None
    frequency_penalty: Num | None = None
    logit_bias: dict[str, float] | None = None
    # vLLM's sampling fields (pearl.gateway.sampling reads them)
    top_k: Int | None = None
    min_p: Num | None = None
    repetition_penalty: Num | None = None
    min_tokens: Int | None = None
    user: str | None = None
    return_token_ids: bool | None = None  # vLLM's extension
    ignore_eos: bool | None = None  # vLLM's extension: EOS does not end the response
    skip_special_tokens: bool | None = None  # vLLM's: false keeps special tokens in the text
    include_stop_str_in_output: bool | None = None  # vLLM's: the text keeps what stopped it
    # vLLM's structured outputs (pearl.gateway.structured reads them)
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None


class ChatRequest(_Sampled):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = Field(default=None, ge=1)
    logprobs: bool | None = None
    top_logprobs: int | None = Field(default=None, ge=0)
    tools: list[Tool] | None = None
    tool_choice: str | dict[str, Any] | None = None
    response_format: dict[str, Any] | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's extension


MAX_PROMPTS = 256  # prompts of one completions request


class CompletionRequest(_Sampled):
    """``prompt``: a string, token ids, or a list of either (one choice per prompt)."""

    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = Field(default=None, ge=0)
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None
    return_tokens_as_token_ids: bool | None = None  # vLLM's: tokens named token_id:N


class GenerateSamplingParams(_Strict):
    """SGLang's ``sampling_params`` (the subset PEARL implements)."""

    max_new_tokens: int = Field(default=128, ge=1)
    temperature: float = Field(default=1.0, ge=0.0)
    top_p: float = Field(default=1.0, gt=0.0, le=1.0)
    top_k: Int = -1
    seed: Seed | None = None
    sampling_seed: Seed | None = None  # SGLang's name for the seed
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    skip_special_tokens: bool = True
    spaces_between_special_tokens: bool = True
    no_stop_trim: bool = False
    n: Int = 1
    # SGLang's sampling fields (vLLM's semantics; min_new_tokens is vLLM's min_tokens)
    min_p: Num = 0.0
    presence_penalty: Num = 0.0
    frequency_penalty: Num = 0.0
    repetition_penalty: Num = 1.0
    min_new_tokens: Int = 0


class GenerateRequest(_Strict):
    """SGLang's ``GenerateReqInput`` for one prompt."""

    text: str | None = None
    input_ids: list[int] | None = None
    sampling_params: GenerateSamplingParams = Field(default_factory=GenerateSamplingParams)
    rid: str | None = Field(default=None, max_length=MAX_RID)
    stream: bool = False
    return_logprob: bool = False
    logprob_start_len: int = -1
    top_logprobs_num: int = 0
    return_text_in_logprobs: bool = False


class TokenizeCompletionRequest(_Request):
    """vLLM's ``/tokenize`` of a text."""

    model: str | None = None
    prompt: str
    add_special_tokens: bool = True
    return_token_strs: bool | None = False


class TokenizeChatRequest(_Request):
    """vLLM's ``/tokenize`` of a chat, rendered with the model's chat template."""

    model: str | None = None
    messages: list[ChatMessage] = Field(min_length=1)
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    add_special_tokens: bool = False
    return_token_strs: bool | None = False
    tools: list[Tool] | None = None
    chat_template_kwargs: dict[str, Any] | None = None


class DetokenizeRequest(_Request):
    """vLLM's ``/detokenize``."""

    model: str | None = None
    tokens: list[int]


# --- responses ----------------------------------------------------------------------------------


class ErrorBody(BaseModel):
    message: str
    type: str
    param: str | None = None
    code: str | int | None = None


class ErrorResponse(BaseModel):
    error: ErrorBody


class Usage(BaseModel):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    recomputed_tokens: int = 0  # PEARL: prompt tokens re-prefilled because the request moved
    migrations: int = 0  # PEARL: times the request moved to another worker


class TokenLogprob(BaseModel):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[dict[str, Any]] = Field(default_factory=list)


class ChoiceLogprobs(BaseModel):
    content: list[TokenLogprob] | None


class ResponseFunction(BaseModel):
    name: str
    arguments: str


class ResponseToolCall(BaseModel):
    id: str
    type: Literal["function"] = "function"
    function: ResponseFunction


class ResponseMessage(BaseModel):
    role: Literal["assistant"] = "assistant"
    content: str | None
    tool_calls: list[ResponseToolCall] | None = None


class ChatChoice(BaseModel):
    index: int = 0
    message: ResponseMessage
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str
    token_ids: list[int] | None = None  # vLLM's, with return_token_ids
    weight_version: int  # PEARL: the version that produced the last token
    weight_versions: list[tuple[int, int]]  # PEARL: [first token index, version] per change


class ChatResponse(BaseModel):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    choices: list[ChatChoice]
    usage: Usage
    prompt_token_ids: list[int] | None = None  # vLLM's, with return_token_ids


class DeltaFunction(BaseModel):
    name: str | None = None
    arguments: str | None = None


class DeltaToolCall(BaseModel):
    index: int
    id: str | None = None
    type: Literal["function"] | None = None
    function: DeltaFunction


class ChunkDelta(BaseModel):
    role: Literal["assistant"] | None = None
    content: str | None = None
    tool_calls: list[DeltaToolCall] | None = None


class ChunkChoice(BaseModel):
    index: int = 0
    delta: ChunkDelta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None
    token_ids: list[int] | None = None  # this chunk's tokens, with return_token_ids
    weight_version: int | None = None  # PEARL: the version of this chunk's tokens


class ChatChunk(BaseModel):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None  # on the first chunk, with return_token_ids


class CompletionLogprobs(BaseModel):
    tokens: list[str]
    token_logprobs: list[float]
    top_logprobs: list[dict[str, float]] | None = None
    text_offset: list[int]


class CompletionChoice(BaseModel):
    index: int = 0
    text: str
    logprobs: CompletionLogprobs | None = None
    finish_reason: str | None
    token_ids: list[int] | None = None
    prompt_token_ids: list[int] | None = None  # where vLLM puts them for completions
    weight_version: int | None = None
    weight_versions: list[tuple[int, int]] | None = None


class CompletionResponse(BaseModel):
    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    choices: list[CompletionChoice]
    usage: Usage | None = None
    prompt_token_ids: list[int] | None = None


class ModelCard(BaseModel):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str = "pearl"
    max_model_len: int


class ModelList(BaseModel):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class TokenizeResponse(BaseModel):
    count: int
    max_model_len: int
    tokens: list[int]
    token_strs: list[str] | None = None


class DetokenizeResponse(BaseModel):
    prompt: str


class GenerateMeta(BaseModel):
    id: str
    finish_reason: dict[str, Any] | None
    prompt_tokens: int
    completion_tokens: int
    output_token_logprobs: list[tuple[float, int, str | None]] | None = None
    # per token, the top_logprobs_num most likely (logprob, id, text), as SGLang
    output_top_logprobs: list[list[tuple[float, int, str | None]]] | None = None
    weight_version: int
    weight_versions: list[tuple[int, int]]  # PEARL
    recomputed_tokens: int = 0  # PEARL
    migrations: int = 0  # PEARL
    e2e_latency: float


class GenerateResponse(BaseModel):
    text: str
    index: int | None = None  # the sample's, with n > 1 (SGLang: a list, or index in a stream)
    output_ids: list[int]
    meta_info: GenerateMeta
