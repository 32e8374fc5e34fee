import sys, collections
RULES = [
 ("kafka fetch (consumer I/O)", ["KafkaDataConsumer", "InternalKafkaConsumer"]),
 ("kafka produce (task writer)", ["io.kappaflow.engine.KafkaOutput"]),
 ("redis write (task)", ["io.kappaflow.engine.RedisOutput"]),
 ("window operator (TWS processor)", ["io.kappaflow.engine.Windows", "io.kappaflow.engine.Aggregates", "io.kappaflow.engine.Sessions"]),
 ("state store (RocksDB)", ["rocksdb", "RocksDB", "StateStore"]),
 ("JSON parse (from_json)", ["JacksonParser", "jackson"]),
 ("variant checks", ["variant", "Variant"]),
 ("sort (shuffle/TWS input)", ["TimSort", "UnsafeExternalSorter", "UnsafeInMemorySorter", "SortExec", "ShuffleExternalSorter"]),
 ("shuffle write", ["ShuffleWriter", "ShuffleWrite", "DiskBlockObjectWriter"]),
 ("shuffle read", ["ShuffleBlockFetcherIterator", "BlockStoreShuffleReader"]),
 ("row (de)serialization (typed groupByKey)", ["ExpressionEncoder", "Deserializer", "GenericRow", "CatalystTypeConverters"]),
 ("persist (cache) of batch rows", ["InMemoryRelation", "MemoryStore", "CachedBatch"]),
 ("generated code (project/filter/explode)", ["GeneratedClass", "GenerateExec"]),
]
samples = open(sys.argv[1]).read().split("----")[1:]
c = collections.Counter(); runnable = 0
for s in samples:
    if "State: RUNNABLE" not in s: c["(waiting)"] += 1; continue
    if "EPoll.wait" in s.split("\n")[2] or "socketRead" in s.split("\n")[2]:
        pass
    runnable += 1
    top = s.split("\n")[:9]
    label = "other"
    # attribute by deepest-known frame nearest the top
    lines = s.split("\n")
    for line in lines:
        hit = next((name for name, keys in RULES if any(k in line for k in keys)), None)
        if hit: label = hit; break
    c[label] += 1
tot = sum(c.values())
for k, v in c.most_common(): print(f"{v:5d} {100*v/tot:5.1f}%  {k}")
print("samples", tot)
