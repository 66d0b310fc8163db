"""
Reading journal files into a Spark DataFrame, decoded on the executors.

Two readers produce the same rows (L{kestrel.analytics.scan.SCHEMA}):

- L{KestrelJournalSource}, a Spark 4 Python Data Source (format
  C{kestrel_journal}): the driver bin-packs the planned files into partitions,
  each executor task opens its files (memory-mapped when local) and yields one
  Arrow batch per file. Fastest; executors must see the paths (local or shared
  file system).
- L{read_binary_files}: Spark's C{binaryFile} source plus C{mapInArrow}; it
  reads through any Hadoop file system (HDFS, S3, ...), but a file must be
  under 2 GiB and is never split.
"""

from __future__ import annotations

import json
from collections.abc import Iterator, Sequence
from typing import TYPE_CHECKING

import pyarrow as pa

from kestrel.analytics.layout import JournalFile
from kestrel.analytics.scan import SPARK_DDL, read_local, scan_file

if TYPE_CHECKING:
    from pyspark.sql import DataFrame, SparkSession

from pyspark.sql.datasource import DataSource, DataSourceReader, InputPartition

#: The name to use with C{spark.read.format}.
FORMAT = "kestrel_journal"


def pack_partitions(files: Sequence[JournalFile], count: int) -> list[list[JournalFile]]:
    """
    Split C{files} into at most C{count} non-empty groups of similar byte size.

    Largest file first, each into the lightest group (greedy bin packing).
    """
    count = max(1, min(count, len(files)))
    bins: list[list[JournalFile]] = [[] for _ in range(count)]
    loads = [0] * count
    for jf in sorted(files, key=lambda f: (-f.size, f.path)):
        i = loads.index(min(loads))
        bins[i].append(jf)
        loads[i] += jf.size + 1
    return [b for b in bins if b]


class JournalPartition(InputPartition):
    """One read task: the files it scans, as JSON-able dicts."""

    def __init__(self, files: list[dict[str, object]]) -> None:
        super().__init__(files)


class KestrelJournalSource(DataSource):
    """
    The C{kestrel_journal} data source.

    Options: C{plan}, the JSON list of L{JournalFile.to_dict} to read, and
    C{partitions}, how many read tasks to make at most.
    """

    @classmethod
    def name(cls) -> str:
        """Return the format name, L{FORMAT}."""
        return FORMAT

    def schema(self) -> str:
        """Return the row schema (L{kestrel.analytics.scan.SPARK_DDL})."""
        return SPARK_DDL

    def reader(self, schema: object) -> KestrelJournalReader:
        """Return a reader over the planned files."""
        return KestrelJournalReader(json.loads(self.options["plan"]),
                                    int(self.options.get("partitions", "8")))


class KestrelJournalReader(DataSourceReader):
    """Reads planned local files, one Arrow batch per file."""

    def __init__(self, files: list[dict[str, object]], partitions: int) -> None:
        self.files = files
        self.count = partitions

    def partitions(self) -> Sequence[InputPartition]:
        """Return the read tasks: the files bin-packed by size."""
        files = [JournalFile.from_dict(d) for d in self.files]
        if not files:
            return [JournalPartition([])]
        return [JournalPartition([f.to_dict() for f in group])
                for group in pack_partitions(files, self.count)]

    def read(self, partition: InputPartition) -> Iterator[pa.RecordBatch]:
        """Scan every file of C{partition}."""
        for d in partition.value:
            yield read_local(JournalFile.from_dict(d))


def read_journal_source(spark: SparkSession, files: Sequence[JournalFile],
                        partitions: int) -> DataFrame:
    """Return the scanned rows of local C{files}, read by L{KestrelJournalSource}."""
    spark.dataSource.register(KestrelJournalSource)
    plan = json.dumps([f.to_dict() for f in files])
    return (spark.read.format(FORMAT).option("plan", plan)
            .option("partitions", str(partitions)).load())


def read_binary_files(spark: SparkSession, files: Sequence[JournalFile]) -> DataFrame:
    """
    Return the scanned rows of C{files}, read by C{binaryFile} + C{mapInArrow}.

    The files' C{path} must be the exact URI that C{binaryFile} reports
    (as L{list_with_spark} gives). Each Arrow batch should hold few files:
    keep C{spark.sql.execution.arrow.maxRecordsPerBatch} small while the
    rows are computed (L{kestrel.analytics.job.run} does).
    """
    by_path = {f.path: f for f in files}

    def scan_batches(batches: Iterator[pa.RecordBatch]) -> Iterator[pa.RecordBatch]:
        for batch in batches:
            paths = batch.column("path").to_pylist()
            contents = batch.column("content")
            for i, path in enumerate(paths):
                data = contents[i].as_buffer()
                yield scan_file(by_path[path], memoryview(data) if data is not None else b"")

    # binaryFile yields no row for an empty file: scan those here (no bytes to read)
    empty = [scan_file(f, b"") for f in files if f.size == 0]
    df = None
    if empty:
        df = spark.createDataFrame(pa.Table.from_batches(empty).to_pandas(), SPARK_DDL)
    full = [f.path for f in files if f.size > 0]
    if full:
        raw = spark.read.format("binaryFile").load(full)
        scanned = raw.select("path", "content").mapInArrow(scan_batches, SPARK_DDL)
        df = scanned if df is None else df.unionByName(scanned)
    return df if df is not None else spark.createDataFrame([], SPARK_DDL)


def list_with_spark(spark: SparkSession, folder: str) -> list[tuple[str, str, int, int]]:
    """
    List the regular files directly inside C{folder} (any Hadoop URI) with Hadoop's API.

    @return: C{(name, uri, size, mtime_ms)} per file, C{uri} spelled as
        C{binaryFile} reports it.
    @raise LayoutError: the folder does not exist.
    """
    from kestrel.analytics.layout import LayoutError

    sc = spark.sparkContext
    jvm = sc._jvm  # noqa: SLF001 - Hadoop's FileSystem is only reachable through the JVM
    assert jvm is not None  # (a started SparkContext has its JVM gateway)
    path = jvm.org.apache.hadoop.fs.Path(folder)
    fs = path.getFileSystem(sc._jsc.hadoopConfiguration())  # noqa: SLF001
    if not fs.exists(path) or not fs.getFileStatus(path).isDirectory():
        raise LayoutError(f"input folder {folder!r} does not exist or is not a folder")
    found = []
    for status in fs.listStatus(path):
        if status.isFile():
            uri = status.getPath().toString()
            found.append((status.getPath().getName(), uri, int(status.getLen()),
                          int(status.getModificationTime())))
    return found
