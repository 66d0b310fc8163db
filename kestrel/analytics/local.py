"""
The same analysis in one Python process, without Spark (``--engine local``).

It reads local folders only, scans every planned file with the same scanner,
computes every table with L{kestrel.analytics.tables} (the Spark job uses the
same functions for the replay and the summary, and the same definitions for
the flow), and writes Parquet with pyarrow. For folders that one process can
hold, the tables are equal to the Spark job's (the tests compare them).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from kestrel.analytics import tables
from kestrel.analytics.job import Progress, finish, plan_inputs, stage
from kestrel.analytics.layout import LayoutError, Plan, is_local
from kestrel.analytics.scan import SCHEMA, TRAILER_OP, read_local


def write_table(folder: str, name: str, pdf_or_table: pd.DataFrame | pa.Table,
                ddl: str | None = None) -> None:
    """Write one Parquet table as C{folder/name/part-00000.parquet}."""
    table = pdf_or_table if ddl is None else tables.to_arrow(pdf_or_table, ddl)
    os.makedirs(os.path.join(folder, name), exist_ok=True)
    pq.write_table(table, os.path.join(folder, name, "part-00000.parquet"))


def run_local(inputs: Sequence[tuple[str, str]], out: str, *,
              archives: Sequence[tuple[str, str]] = (), progress: Progress | None = None,
              report: bool = True, events: bool = False,
              plan: Plan | None = None) -> dict[str, Any]:
    """
    Analyse local journal folders into C{out} in this process; return the summary.

    Same arguments and outputs as L{kestrel.analytics.job.run}.

    @raise LayoutError: an input is not a local folder, or cannot be read.
    """
    if not all(is_local(p) for _, p in [*inputs, *archives]) or not is_local(out):
        raise LayoutError("--engine local reads and writes local folders only")
    say = progress or Progress(6)
    if plan is None:
        say(f"planning {len(inputs) + len(archives)} folder(s)")
        plan = plan_inputs(None, inputs, "source", archives)
    say(f"scanning {len(plan.files)} file(s), {plan.total_bytes:,} bytes, "
        f"{len(plan.queues())} queue(s); {len(plan.skipped)} file(s) skipped")
    staging = stage(None, out)
    try:
        batches = [read_local(jf) for jf in plan.files]
        scanned = (pa.Table.from_batches(batches, schema=SCHEMA) if batches
                   else SCHEMA.empty_table())
        is_trailer = pc.equal(scanned["op"], TRAILER_OP)
        trailers = scanned.filter(is_trailer).to_pandas()
        records = scanned.filter(pc.invert(is_trailer)).drop_columns(["problem"])
        event_ms = pc.coalesce(records["add_ms"], records["time_lb_ms"],
                                       records["time_ub_ms"])
        records = records.append_column("event_ms", event_ms)
        cut = trailers[trailers["problem"].notna()]
        note = (f"; {len(cut)} file(s) end in a broken record: "
                + ", ".join(cut["file"].head(5)) + (", ..." if len(cut) > 5 else "")
                if len(cut) else "")
        say(f"writing files table{' and events' if events else ''} "
            f"({len(records):,} records){note}")
        if events:
            write_table(staging.path, "events", records)
        files_pdf = tables.files_table(plan, list(trailers.itertuples()))
        write_table(staging.path, "files", files_pdf, tables.FILES_DDL)

        say("aggregating per-minute flow")
        ev = records.select(["server", "queue", "op", "size", "snapshot", "filler",
                             "event_ms"]).to_pandas()
        flow_pdf = tables.flow_table(ev)
        write_table(staging.path, "flow", flow_pdf, tables.FLOW_DDL)
        sizes_pdf = tables.size_bins(ev)
        del ev

        say("replaying queues (backlog, time in queue, expiry)")
        rin = tables.replay_input(scanned.drop_columns(["problem"]).to_pandas())
        del scanned, records
        parts = [tables.replay_frame(g) for _, g in rin.groupby(["server", "queue"], sort=True)]
        rep = (pd.concat(parts, ignore_index=True) if parts
               else pd.DataFrame(columns=tables.columns(tables.REPLAY_DDL)))
        backlog_pdf = rep[rep["kind"] == "backlog"][tables.columns(tables.BACKLOG_DDL)]
        write_table(staging.path, "backlog", backlog_pdf, tables.BACKLOG_DDL)
        queue_rows = rep[rep["kind"] == "queue"].reset_index(drop=True)
        tiq, expiry = tables.queue_tables(queue_rows)
        write_table(staging.path, "time_in_queue", tiq, tables.TIQ_DDL)
        write_table(staging.path, "expiry", expiry, tables.EXPIRY_DDL)
        return finish(say, None, staging, inputs, archives, plan, files_pdf, flow_pdf,
                      queue_rows, backlog_pdf, sizes_pdf, report)
    except BaseException:
        staging.abandon()
        raise
