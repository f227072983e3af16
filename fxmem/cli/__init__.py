"""The ``fxmem`` command: :mod:`~fxmem.cli.command` (click, rendered with rich and
:mod:`fxmem.report`) and :mod:`~fxmem.cli.targets` (what the command line names, turned into
a model, example inputs and a step). The top of the pipeline: it imports every stage and
nothing imports it (but the ``__main__`` entry points)."""

from .command import cli, main

__all__ = ["cli", "main"]
