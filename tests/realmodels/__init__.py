"""The real-model zoo: architectures from torchvision, timm and Hugging Face transformers,
each built small with random weights, traced by :func:`fxmem.analyze` and checked against a
real CPU step (:func:`fxmem.measure`).

- :mod:`realmodels.registry`: the cases (``CASES``), each a builder of
  ``(model, inputs, targets, loss)`` for one training step;
- :mod:`realmodels.audit`: one case predicted and measured (:func:`realmodels.audit.audit`);
- ``test_fast.py``: a subset across families, run by pytest where torchvision and timm are
  installed (``constraints-realmodels.txt``);
- ``benchmarks/realmodels.py``: the whole registry, written to ``docs/real-models.md``.

Nothing here imports torchvision, timm or transformers at import time: the main test
environment has none of the first two, and pytest's ``--doctest-modules`` imports every
module under ``tests/``.
"""
