"""CPU seconds of one fake-tensor trace of a training step: a 1-block T5-base (batch 2 x 128 tokens).

    .venv/bin/python benchmarks/trace_per_op.py [REPS]

Prints the op count, the profile's bytes (to compare before and after a change) and the median CPU time.
"""

from __future__ import annotations

import json
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

from dtypecheck.memory.fakes import cast_module, quiet_fake_tensor_log
from dtypecheck.memory.run import open_subject
from dtypecheck.memory.tracing import trace_pass

T5_BASE = {
    "architectures": ["T5ForConditionalGeneration"],
    "model_type": "t5",
    "d_ff": 3072,
    "d_kv": 64,
    "d_model": 768,
    "num_heads": 12,
    "num_layers": 12,
    "num_decoder_layers": 12,
    "feed_forward_proj": "relu",
    "is_encoder_decoder": True,
    "tie_word_embeddings": True,
    "vocab_size": 32128,
}


def main() -> None:
    reps = int(sys.argv[1]) if len(sys.argv) > 1 else 7
    with tempfile.TemporaryDirectory() as folder:
        config = Path(folder) / "config.json"
        config.write_text(json.dumps(T5_BASE), encoding="utf-8")
        subject = open_subject(str(config), batch_size=2, seq_len=128)
    assert subject.traceable is not None
    assert subject.traceable.with_layers is not None
    traceable = subject.traceable.with_layers(1).ready()
    cast_module(traceable.module, torch.float32, traceable.fake_mode)
    times = []
    for _ in range(reps + 1):
        start = time.process_time()
        with quiet_fake_tensor_log():
            profile = trace_pass(traceable, train=True, autocast_dtype=None, checkpointing=False)
        times.append(time.process_time() - start)
    median = statistics.median(times[1:])  # the first warms the fake mode's cache
    print(f"ops {profile.ops}, peak {profile.peak_activations} B, retained {profile.retained_bytes} B")
    print(f"CPU {median:.3f} s median of {reps} ({median / profile.ops * 1e3:.3f} ms per op)")


if __name__ == "__main__":
    main()
