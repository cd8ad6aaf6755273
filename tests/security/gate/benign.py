"""Files as transformers, peft, Lightning, accelerate and DCP really write them (issue 27, class 7).

Each is written by the real installed library (tiny models, a step or two of training, nothing downloaded) and
must pass the default gate (exit 0): flagging one is a false alarm. A library that is not installed leaves its
inputs out (``BENIGN_LIBRARIES`` says which were made).
"""

from __future__ import annotations

import contextlib
import io
import os
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from tests.security.corpus import Hostile

KLASS = "benign-frameworks"


def _benign(name: str, target: Path, *extra: str) -> Hostile:
    return Hostile(name, KLASS, ("scan-model", str(target), *extra), frozenset({0}), benign=True, loader="none")


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """Libraries' progress bars and warnings off; nothing reaches the network."""
    keys = ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE", "WANDB_DISABLED", "TOKENIZERS_PARALLELISM")
    saved = {key: os.environ.get(key) for key in keys}
    os.environ.update({"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "WANDB_DISABLED": "true"})
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    try:
        with (
            warnings.catch_warnings(),
            contextlib.redirect_stdout(io.StringIO()),
            contextlib.redirect_stderr(io.StringIO()),
        ):
            warnings.simplefilter("ignore")
            yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


def torch_objects(folder: Path) -> list[Hostile]:
    """Whole modules (zip and legacy), optimizer/scheduler/GradScaler state dicts, as ``torch.save`` writes them."""
    import torch

    torch.manual_seed(0)
    out = []
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.GELU(), torch.nn.LayerNorm(4))
    layer = torch.nn.TransformerEncoderLayer(8, 2, 16)  # activation=F.relu: a plain reference to a torch function
    for name, value in (("whole-sequential", model), ("whole-transformer-encoder-layer", layer)):
        for legacy in (False, True):
            path = folder / f"{name}{'-legacy' if legacy else ''}.pt"
            torch.save(value, path, _use_new_zipfile_serialization=not legacy)
            out.append(_benign(path.stem, path))
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    model(torch.ones(2, 4)).sum().backward()
    optimizer.step()
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10)
    scaler = torch.amp.GradScaler("cpu")
    states = {"optimizer": optimizer.state_dict(), "scheduler": scheduler.state_dict(), "scaler": scaler.state_dict()}
    path = folder / "training-states.pt"
    torch.save({"model": model.state_dict(), **states}, path)
    out.append(_benign("training-states", path))
    return out


def _tiny_bert() -> Any:
    from transformers import BertConfig, BertForSequenceClassification

    config = BertConfig(
        vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=16,
        max_position_embeddings=16,
    )  # fmt: skip
    config.num_labels = 2
    return BertForSequenceClassification(config)


class _Rows:
    """Four tokenised rows, as a ``datasets`` split would give them."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict[str, object]:
        import torch

        return {"input_ids": torch.tensor([1, 2, 3, 4]), "labels": torch.tensor(index % 2)}


def _train(model: Any, where: Path) -> Path:
    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(where), max_steps=2, save_steps=2, per_device_train_batch_size=2, report_to=[],
        logging_strategy="no", use_cpu=True, disable_tqdm=True,
    )  # fmt: skip
    Trainer(model=model, args=args, train_dataset=_Rows()).train()
    return where / "checkpoint-2"


def transformers_trainer(folder: Path) -> list[Hostile]:
    """``Trainer``'s ``checkpoint-N``: model.safetensors, optimizer.pt, scheduler.pt, rng_state.pth,
    training_args.bin (the pickled ``TrainingArguments``: a vetted class, a warning)."""
    with _quiet():
        checkpoint = _train(_tiny_bert(), folder / "trainer")
    out = [_benign("trainer-checkpoint", checkpoint)]
    out += [_benign(f"trainer-{p.stem}", p) for p in sorted(checkpoint.iterdir()) if p.name in _TRAINER_PICKLES]
    return out


_TRAINER_PICKLES = ("optimizer.pt", "rng_state.pth")  # scheduler.pt alone holds no tensor (a no-tensors finding)


def peft_trainer(folder: Path) -> list[Hostile]:
    """A LoRA adapter trained by ``Trainer``: adapter_model.safetensors beside the Trainer's pickles."""
    from peft import LoraConfig, get_peft_model

    with _quiet():
        model = get_peft_model(_tiny_bert(), LoraConfig(r=2, target_modules=["query", "value"]))
        checkpoint = _train(model, folder / "peft")
    return [_benign("peft-checkpoint", checkpoint)]


