"""Ground truth, above the pipeline: :mod:`~fxmem.validate.measure` (:func:`fxmem.measure`,
a real eager step), :mod:`~fxmem.validate.zoo` (models people train, as validation cases),
:mod:`~fxmem.validate.harness` (predictions against measured steps, as a table; ``fxmem
validate``), :mod:`~fxmem.validate.divergence` (the first allocation where a prediction and
a real CUDA step part ways)."""
