"""Request and response models of the classification API (pydantic), with their documented limits.

The limits live here, next to the models, so the OpenAPI page at /docs shows the same numbers
the server enforces.
"""

from __future__ import annotations

import re
from typing import Annotated, Optional

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, StrictStr

# A news item is a headline plus a short description; 10,000 characters is far beyond that but
# still cheap to tokenize.  Longer texts are refused rather than silently cut.  Allowed texts longer
# than the model's window (max_length tokens) are truncated, exactly as in training.
MAX_TEXT_CHARS = 10_000
# One /predict/batch call runs as (at most) one forward pass; 64 texts keep its latency bounded.
MAX_BATCH_TEXTS = 64
# Refused before parsing: even 64 texts of 10,000 characters, each written as 6-byte JSON
# escapes (\u00e9), stay under this.  Anything bigger is not a legitimate request.
MAX_BODY_BYTES = 8 * 1024 * 1024

EXAMPLE_TEXT = "NASA's new space telescope sends back its first images of distant galaxies."
EXAMPLE_TEXTS = [
    EXAMPLE_TEXT,
    "Federer beats Nadal in a five-set Wimbledon final.",
    "Oil prices climb as OPEC agrees to cut production.",
]


# Python's whitespace (str.isspace, what str.strip removes), spelled out so that the OpenAPI schema's
# `pattern` (an ECMA-262 regular expression) and the server's check agree character for character:
# a text is refused as blank exactly when the schema says it does not match.
WHITESPACE_CLASS = (
    "\\u0009-\\u000d\\u001c-\\u0020\\u0085\\u00a0\\u1680\\u2000-\\u200a\\u2028\\u2029\\u202f\\u205f\\u3000"
)
NOT_BLANK_PATTERN = f"[^{WHITESPACE_CLASS}]"  # at least one character that is not whitespace
_NOT_BLANK = re.compile(NOT_BLANK_PATTERN)


def check_text(value: str) -> str:
    """Refuse texts the model cannot use: blank ones, and ones that are not valid Unicode."""
    if not _NOT_BLANK.search(value):
        raise ValueError("must not be empty or only whitespace")
    try:
        # JSON may carry lone surrogates ("\ud800"); they are not text and the tokenizer rejects them.
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains invalid Unicode (a lone surrogate such as \\ud800)") from None
    return value


TEXT_DESCRIPTION = (
    f"1 to {MAX_TEXT_CHARS:,} characters, at least one of them not whitespace. Texts longer than "
    "the model's token window are truncated."
)
# One text, with every limit in the schema (so /docs and schema-driven clients know them) and checked in order:
# type, length, then blankness and Unicode (check_text).
Text = Annotated[
    StrictStr,
    Field(min_length=1, max_length=MAX_TEXT_CHARS, json_schema_extra={"pattern": NOT_BLANK_PATTERN}),
    AfterValidator(check_text),
]


class PredictRequest(BaseModel):
    """One text to classify."""

    text: Text = Field(
        ..., description="The news text (headline and/or description): " + TEXT_DESCRIPTION, examples=[EXAMPLE_TEXT]
    )

    model_config = ConfigDict(json_schema_extra={"examples": [{"text": EXAMPLE_TEXT}]})


class BatchPredictRequest(BaseModel):
    """Several texts classified in one call; the results come back in the same order."""

    texts: list[Text] = Field(
        ...,
        min_length=1,
        max_length=MAX_BATCH_TEXTS,
        description=f"1 to {MAX_BATCH_TEXTS} texts, each " + TEXT_DESCRIPTION,
        examples=[EXAMPLE_TEXTS],
    )

    model_config = ConfigDict(json_schema_extra={"examples": [{"texts": EXAMPLE_TEXTS}]})


class Prediction(BaseModel):
    """The predicted class of one text and the probability of every class."""

    label: str = Field(..., description="The most probable class.", examples=["Sci/Tech"])
    confidence: float = Field(..., ge=0.0, le=1.0, description="The probability of `label`.", examples=[0.89])
    all_probabilities: dict[str, float] = Field(
        ...,
        description="Probability of each class, in the checkpoint's label order; they sum to 1.",
        examples=[{"World": 0.04, "Sports": 0.02, "Business": 0.05, "Sci/Tech": 0.89}],
    )


class BatchPredictResponse(BaseModel):
    """One Prediction per input text, in input order (results[i] belongs to texts[i])."""

    results: list[Prediction]


