"""The result users hold and its renderers: :mod:`~fxmem.report.result` (:class:`fxmem.Report`),
:mod:`~fxmem.report.summary` (what a rendered report shows, computed once), and the
renderers, which read a summary and never re-run analysis: :mod:`~fxmem.report.text`,
:mod:`~fxmem.report.terminal` (rich), :mod:`~fxmem.report.markdown`,
:mod:`~fxmem.report.jsonout`, :mod:`~fxmem.report.html` with :mod:`~fxmem.report.plots`,
:mod:`~fxmem.report.whatif`."""
