"""Where a Spark JVM's task threads spend their time, from thread dumps.

``benchmarks/jprof.sh PID N OUT`` takes ``N`` thread dumps of a JVM (``jcmd PID
Thread.print``, 1 s apart), the executors' task threads only, each thread's stack after a
``----`` line; ``kappaflow-bench profile-classify OUT`` attributes each sample on CPU
(``RUNNABLE``) to the first frame from its top that a rule recognises, and counts the
samples waiting apart. The result folders' profiles were classified so.
"""

from __future__ import annotations

from collections import Counter

#: What a frame names, by the words that recognise it; the first rule to match a frame wins.
RULES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("kafka fetch (consumer I/O)", ("KafkaDataConsumer", "InternalKafkaConsumer")),
    ("kafka produce (task writer)", ("io.kappaflow.engine.KafkaOutput",)),
    ("redis write (task)", ("io.kappaflow.engine.RedisOutput",)),
    (
        "window operator (TWS processor)",
        (
            "io.kappaflow.engine.Windows",
            "io.kappaflow.engine.Aggregates",
            "io.kappaflow.engine.Sessions",
        ),
    ),
    ("state store (RocksDB)", ("rocksdb", "RocksDB", "StateStore")),
    ("JSON parse (from_json)", ("JacksonParser", "jackson")),
    ("variant checks", ("variant", "Variant")),
    (
        "sort (shuffle/TWS input)",
        (
            "TimSort",
            "UnsafeExternalSorter",
            "UnsafeInMemorySorter",
            "SortExec",
            "ShuffleExternalSorter",
        ),
    ),
    ("shuffle write", ("ShuffleWriter", "ShuffleWrite", "DiskBlockObjectWriter")),
    ("shuffle read", ("ShuffleBlockFetcherIterator", "BlockStoreShuffleReader")),
    (
        "row (de)serialization (typed groupByKey)",
        ("ExpressionEncoder", "Deserializer", "GenericRow", "CatalystTypeConverters"),
    ),
    ("persist (cache) of batch rows", ("InMemoryRelation", "MemoryStore", "CachedBatch")),
    ("generated code (project/filter/explode)", ("GeneratedClass", "GenerateExec")),
)
WAITING = "(waiting)"
OTHER = "other"


def label(sample: str) -> str:
    """What one thread's stack was doing: ``WAITING`` unless it was on CPU, else the first
    rule that recognises a frame from the top, else ``OTHER``."""
    if "State: RUNNABLE" not in sample:
        return WAITING
    for line in sample.split("\n"):
        hit = next((name for name, words in RULES if any(w in line for w in words)), None)
        if hit is not None:
            return hit
    return OTHER


def classify(dumps: str) -> Counter[str]:
    """The samples of ``jprof.sh``'s output counted by ``label``."""
    return Counter(label(sample) for sample in dumps.split("----")[1:])


def report(counts: Counter[str]) -> list[str]:
    """Each label's samples and share, most first, then the total."""
    total = sum(counts.values())
    lines = [f"{n:5d} {100 * n / total:5.1f}%  {name}" for name, n in counts.most_common()]
    return [*lines, f"samples {total}"]
