"""
Offline journal analytics (``kestrel-analyze``), on Spark or in one process.

The job reads folders of journal files (live folders and archives) from one or
more servers, recognises the snapshots packs and rewrites wrote, and writes
Parquet tables, a JSON summary and a self-contained HTML report that keep
client traffic and server state apart. See ``docs/analytics.md``.
"""
