"""A small Llama-style decoder built from a config dict, so configs need no ``transformers``.

It serves ``config.json`` files whose ``model_type`` is ``dtypecheck-decoder`` (and Llama-family configs when
``transformers`` is not installed), with the same parameter shapes as Llama: token embedding, blocks of RMSNorm,
grouped-query attention (no biases unless ``attention_bias``), RMSNorm and a SwiGLU MLP, a final norm and an
``lm_head`` that may be tied to the embedding. Attention runs through ``scaled_dot_product_attention``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

from dtypecheck.errors import InputError

MINI_MODEL_TYPE = "dtypecheck-decoder"
LLAMA_LIKE = ("llama", "mistral", "qwen2")


@dataclass(frozen=True)
class DecoderConfig:
    vocab_size: int
    hidden_size: int
    intermediate_size: int
    num_hidden_layers: int
    num_attention_heads: int
    num_key_value_heads: int
    head_dim: int
    tie_word_embeddings: bool = False
    attention_bias: bool = False
    rms_norm_eps: float = 1e-6

    @classmethod
    def from_dict(cls, data: dict[str, Any], source: str) -> DecoderConfig:
        required = ("vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads")
        missing = [key for key in required if not isinstance(data.get(key), int)]
        if missing:
            raise InputError(f"{source}: config lacks integer {', '.join(missing)}")
        heads = int(data["num_attention_heads"])
        return cls(
            vocab_size=int(data["vocab_size"]),
            hidden_size=int(data["hidden_size"]),
            intermediate_size=int(data["intermediate_size"]),
            num_hidden_layers=int(data["num_hidden_layers"]),
            num_attention_heads=heads,
            num_key_value_heads=int(data.get("num_key_value_heads") or heads),
            head_dim=int(data.get("head_dim") or data["hidden_size"] // heads),
            tie_word_embeddings=bool(data.get("tie_word_embeddings", False)),
            attention_bias=bool(data.get("attention_bias", data.get("model_type") == "qwen2")),
            rms_norm_eps=float(data.get("rms_norm_eps", 1e-6)),
        )


class RMSNorm(nn.Module):
    def __init__(self, size: int, eps: float) -> None:
        super().__init__()
        self.weight = nn.Parameter(torch.ones(size))
        self.eps = eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # Computed in float32 as Llama does; the upcast copy is part of what the tracer should see.
        normed = x.float() * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + self.eps)
        scaled: torch.Tensor = self.weight * normed.to(x.dtype)
        return scaled


class Attention(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.heads, self.kv_heads, self.head_dim = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        )
        bias = config.attention_bias
        self.q_proj = nn.Linear(config.hidden_size, self.heads * self.head_dim, bias=bias)
        self.k_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.v_proj = nn.Linear(config.hidden_size, self.kv_heads * self.head_dim, bias=bias)
        self.o_proj = nn.Linear(self.heads * self.head_dim, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        batch, seq, _ = x.shape
        q = self.q_proj(x).view(batch, seq, self.heads, self.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(batch, seq, self.kv_heads, self.head_dim).transpose(1, 2)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=self.heads != self.kv_heads)
        projected: torch.Tensor = self.o_proj(out.transpose(1, 2).reshape(batch, seq, self.heads * self.head_dim))
        return projected


class Block(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.input_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.self_attn = Attention(config)
        self.post_attention_layernorm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.gate_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.up_proj = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.down_proj = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.self_attn(self.input_layernorm(x))
        h = self.post_attention_layernorm(x)
        mlp: torch.Tensor = self.down_proj(F.silu(self.gate_proj(h)) * self.up_proj(h))
        return x + mlp


class MiniDecoder(nn.Module):
    def __init__(self, config: DecoderConfig) -> None:
        super().__init__()
        self.config = config
        self.embed_tokens = nn.Embedding(config.vocab_size, config.hidden_size)
        self.layers = nn.ModuleList(Block(config) for _ in range(config.num_hidden_layers))
        self.norm = RMSNorm(config.hidden_size, config.rms_norm_eps)
        self.lm_head = nn.Linear(config.hidden_size, config.vocab_size, bias=False)
        if config.tie_word_embeddings:
            self.lm_head.weight = self.embed_tokens.weight

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        x = self.embed_tokens(input_ids)
        for layer in self.layers:
            x = layer(x)
        logits: torch.Tensor = self.lm_head(self.norm(x))
        if labels is None:
            return logits
        # The loss upcasts the logits to float32, as transformers' causal-LM loss does.
        return F.cross_entropy(logits.float().flatten(0, 1), labels.flatten())
