"""
Offline journal analytics on Spark (``kestrel-analyze``).

The job reads folders of journal files from one or more servers, decodes them
on the executors with the server's own record codec (L{kestrel.journal.records}),
and writes Parquet tables, a JSON summary and a self-contained HTML report.
See ``docs/analytics.md``.
"""
