"""``NanTraceCallback`` for the Hugging Face ``transformers.Trainer``: watch mode across ``trainer.train()``.

    trainer = Trainer(model, args, train_dataset=..., callbacks=[NanTraceCallback("nantrace.json")])

The first step whose loss, gradients or update goes non-finite is replayed under full tracing; the report (the
``nan-trace --format json`` document) is written to ``report_path`` and one warning names the op, module and line.
With ``stop=True`` (the default) training then stops at the end of that step; else it goes on, unwatched.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import transformers
from transformers import TrainerCallback

from dtypecheck.integrations._session import WatchingCallback

SUPPORTED = ((4, 40), (6,))
"""transformers versions the callback is built for: >= 4.40 (the ``TrainerCallback`` hooks it uses), < 6."""


class NanTraceCallback(WatchingCallback, TrainerCallback):  # type: ignore[misc]  # transformers is not followed
    framework: ClassVar[ModuleType] = transformers
    supported = SUPPORTED

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.session.start(model, optimizer_seen=True)

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.session.poll():
            control.should_training_stop = True

    def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.session.finish()


__all__ = ["NanTraceCallback"]
