"""Numbers hidden behind a bookkeeping name (issue 27, class 4), and the training checkpoints whose bookkeeping is real.

The hidden ones: a (64, 64) float32 tensor of 1e6 (beyond float16's 65504) under a name that once made a tensor
bookkeeping (``*.state.N.step``, ``scaler.*``, ``epoch``, ``callbacks.*``, ``schedulers.*``, ``rng_state.*``,
``num_batches_tracked``, DeepSpeed's ``fp32_flat_groups``, Adafactor's ``exp_avg_sq_row``), Lightning's
StochasticWeightAveraging average and a diffusion scheduler's buffers registered in a model: ``--target fp16`` (or
float8 for the scheduler's SNR) must exit 1. The real ones, written by the installed torch, transformers, Lightning
and diffusers (DeepSpeed is not installable here: its ZeRO-3 optimizer state dict is built by hand from DeepSpeed's
``stage3.py`` ``_rigid_state_dict`` and ``checkpoint/constants.py``), must exit 0 with their bookkeeping reported
and their fp32 optimizer state not judged.
"""

from __future__ import annotations

import random
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from tests.security.corpus import Hostile

KLASS = "roles"
BIG = 1e6
"""Beyond float16's max (65504): an overflow whenever it is judged against float16."""
STEP = 1_000_000.0
"""A long run's step counter (float32 by torch.optim's design)."""


def _huge() -> Any:
    import torch

    return torch.full((64, 64), BIG)


def _tiny_model() -> Any:
    import torch

    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4))


def hidden(folder: Path) -> dict[str, Path]:
    """name -> a torch file in which a (64, 64) tensor of 1e6 hides behind a bookkeeping name."""
    import torch

    adam_like = {"state": {0: {"step": _huge(), "exp_avg": torch.zeros(64, 64)}}, "param_groups": [{"params": [0]}]}
    layouts: dict[str, dict[str, Any]] = {
        "step-named-weight": {"model": {"w": torch.ones(4)}, "optimizer": adam_like},
        "scaler-named-weight": {"model": {"w": torch.ones(4)}, "scaler": {"w": _huge()}},
        "epoch-named-weight": {"model": {"w": torch.ones(4)}, "epoch": _huge()},
        "callbacks-named-weight": {"state_dict": {"w": torch.ones(4)}, "callbacks": {"Cb{}": {"w": _huge()}}},
        "schedulers-named-weight": {"model": {"w": torch.ones(4)}, "schedulers": {"w": _huge()}},
        "loops-named-weight": {"state_dict": {"w": torch.ones(4)}, "loops": {"fit_loop": {"w": _huge()}}},
        "rng-named-float": {"model": {"w": torch.ones(4)}, "rng_state": {"cpu": _huge()}},
        "num-batches-named-float": {"bn.running_mean": torch.zeros(64), "bn.num_batches_tracked": _huge()},
        "module-list-named-state": {"state": {0: {"step": _huge(), "weight": torch.ones(64, 64)}}},
        "deepspeed-named-square": {"optimizer_state_dict": {"fp32_flat_groups": [_huge()], "zero_stage": 3}},
        "adafactor-named-unpaired": {
            "state": {0: {"exp_avg_sq_row": _huge(), "exp_avg_sq_col": torch.ones(6)}},
            "param_groups": [{"params": [0]}],
        },
    }
    paths = {}
    for name, layout in layouts.items():
        paths[name] = folder / f"{name}.pt"
        torch.save(layout, paths[name])
    return paths


class _Tiny:
    """A LightningModule (defined on first use: Lightning imports in seconds, only when the corpus is built)."""

    made: Any = None

    @classmethod
    def make(cls) -> Any:
        if cls.made is None:
            import lightning
            import torch

            class Tiny(lightning.LightningModule):
                def __init__(self) -> None:
                    super().__init__()
                    self.net = _tiny_model()

                def training_step(self, batch: Any, _index: int) -> Any:
                    loss = self.net(batch[0]).pow(2).mean()
                    self.log("train_loss", loss)
                    return loss

                def configure_optimizers(self) -> Any:
                    return torch.optim.Adam(self.parameters(), lr=1e-3)

            cls.made = Tiny
        return cls.made()


