"""Exact formulas, below every stage: :mod:`~fxmem.formula.symbols` (the symbols B and the
named dims, :class:`~fxmem.formula.symbols.Size`), :mod:`~fxmem.formula.poly` (exact
univariate polynomials and their upper envelope), :mod:`~fxmem.formula.guards` (a trace's
shape guards folded into where a formula holds), :mod:`~fxmem.formula.prune` (which live
totals can be the peak, proved over B and the dims), :mod:`~fxmem.formula.search` (the
largest B where a condition holds). No torch tensors; imports only :mod:`fxmem.errors`."""