def lightning_trainer(folder: Path) -> list[Hostile]:
    """``lightning.Trainer``'s ``.ckpt`` with ``StochasticWeightAveraging`` (its averaged model and state)."""
    import lightning
    import torch
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    class Tiny(lightning.LightningModule):
        def __init__(self, width: int = 4) -> None:
            super().__init__()
            self.save_hyperparameters()
            self.layer = torch.nn.Linear(width, 1)

        def training_step(self, batch: list[torch.Tensor], _index: int) -> torch.Tensor:
            return torch.nn.functional.mse_loss(self.layer(batch[0]), batch[1])

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    data = torch.utils.data.TensorDataset(torch.ones(4, 4), torch.zeros(4, 1))
    out = []
    # with and without the ModelCheckpoint callback Lightning adds by default (its state holds kth_value = inf, a
    # 0-dim bookkeeping tensor: a role question, not a global one)
    for name, checkpointing in (("lightning-swa", False), ("lightning-swa-model-checkpoint", True)):
        with _quiet():
            trainer = lightning.Trainer(
                max_epochs=2, accelerator="cpu", devices=1, logger=False, enable_progress_bar=False,
                enable_model_summary=False, default_root_dir=str(folder / name), enable_checkpointing=checkpointing,
                callbacks=[StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)],
            )  # fmt: skip
            trainer.fit(Tiny(), torch.utils.data.DataLoader(data, batch_size=2))
            path = folder / f"{name}.ckpt"
            trainer.save_checkpoint(path)
        out.append(_benign(name, path))
    return out


def accelerate_state(folder: Path) -> list[Hostile]:
    """``Accelerator.save_state``: model.safetensors, optimizer.bin, scheduler.bin, random_states_0.pkl."""
    import torch
    from accelerate import Accelerator  # type: ignore[import-untyped]

    with _quiet():
        accelerator = Accelerator(cpu=True)
        model = torch.nn.Linear(4, 2)
        optimizer = torch.optim.Adam(model.parameters())
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        model, optimizer, scheduler = accelerator.prepare(model, optimizer, scheduler)
        accelerator.backward(model(torch.ones(2, 4)).sum())
        optimizer.step()
        scheduler.step()
        accelerator.save_state(str(folder / "accelerate"))
    return [_benign("accelerate-state", folder / "accelerate")]


def dcp_save(folder: Path) -> list[Hostile]:
    """``torch.distributed.checkpoint.save`` of a model and optimizer state (one process)."""
    import torch
    from torch.distributed.checkpoint.state_dict_saver import save

    model = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(model.parameters())
    model(torch.ones(1, 4)).sum().backward()
    optimizer.step()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, checkpoint_id=folder / "dcp")
    return [_benign("dcp-save", folder / "dcp")]


BENIGN_LIBRARIES: dict[str, tuple[str, Callable[[Path], list[Hostile]]]] = {
    "torch": ("torch", torch_objects),
    "transformers": ("transformers", transformers_trainer),
    "peft": ("peft", peft_trainer),
    "lightning": ("lightning", lightning_trainer),
    "accelerate": ("accelerate", accelerate_state),
    "dcp": ("torch", dcp_save),
}
"""name -> (the package it needs, its builder)."""


def build(folder: Path) -> list[Hostile]:
    import importlib.util

    out: list[Hostile] = []
    for name, (package, builder) in BENIGN_LIBRARIES.items():
        if importlib.util.find_spec(package) is None:
            continue
        where = folder / name
        where.mkdir(parents=True, exist_ok=True)
        out.extend(builder(where))
    return out