def lightning_with_swa(folder: Path) -> Path:
    """A real ``lightning.Trainer`` run with ModelCheckpoint, EarlyStopping and StochasticWeightAveraging, saved by
    ``trainer.save_checkpoint``: the SWA callback's state holds its averaged model (real weights)."""
    import lightning
    import torch
    from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint, StochasticWeightAveraging

    torch.manual_seed(0)
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(64, 8)), batch_size=16)
    trainer = lightning.Trainer(
        max_epochs=3,
        accelerator="cpu",
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        default_root_dir=str(folder),
        callbacks=[
            ModelCheckpoint(dirpath=str(folder / "ckpts"), monitor="train_loss"),
            EarlyStopping(monitor="train_loss", patience=5),
            StochasticWeightAveraging(swa_lrs=1e-2, swa_epoch_start=1),
        ],
    )
    trainer.fit(_Tiny.make(), data)
    path = folder / "swa.ckpt"
    trainer.save_checkpoint(path)
    return path


def doctored_swa(source: Path, path: Path) -> Path:
    """The same checkpoint with one weight of the SWA average at 1e6 (a diverged average, or a planted one)."""
    import torch

    checkpoint = torch.load(source, weights_only=False)
    swa = next(v for k, v in checkpoint["callbacks"].items() if k.startswith("StochasticWeightAveraging"))
    swa["average_model_state"]["net.0.weight"].fill_(BIG)
    torch.save(checkpoint, path)
    return path


def diffusion_scheduler_model(path: Path) -> Path:
    """A model that registers a real diffusers ``DDPMScheduler``'s ``betas``, ``alphas_cumprod`` and SNR (as
    diffusers' ``training_utils.compute_snr`` gives it) as buffers of a ``scheduler`` submodule: real values that a
    float8 cast overflows (the SNR reaches 9999 at t = 0, e4m3's max is 448)."""
    import torch
    from diffusers import DDPMScheduler

    scheduler: Any = DDPMScheduler()
    holder = torch.nn.Module()
    cumprod = scheduler.alphas_cumprod
    for name, value in (("betas", scheduler.betas), ("alphas_cumprod", cumprod), ("snr", cumprod / (1 - cumprod))):
        holder.register_buffer(name, value.clone())
    model = torch.nn.Module()
    model.proj = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.proj.weight.fill_(0.25)
        model.proj.bias.fill_(0.5)
    model.scheduler = holder
    torch.save(model.state_dict(), path)
    return path


def adafactor_checkpoints(folder: Path) -> dict[str, Path]:
    """``{"model", "optimizer"}`` after real steps of transformers' Adafactor and torch.optim's Adafactor on a
    bias-free model (so that every state is factored), as a training loop saves them."""
    import torch
    from transformers.optimization import Adafactor

    out = {}
    for name, make in (
        ("transformers-adafactor", lambda ps: Adafactor(ps, lr=1e-3, relative_step=False, scale_parameter=False)),
        ("torch-adafactor", lambda ps: torch.optim.Adafactor(ps, lr=1e-2)),
    ):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(8, 16, bias=False), torch.nn.Linear(16, 4, bias=False))
        optimizer = make(model.parameters())
        for _ in range(3):
            optimizer.zero_grad()
            model(torch.randn(32, 8)).pow(2).mean().backward()
            optimizer.step()
        out[name] = folder / f"{name}.pt"
        torch.save({"model": model.state_dict(), "optimizer": optimizer.state_dict()}, out[name])
    return out


def adam_with_grad_scaler(path: Path) -> Path:
    """``{"model", "optimizer", "scaler", "epoch"}`` after real Adam steps (step counters at a long run's 1e6) with
    a real GradScaler's state dict, as a hand-written AMP loop saves them."""
    import torch

    model = _tiny_model()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    scaler = torch.amp.GradScaler("cpu")
    for _ in range(3):
        optimizer.zero_grad()
        scaler.scale(model(torch.randn(32, 8)).pow(2).mean()).backward()
        scaler.step(optimizer)
        scaler.update()
    for state in optimizer.state.values():
        state["step"].fill_(STEP)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "scaler": scaler.state_dict()}
    torch.save({**state, "epoch": torch.tensor(7)}, path)
    return path


