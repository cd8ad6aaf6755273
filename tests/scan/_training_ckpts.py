"""Training checkpoints shaped as the frameworks write them, built here from a tiny model (no downloads).

Each has been trained for a few Adam steps; the step counters are then set to ``STEP``, the count a long run
reaches (float32 scalars that overflow float16), as the checkpoints of issue 21 had.
"""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import save_file

STEP = 1_000_000.0
"""Adam's step counter after a long run: float16's max is 65504."""


def _trained(optimizer: str = "adamw") -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """A few steps trained in float64, then stored in float32 (as trained in float32 they would be): every machine
    writes the same checkpoint. In float32 the small values the golden tables print (a last bias's Adam moment,
    the sum of terms that nearly cancel) differ by CPU kernel and thread count."""
    torch.manual_seed(0)
    first = torch.nn.Linear(8, 16)
    model = torch.nn.Sequential(first, torch.nn.BatchNorm1d(16), torch.nn.Linear(16, 4)).double()
    kind = torch.optim.AdamW if optimizer == "adamw" else torch.optim.Adam
    opt: torch.optim.Optimizer = kind(model.parameters(), lr=1e-3)
    for _ in range(3):
        loss = model(torch.randn(32, 8, dtype=torch.float64)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        # A bias just before batch norm has a true gradient of 0 (the norm takes the mean out): what backward
        # computes for it is rounding noise, even in float64 another on each CPU.
        assert first.bias.grad is not None
        first.bias.grad.zero_()
        opt.step()
    model.float()  # in place: the optimizer's state stays keyed by the same parameters
    for state in opt.state.values():
        for key, value in state.items():
            if key != "step" and value.is_floating_point():
                state[key] = value.float()
        state["step"].fill_(STEP)
    return model, opt


def _scaler_state() -> dict[str, Any]:
    return torch.amp.GradScaler("cpu").state_dict()


def plain(tmp_path: Path, optimizer: str = "adamw") -> Path:
    """``torch.save({"model", "optimizer", "scaler", "epoch"})`` as a hand-written training loop saves it."""
    model, opt = _trained(optimizer)
    path = tmp_path / "plain.pt"
    state = {"model": model.state_dict(), "optimizer": opt.state_dict(), "scaler": _scaler_state(), "epoch": 7}
    torch.save(state, path)
    return path


def lightning(tmp_path: Path) -> Path:
    """A Lightning ``.ckpt``: ``state_dict`` under the LightningModule's attribute, trainer state beside it."""
    model, opt = _trained()
    scheduler = torch.optim.lr_scheduler.StepLR(opt, step_size=10)
    path = tmp_path / "epoch=6-step=700.ckpt"
    checkpoint = {
        "epoch": 6,
        "global_step": 700,
        "pytorch-lightning_version": "2.4.0",
        "state_dict": {f"net.{k}": v for k, v in model.state_dict().items()},
        "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 7, "completed": 6}}}},
        "callbacks": {
            "ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {
                "best_model_score": torch.tensor(1e-9),  # a tiny loss: float16 flushes it
                "current_score": torch.tensor(70000.0),  # a large one: float16 overflows
                "best_k_models": {"epoch=6.ckpt": torch.tensor(1e-9)},
            },
            "EarlyStopping{'monitor': 'val_loss', 'mode': 'min'}": {"best_score": torch.tensor(1e-9), "wait_count": 0},
        },
        "optimizer_states": [opt.state_dict()],
        "lr_schedulers": [scheduler.state_dict()],
        "MixedPrecision": _scaler_state(),
        "hparams_name": "kwargs",
        "hyper_parameters": {"lr": 1e-3},
    }
    torch.save(checkpoint, path)
    return path


def hf_trainer(tmp_path: Path) -> Path:
    """A Hugging Face Trainer ``checkpoint-N`` folder."""
    model, opt = _trained()
    folder = tmp_path / "checkpoint-700"
    folder.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(folder / "model.safetensors"))
    torch.save(opt.state_dict(), folder / "optimizer.pt")
    torch.save(torch.optim.lr_scheduler.LambdaLR(opt, lambda _: 1.0).state_dict(), folder / "scheduler.pt")
    torch.save({"python": random.getstate(), "cpu": torch.get_rng_state()}, folder / "rng_state.pth")
    torch.save(_scaler_state(), folder / "scaler.pt")
    (folder / "trainer_state.json").write_text('{"global_step": 700}\n')
    return folder


def deepspeed(tmp_path: Path) -> Path:
    """A DeepSpeed ZeRO-2 ``global_step700/`` folder: fp16 model states, fp32 optimizer partitions."""
    model, _ = _trained()
    folder = tmp_path / "global_step700"
    folder.mkdir()
    module = {k: v.half() if v.is_floating_point() else v for k, v in model.state_dict().items()}
    torch.save(
        {
            "module": module,
            "buffer_names": ["1.running_mean", "1.running_var", "1.num_batches_tracked"],
            "optimizer": None,
            "lr_scheduler": {"last_batch_iteration": 699, "warmup_num_steps": 100},
            "global_steps": 700,
            "global_samples": 22400,
            "skipped_steps": 0,
            "dp_world_size": 1,
            "mp_world_size": 1,
            "ds_version": "0.15.0",
        },
        folder / "mp_rank_00_model_states.pt",
    )
    flat = torch.cat([p.detach().float().reshape(-1) for p in model.parameters()])
    torch.save(
        {
            "optimizer_state_dict": {
                "loss_scaler": {"cur_scale": 65536.0},
                "dynamic_loss_scale": True,
                "overflow": False,
                "base_optimizer_state": {
                    "state": {
                        0: {
                            "step": torch.tensor(STEP),
                            "exp_avg": torch.full_like(flat, 1e-9),  # tiny moments: float16 would flush them
                            "exp_avg_sq": torch.full_like(flat, 1e-12),
                        }
                    },
                    "param_groups": [{"lr": 1e-3, "params": [0]}],
                },
                "single_partition_of_fp32_groups": [flat * 70000.0],  # beyond float16: kept in float32 by design
                "zero_stage": 2,
                "partition_count": [1],
            },
            "ds_version": "0.15.0",
        },
        folder / "zero_pp_rank_0_mp_rank_00_optim_states.pt",
    )
    return folder
