"""Integrations with training frameworks, each imported only when used (``import fxmem``
imports none of them, nor the framework they need):

- :mod:`fxmem.integrations.lightning`   Lightning (``lightning.pytorch``; for the
  ``pytorch_lightning`` package, :mod:`fxmem.integrations.pytorch_lightning`): a callback
  setting the batch size at ``fit`` start to the largest whose step fits a budget
  (:class:`fxmem.integrations.lightning.FxmemBatchSize`), the step it mirrors in
  :mod:`fxmem.integrations.lightning_step`;
- :mod:`fxmem.integrations.hf`          the Hugging Face ``Trainer``: the step its
  ``TrainingArguments`` run, the largest ``per_device_train_batch_size`` for a budget
  (:func:`fxmem.integrations.hf.batch_size_for`), and a ``TrainerCallback`` logging the
  prediction beside the peak the real steps reach (:class:`fxmem.integrations.hf.FxmemCallback`);
- :mod:`fxmem.integrations.accelerate`  a drop-in for
  ``accelerate.utils.find_executable_batch_size`` that starts at fxmem's answer and keeps
  accelerate's fallback on a real out-of-memory.
"""
