"""``NanTraceCallback`` for Lightning: watch mode across ``trainer.fit()``.

    trainer = lightning.Trainer(callbacks=[NanTraceCallback("nantrace.json")])

Lightning runs ``training_step`` and ``backward`` inside ``optimizer.step(closure)``, so the check after the update
finds the step, and its replay re-runs the closure (forward, backward, update) under full tracing from the
optimizer snapshot. The report is written to ``report_path`` and one warning names the op, module and line; with
``stop=True`` (the default) the fit then stops at the end of that step.
"""

from __future__ import annotations

from types import ModuleType
from typing import Any, ClassVar

import lightning
from lightning.pytorch import Callback

from dtypecheck.integrations._session import WatchingCallback

SUPPORTED = ((2, 0), (3,))
"""Lightning versions the callback is built for (the ``lightning`` package's 2.x ``Callback`` hooks)."""


class NanTraceCallback(WatchingCallback, Callback):
    framework: ClassVar[ModuleType] = lightning
    supported = SUPPORTED

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        self.session.start(pl_module, optimizer_seen=True, names_from_calls=True)

    def on_train_batch_end(self, trainer: Any, pl_module: Any, outputs: Any, batch: Any, batch_idx: int) -> None:
        if self.session.poll():
            trainer.should_stop = True

    def on_train_end(self, trainer: Any, pl_module: Any) -> None:
        self.session.finish()

    def on_exception(self, trainer: Any, pl_module: Any, exception: BaseException) -> None:
        self.session.finish()


__all__ = ["NanTraceCallback"]
