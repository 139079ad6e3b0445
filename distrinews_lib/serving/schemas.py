"""Request and response models of the classification API (pydantic), with their documented limits.

The limits live here, next to the models, so the OpenAPI page at /docs shows the same numbers
the server enforces.
"""

from __future__ import annotations

from typing import Optional

from pydantic import BaseModel, ConfigDict, Field, StrictStr, field_validator

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


def check_text(value: str) -> str:
    """Refuse texts the model cannot use: blank ones, and ones that are not valid Unicode."""
    if not value.strip():
        raise ValueError("must not be empty or only whitespace")
    try:
        # JSON may carry lone surrogates ("\ud800"); they are not text and the tokenizer rejects them.
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise ValueError("contains invalid Unicode (a lone surrogate such as \\ud800)") from None
    return value


class PredictRequest(BaseModel):
    """One text to classify."""

    text: StrictStr = Field(
        ...,
        min_length=1,
        max_length=MAX_TEXT_CHARS,
        description=f"The news text (headline and/or description), 1 to {MAX_TEXT_CHARS:,} characters, "
                    "not only whitespace. Texts longer than the model's token window are truncated.",
        examples=[EXAMPLE_TEXT],
    )

    model_config = ConfigDict(json_schema_extra={"examples": [{"text": EXAMPLE_TEXT}]})

    _check = field_validator("text")(check_text)


class BatchPredictRequest(BaseModel):
    """Several texts classified in one call; the results come back in the same order."""

    texts: list[StrictStr] = Field(
        ...,
        min_length=1,
        max_length=MAX_BATCH_TEXTS,
        description=f"1 to {MAX_BATCH_TEXTS} texts, each 1 to {MAX_TEXT_CHARS:,} characters and not only whitespace.",
        examples=[EXAMPLE_TEXTS],
    )

    model_config = ConfigDict(json_schema_extra={"examples": [{"texts": EXAMPLE_TEXTS}]})

    @field_validator("texts")
    @classmethod
    def _check_each(cls, texts: list[str]) -> list[str]:
        # Checked here rather than with Annotated constraints so the message names the position.
        for i, text in enumerate(texts):
            if len(text) > MAX_TEXT_CHARS:
                raise ValueError(f"texts[{i}] has {len(text):,} characters; the limit is {MAX_TEXT_CHARS:,}")
            try:
                check_text(text)
            except ValueError as err:
                raise ValueError(f"texts[{i}] {err}") from None
        return texts


class Prediction(BaseModel):
    """The predicted class of one text and the probability of every class."""

    label: str = Field(..., description="The most probable class.", examples=["Sci/Tech"])
    confidence: float = Field(..., ge=0.0, le=1.0, description="The probability of `label`.", examples=[0.89])
    all_probabilities: dict[str, float] = Field(
        ..., description="Probability of each class, in the checkpoint's label order; they sum to 1.",
        examples=[{"World": 0.04, "Sports": 0.02, "Business": 0.05, "Sci/Tech": 0.89}],
    )


class BatchPredictResponse(BaseModel):
    """One Prediction per input text, in input order (results[i] belongs to texts[i])."""

    results: list[Prediction]


class CheckpointInfo(BaseModel):
    """What the checkpoint says about how it was trained (fields absent from it are null)."""

    path: Optional[str] = Field(None, description="The checkpoint file being served.")
    data_source: Optional[str] = Field(None, description="Where the training data came from.", examples=["ag_news"])
    final_accuracy: Optional[float] = Field(None, description="Test accuracy at the end of training (0..1).", examples=[0.91])
    world_size: Optional[int] = Field(None, description="How many processes (DDP ranks) trained it.", examples=[2])
    preset: Optional[str] = Field(None, description="The training preset.")
    model: Optional[str] = Field(None, description="The model it was built from.", examples=["tiny"])
    created: Optional[str] = Field(None, description="When it was saved (ISO time).")
    max_length: Optional[int] = Field(None, description="Token window; longer texts are truncated to it.", examples=[128])
    versions: Optional[dict] = Field(None, description="Library versions it was trained with.")


class BatchingInfo(BaseModel):
    max_batch_size: int = Field(..., description="Most single-text requests run together in one forward pass.")
    batch_window_ms: float = Field(..., description="How long the batcher waits to collect more requests.")
    torch_threads: int = Field(..., description="Threads torch uses for one forward pass.")
    batches_run: int = Field(0, description="Forward passes run for /predict since startup.")
    mean_batch_size: Optional[float] = Field(None, description="Average /predict requests per forward pass.")


class Limits(BaseModel):
    max_text_chars: int = MAX_TEXT_CHARS
    max_batch_texts: int = MAX_BATCH_TEXTS
    max_body_bytes: int = MAX_BODY_BYTES


class HealthResponse(BaseModel):
    """Readiness of the server. Returned with 200 when ready, 503 while the model is not loaded."""

    status: str = Field(..., description='"ok" when predictions can be served, else "loading" or "stopping".',
                        examples=["ok"])
    model_loaded: bool
    device: Optional[str] = Field(None, examples=["cpu"])
    labels: list[str] = Field(default_factory=list, examples=[["World", "Sports", "Business", "Sci/Tech"]])
    checkpoint: CheckpointInfo = Field(default_factory=CheckpointInfo)
    batching: Optional[BatchingInfo] = None
    limits: Limits = Field(default_factory=Limits)


class FieldError(BaseModel):
    field: str = Field(..., description='Where the problem is: "body", "text", "texts[3]"...', examples=["text"])
    message: str = Field(..., examples=["must not be empty or only whitespace"])


class ErrorResponse(BaseModel):
    """Every error (4xx, and 503 while loading) has this shape."""

    detail: str = Field(..., description="One readable sentence saying what is wrong.",
                        examples=["text: must not be empty or only whitespace"])
    errors: list[FieldError] = Field(default_factory=list)
