"""--model custom: a small transformer encoder classifier in plain PyTorch, from scratch: token + position
embedding, N pre-norm encoder layers, mean over the real tokens, a linear head. No dropout on the attention
weights: on a CPU it alone took a fifth of a step. It answers like a Hugging Face classifier where the course
needs it.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

MODEL_TYPE = "distrinews_custom"


@dataclass
class CustomConfig:
    vocab_size: int = 32768  # hash buckets (or the WordPiece vocabulary's size with --tokenizer hf)
    dim: int = 128  # width of every token's vector
    n_layers: int = 2  # encoder layers
    n_heads: int = 4  # attention heads per layer (dim must divide by it)
    hidden_dim: int = 512  # width of each layer's feed-forward block
    max_position_embeddings: int = 512  # longest text (in tokens) it can read: the position table's size
    dropout: float = 0.1
    pooling: str = "mean"  # mean over the real tokens, or the first token ([CLS])
    num_labels: int = 2
    pad_token_id: int = 0
    model_type: str = MODEL_TYPE

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def from_run(cls, cfg, num_labels: int, vocab_size: int) -> "CustomConfig":
        return cls(
            vocab_size=vocab_size,
            dim=cfg.custom_dim,
            n_layers=cfg.custom_layers,
            n_heads=cfg.custom_heads,
            hidden_dim=cfg.custom_ffn,
            max_position_embeddings=cfg.max_length,
            dropout=cfg.custom_dropout,
            pooling=cfg.custom_pooling,
            num_labels=num_labels,
        )


@dataclass
class ClassifierOutput:
    logits: torch.Tensor
    loss: torch.Tensor | None = None  # with labels: the cross-entropy, like a Hugging Face classifier


class EncoderLayer(nn.Module):
    """Pre-norm transformer layer: x + attention(norm(x)), then x + feed-forward(norm(x))."""

    def __init__(self, dim: int, n_heads: int, hidden_dim: int, dropout: float):
        super().__init__()
        self.n_heads = n_heads
        self.attention_norm, self.ffn_norm = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.qkv, self.attention_out = nn.Linear(dim, 3 * dim), nn.Linear(dim, dim)
        self.ffn = nn.Sequential(nn.Linear(dim, hidden_dim), nn.GELU(), nn.Linear(hidden_dim, dim))
        self.dropout = nn.Dropout(dropout)

    def forward(self, x, keep):  # x: (batch, tokens, dim); keep: (batch, 1, 1, tokens), False at padding
        b, t, d = x.shape
        q, k, v = self.qkv(self.attention_norm(x)).view(b, t, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        attended = F.scaled_dot_product_attention(q, k, v, attn_mask=keep)  # softmax(q k^T / sqrt(d_head)) v
        x = x + self.dropout(self.attention_out(attended.transpose(1, 2).reshape(b, t, d)))
        return x + self.dropout(self.ffn(self.ffn_norm(x)))


class CustomClassifier(nn.Module):
    def __init__(self, config: CustomConfig):
        super().__init__()
        self.config = c = config
        self.token_embeddings = nn.Embedding(c.vocab_size, c.dim, padding_idx=c.pad_token_id)
        self.position_embeddings = nn.Embedding(c.max_position_embeddings, c.dim)  # learned positional encoding
        self.embedding_norm = nn.LayerNorm(c.dim)
        self.layers = nn.ModuleList(EncoderLayer(c.dim, c.n_heads, c.hidden_dim, c.dropout) for _ in range(c.n_layers))
        self.final_norm = nn.LayerNorm(c.dim)
        self.dropout = nn.Dropout(c.dropout)
        self.classifier = nn.Linear(c.dim, c.num_labels)
        self.apply(self._init)

    @staticmethod
    def _init(m):  # BERT's initialisation: N(0, 0.02) weights, zero biases
        if isinstance(m, (nn.Linear, nn.Embedding)):
            nn.init.normal_(m.weight, std=0.02)
        if isinstance(m, nn.Linear) and m.bias is not None:
            nn.init.zeros_(m.bias)
        if isinstance(m, nn.Embedding) and m.padding_idx is not None:
            nn.init.zeros_(m.weight[m.padding_idx])

    def forward(self, input_ids, attention_mask=None, labels=None, **_):
        if attention_mask is None:
            attention_mask = (input_ids != self.config.pad_token_id).long()
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        x = self.token_embeddings(input_ids) + self.position_embeddings(positions)[None]
        x = self.dropout(self.embedding_norm(x))
        keep = attention_mask.bool()[:, None, None, :]  # padding is never attended to
        for layer in self.layers:
            x = layer(x, keep)
        x = self.final_norm(x)
        if self.config.pooling == "cls":
            pooled = x[:, 0]
        else:  # the mean of the real tokens' vectors
            mask = attention_mask.unsqueeze(-1).to(x.dtype)
            pooled = (x * mask).sum(1) / mask.sum(1).clamp(min=1.0)
        logits = self.classifier(self.dropout(pooled))
        loss = F.cross_entropy(logits.float(), labels) if labels is not None else None
        return ClassifierOutput(logits=logits, loss=loss)
