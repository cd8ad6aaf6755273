"""Which of the installed transformers' model types ``estimate-memory`` can estimate from a tiny config (issue 22.5).

For every model type in ``transformers.CONFIG_MAPPING``: its config class with its defaults shrunk (hidden sizes,
layers, heads, vocabulary), written to a folder, estimated for float32 inference and training at batch 1 x 16
tokens. Prints one markdown row per type (ok, or the one-line error) and a count. Nothing is downloaded.

    .venv/bin/python benchmarks/memory_config_sweep.py [--only bert,gpt2] [--timeout 60]
"""

from __future__ import annotations

import argparse
import signal
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

SMALL = {
    "hidden_size": 32,
    "d_model": 32,
    "n_embd": 32,
    "dim": 32,
    "embed_dim": 32,
    "intermediate_size": 64,
    "d_ff": 64,
    "ffn_dim": 64,
    "encoder_ffn_dim": 64,
    "decoder_ffn_dim": 64,
    "num_hidden_layers": 1,
    "num_layers": 1,
    "n_layer": 1,
    "encoder_layers": 1,
    "decoder_layers": 1,
    "num_decoder_layers": 1,
    "num_attention_heads": 2,
    "num_key_value_heads": 2,
    "n_head": 2,
    "num_heads": 2,
    "encoder_attention_heads": 2,
    "decoder_attention_heads": 2,
    "vocab_size": 128,
}


class _TimeoutError(Exception):
    pass


def _shrunk(config: Any) -> Any:
    for name, value in SMALL.items():
        if isinstance(getattr(config, name, None), int) and not isinstance(getattr(config, name), bool):
            setattr(config, name, value)
    for name in ("layer_types", "mlp_layer_types", "attention_layer_types"):
        listed = getattr(config, name, None)
        layers = getattr(config, "num_hidden_layers", None)
        if isinstance(listed, list) and isinstance(layers, int):
            setattr(config, name, listed[:layers])  # one entry per layer, as the config validates
    vocab = getattr(config, "vocab_size", None)
    if isinstance(vocab, int):
        for name, value in list(vars(config).items()):
            # special token ids of the full vocabulary must stay inside the shrunk one
            if name.endswith("_token_id") and isinstance(value, int) and value >= vocab:
                setattr(config, name, vocab - 1)
    for sub in ("text_config", "vision_config", "audio_config", "encoder", "decoder"):
        nested = getattr(config, sub, None)
        if nested is not None and hasattr(nested, "to_dict"):
            _shrunk(nested)
    return config


def sweep(only: set[str] | None, timeout: int) -> None:
    import transformers

    from dtypecheck.dtypes import lookup
    from dtypecheck.errors import DtypecheckError
    from dtypecheck.memory import EstimateOptions, estimate_memory

    def alarm(_signum: int, _frame: object) -> None:
        raise _TimeoutError

    signal.signal(signal.SIGALRM, alarm)
    options = EstimateOptions(dtypes=(lookup("float32"),))
    ok = failed = 0
    print("| model type | result | seconds |\n|---|---|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        for model_type, config_class in sorted(transformers.CONFIG_MAPPING.items()):
            if only and model_type not in only:
                continue
            folder = Path(tmp) / model_type
            folder.mkdir()
            start = time.perf_counter()
            signal.alarm(timeout)
            try:
                _shrunk(config_class()).to_json_file(str(folder / "config.json"))
                report = estimate_memory(str(folder), options, seq_len=16)
                result = f"ok ({report.model.model_class}, {report.model.parameters:,} parameters)"
                ok += 1
            except _TimeoutError:
                result, failed = f"timeout after {timeout} s", failed + 1
            except DtypecheckError as exc:
                result, failed = f"error: {exc.message()}"[:200], failed + 1
            except Exception as exc:  # noqa: BLE001  (a config class that cannot even be made: reported, not fatal)
                result, failed = (
                    f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"[:200],
                    failed + 1,
                )
            finally:
                signal.alarm(0)
            print(f"| {model_type} | {result.replace('|', '/')} | {time.perf_counter() - start:.1f} |", flush=True)
    print(f"\n{ok} of {ok + failed} model types estimated")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma list of model types")
    parser.add_argument("--timeout", type=int, default=60)
    args = parser.parse_args()
    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    sweep(set(args.only.split(",")) if args.only else None, args.timeout)


if __name__ == "__main__":
    main()