class CheckpointInfo(BaseModel):
    """What the checkpoint says about how it was trained (fields absent from it are null)."""

    file: Optional[str] = Field(
        None,
        description="The name of the checkpoint file being served (not its folder).",
        examples=["distilbert_agnews.pt"],
    )
    data_source: Optional[str] = Field(None, description="Where the training data came from.", examples=["ag_news"])
    final_accuracy: Optional[float] = Field(
        None, description="Test accuracy at the end of training (0..1).", examples=[0.91]
    )
    world_size: Optional[int] = Field(None, description="How many processes (DDP ranks) trained it.", examples=[2])
    preset: Optional[str] = Field(None, description="The training preset.")
    model: Optional[str] = Field(None, description="The model it was built from.", examples=["tiny"])
    created: Optional[str] = Field(None, description="When it was saved (ISO time).")
    max_length: Optional[int] = Field(
        None, description="Token window; longer texts are truncated to it.", examples=[128]
    )
    versions: Optional[dict] = Field(None, description="Library versions it was trained with.")


class BatchingInfo(BaseModel):
    max_batch_size: int = Field(..., description="Most single-text requests run together in one forward pass.")
    batch_window_ms: float = Field(..., description="How long the batcher waits to collect more requests.")
    torch_threads: int = Field(..., description="Threads torch uses for one forward pass.")
    batches_run: int = Field(0, description="Forward passes run for /predict since startup.")
    mean_batch_size: Optional[float] = Field(None, description="Average /predict requests per forward pass.")
    texts_run: int = Field(0, description="/predict texts classified since startup.")
    batch_calls_run: int = Field(0, description="/predict/batch calls classified since startup.")


class QueueInfo(BaseModel):
    """The bounded queue in front of the model, and what it refused or dropped since startup."""

    max_requests: int = Field(..., description="Most requests waiting for the model; more get 503 with Retry-After.")
    max_texts: int = Field(..., description="Most texts waiting for the model; more get 503 with Retry-After.")
    deadline_s: float = Field(..., description="Seconds a request may wait for its answer; later it gets 503.")
    waiting_requests: int = Field(0, description="Requests waiting for the model now.")
    waiting_texts: int = Field(0, description="Texts waiting for the model now.")
    shed: int = Field(0, description="Requests refused because the queue was full.")
    expired: int = Field(0, description="Requests dropped at their deadline before the model saw them.")
    abandoned: int = Field(0, description="Requests dropped because their client went away before the model saw them.")
    texts_dropped: int = Field(0, description="Texts of the expired and abandoned requests: model work not done.")
    texts_unused: int = Field(0, description="Texts classified although nobody waited for the answer any more.")


class QuantizationInfo(BaseModel):
    """How an int8 server quantized its model (--quantize int8), checked against fp32 when it started."""

    method: str = Field(..., description="What was quantized, and how.")
    engine: str = Field(..., description="torch's quantized engine on this CPU.", examples=["x86"])
    linear_layers: int = Field(..., description="Linear layers now computing in int8.")
    linear_share: float = Field(..., description="Their share of the weights outside the embeddings (0..1).")
    probe_drift: float = Field(
        ...,
        description="Largest change of a class probability, int8 against fp32, on the "
        "server's probe texts at start-up.",
    )


class Limits(BaseModel):
    max_text_chars: int = MAX_TEXT_CHARS
    max_batch_texts: int = MAX_BATCH_TEXTS
    max_body_bytes: int = MAX_BODY_BYTES


class HealthResponse(BaseModel):
    """Readiness of the server. Returned with 200 when ready, 503 while the model is not loaded."""

    status: str = Field(
        ..., description='"ok" when predictions can be served, else "loading" or "stopping".', examples=["ok"]
    )
    model_loaded: bool
    device: Optional[str] = Field(None, examples=["cpu"])
    precision: Optional[str] = Field(
        None, description='What the model computes in: "fp32", or "int8" (--quantize int8).', examples=["fp32"]
    )
    quantization: Optional[QuantizationInfo] = Field(None, description="With --quantize int8: how.")
    labels: list[str] = Field(default_factory=list, examples=[["World", "Sports", "Business", "Sci/Tech"]])
    checkpoint: CheckpointInfo = Field(default_factory=CheckpointInfo)
    batching: Optional[BatchingInfo] = None
    queue: Optional[QueueInfo] = None
    limits: Limits = Field(default_factory=Limits)


class FieldError(BaseModel):
    field: str = Field(..., description='Where the problem is: "body", "text", "texts[3]"...', examples=["text"])
    message: str = Field(..., examples=["must not be empty or only whitespace"])


class ErrorResponse(BaseModel):
    """Every error (4xx; 503 while loading or overloaded) has this shape."""

    detail: str = Field(
        ...,
        description="One readable sentence saying what is wrong.",
        examples=["text: must not be empty or only whitespace"],
    )
    errors: list[FieldError] = Field(default_factory=list)
