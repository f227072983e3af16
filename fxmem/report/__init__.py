"""Renderers: they read a :class:`fxmem.Report` and never re-run analysis."""
