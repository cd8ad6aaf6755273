"""Small models of the families users train, each with the loss its users write (issue 12's accuracy suite).

Every factory returns ``(model, inputs, loss_fn)`` as ``dtypecheck estimate-memory file.py:factory`` takes it;
the transformers models are built from configs in memory (nothing is downloaded). ``bench_memory.py`` measures
each against PyTorch's MemTracker on a plain training loop written here, independently of dtypecheck.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F  # noqa: N812
from torch import nn

BATCH = 8
TOKENS = 128
VOCAB = 8000


def _ids(batch: int = BATCH, tokens: int = TOKENS, vocab: int = VOCAB) -> torch.Tensor:
    return torch.randint(0, vocab, (batch, tokens))


def next_token_loss(output: Any, ids: torch.Tensor) -> torch.Tensor:
    """The causal-LM loss as training scripts write it: shift, flatten, cross-entropy."""
    logits = output.logits if hasattr(output, "logits") else output
    return F.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]), ids[:, 1:].reshape(-1))


def _gpt(tied: bool) -> tuple[nn.Module, torch.Tensor, Any]:
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(vocab_size=VOCAB, n_positions=TOKENS, n_embd=128, n_layer=4, n_head=4, tie_word_embeddings=tied)
    config.resid_pdrop = config.embd_pdrop = config.attn_pdrop = 0.0
    return GPT2LMHeadModel(config), _ids(), next_token_loss


def gpt() -> tuple[nn.Module, torch.Tensor, Any]:
    return _gpt(tied=False)


def gpt_tied() -> tuple[nn.Module, torch.Tensor, Any]:
    return _gpt(tied=True)


def bert_mlm() -> tuple[nn.Module, torch.Tensor, Any]:
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=VOCAB,
        hidden_size=128,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=512,
        max_position_embeddings=TOKENS,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )

    def loss_fn(output: Any, ids: torch.Tensor) -> torch.Tensor:
        logits = output.logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), ids.view(-1))

    return BertForMaskedLM(config), _ids(), loss_fn


def t5() -> tuple[nn.Module, dict[str, torch.Tensor], Any]:
    from transformers import T5Config, T5ForConditionalGeneration

    torch.manual_seed(0)
    config = T5Config(vocab_size=VOCAB, d_model=128, d_kv=32, d_ff=512, num_layers=3, num_heads=4, dropout_rate=0.0)

    def loss_fn(output: Any, inputs: dict[str, torch.Tensor]) -> torch.Tensor:
        logits = output.logits
        return F.cross_entropy(logits.view(-1, logits.shape[-1]), inputs["decoder_input_ids"].view(-1))

    inputs = {"input_ids": _ids(), "decoder_input_ids": _ids(tokens=TOKENS // 2)}
    return T5ForConditionalGeneration(config), inputs, loss_fn


def vit() -> tuple[nn.Module, torch.Tensor, Any]:
    from transformers import ViTConfig, ViTForImageClassification

    torch.manual_seed(0)
    config = ViTConfig(
        image_size=64,
        patch_size=8,
        hidden_size=192,
        num_hidden_layers=4,
        num_attention_heads=4,
        intermediate_size=768,
        hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )
    config.num_labels = 100
    labels = torch.randint(0, 100, (BATCH * 2,))

    def loss_fn(output: Any, _pixels: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(output.logits, labels)

    return ViTForImageClassification(config), torch.randn(BATCH * 2, 3, 64, 64), loss_fn


def cnn() -> tuple[nn.Module, torch.Tensor, Any]:
    torch.manual_seed(0)

    def stage(c_in: int, c_out: int) -> nn.Sequential:
        return nn.Sequential(
            nn.Conv2d(c_in, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.Conv2d(c_out, c_out, 3, padding=1, bias=False),
            nn.BatchNorm2d(c_out),
            nn.ReLU(inplace=True),
            nn.MaxPool2d(2),
        )

    model = nn.Sequential(
        stage(3, 32), stage(32, 64), stage(64, 128), nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(128, 100)
    )
    labels = torch.randint(0, 100, (32,))

    def loss_fn(logits: torch.Tensor, _images: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(logits, labels)

    return model, torch.randn(32, 3, 32, 32), loss_fn


class LSTMLanguageModel(nn.Module):
    def __init__(self, vocab: int = VOCAB, width: int = 256) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, width)
        self.lstm = nn.LSTM(width, width, num_layers=2, batch_first=True)
        self.head = nn.Linear(width, vocab)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        hidden, _ = self.lstm(self.embed(ids))
        logits: torch.Tensor = self.head(hidden)
        return logits


def lstm_lm() -> tuple[nn.Module, torch.Tensor, Any]:
    torch.manual_seed(0)
    return LSTMLanguageModel(), _ids(tokens=64), next_token_loss


def autoencoder() -> tuple[nn.Module, torch.Tensor, Any]:
    """A conv autoencoder trained on reconstruction: ``F.mse_loss(output, images)``, whose CPU kernel keeps the
    elementwise buffer (the images' size) behind the scalar loss."""
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Conv2d(3, 32, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.Conv2d(32, 64, 3, stride=2, padding=1),
        nn.ReLU(),
        nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1),
        nn.ReLU(),
        nn.ConvTranspose2d(32, 3, 4, stride=2, padding=1),
    )

    def loss_fn(reconstruction: torch.Tensor, images: torch.Tensor) -> torch.Tensor:
        return F.mse_loss(reconstruction, images)

    return model, torch.randn(32, 3, 64, 64), loss_fn


MODELS = {
    "GPT-2 LM (cross-entropy)": "gpt",
    "GPT-2 LM, tied embedding": "gpt_tied",
    "BERT masked LM": "bert_mlm",
    "T5 encoder-decoder": "t5",
    "ViT classifier": "vit",
    "CNN (conv+BN) classifier": "cnn",
    "LSTM LM": "lstm_lm",
    "Conv autoencoder (MSE)": "autoencoder",
}
"""Report label -> factory name in this file."""