def hf_trainer_rng_folder(folder: Path) -> Path:
    """A Trainer ``checkpoint-N`` folder of rank 1 of 2: ``model.safetensors`` and the ``rng_state_1.pth`` that
    ``transformers.Trainer._save_rng_state`` itself writes (bytes of torch's generator state: uint8 up to 255)."""
    import torch
    from safetensors.torch import save_file
    from transformers import Trainer

    folder.mkdir()
    save_file({k: v.contiguous() for k, v in _tiny_model().state_dict().items()}, str(folder / "model.safetensors"))
    random.seed(0)
    stand_in = SimpleNamespace(args=SimpleNamespace(world_size=2, process_index=1, parallel_mode=None))
    Trainer._save_rng_state(stand_in, str(folder))
    assert (folder / "rng_state_1.pth").exists()
    assert int(torch.get_rng_state().max()) > 127  # bytes beyond int8's 127: a false alarm if judged against int8
    return folder


def deepspeed_zero3_folder(folder: Path) -> Path:
    """A DeepSpeed ZeRO-3 ``global_stepN/`` folder, built by hand (DeepSpeed is not installable here) from its
    documented layout: ``mp_rank_00_model_states.pt`` (``module`` with partitioned, empty parameters) and
    ``zero_pp_rank_0_mp_rank_00_optim_states.pt`` holding ``{"optimizer_state_dict": stage3's _rigid_state_dict}``:
    ``zero_stage``, ``loss_scaler``, ``dynamic_loss_scale``, ``overflow``, ``partition_count``, the base optimizer's
    ``optimizer_state_dict`` (flat fp32 ``exp_avg``/``exp_avg_sq`` per sub-group, a step counter) and
    ``fp32_flat_groups`` (the fp32 master partitions). The loss scaler is written as its plain state (DeepSpeed
    pickles a ``DynamicLossScaler`` object there, a global the code-globals class judges)."""
    import torch

    model = _tiny_model()
    folder.mkdir()
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    module = {
        k: torch.empty(0, dtype=torch.float16) if v.is_floating_point() else v for k, v in model.state_dict().items()
    }
    shapes = [{k: list(v.shape) for k, v in model.named_parameters()}]
    torch.save(
        {"module": module, "param_shapes": shapes, "global_steps": 7, "ds_version": "0.14.4"},
        folder / "mp_rank_00_model_states.pt",
    )
    base = {
        "state": {0: {"step": torch.tensor(STEP), "exp_avg": flat * 1e-3, "exp_avg_sq": torch.full_like(flat, 1e-12)}},
        "param_groups": [{"lr": 1e-3, "betas": (0.9, 0.999), "params": [0]}],
    }
    zero = {
        "zero_stage": 3,
        "loss_scaler": {"cur_scale": 65536.0, "cur_iter": 7},
        "dynamic_loss_scale": True,
        "overflow": False,
        "partition_count": 1,
        "optimizer_state_dict": base,
        "fp32_flat_groups": [flat * 70000.0],  # beyond float16: kept in float32 by design
    }
    torch.save(
        {"optimizer_state_dict": zero, "ds_version": "0.14.4"}, folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt"
    )
    return folder


def build(folder: Path) -> list[Hostile]:
    root = folder / "roles"
    root.mkdir()
    out: list[Hostile] = []

    def add(name: str, target: Path, expect: int, *args: str, benign: bool = False) -> None:
        command = ("scan-model", str(target), *args)
        out.append(Hostile(name, KLASS, command, frozenset({expect}), loader="none", benign=benign))

    for name, path in hidden(root).items():
        add(name, path, 1, "--target", "fp16")
    swa = lightning_with_swa(root / "lightning")
    add("lightning-swa-average-overflows", doctored_swa(swa, root / "swa-doctored.ckpt"), 1, "--target", "fp16")
    add("diffusion-scheduler-buffers", diffusion_scheduler_model(root / "ddpm-buffers.pt"), 1, "--target", "e4m3")
    # benign: what the frameworks really write
    add("lightning-swa", swa, 0, "--target", "fp16", benign=True)
    add("adam-grad-scaler", adam_with_grad_scaler(root / "amp.pt"), 0, "--target", "fp16", benign=True)
    for name, path in adafactor_checkpoints(root).items():
        add(name, path, 0, "--target", "fp16", benign=True)
    add("hf-rng-state-int8", hf_trainer_rng_folder(root / "checkpoint-7"), 0, "--target", "int8", benign=True)
    add("deepspeed-zero3", deepspeed_zero3_folder(root / "global_step7"), 0, "--target", "fp16", benign=True)
    return out
