"""What a latency run's topics hold: scores, those at or above 0.5, runs of three, alerts."""
import json, sys, collections
from kappaflow.settings import load_settings
from kappaflow.kafka.records import StartAt, read_records
s = load_settings()
prefix = sys.argv[1]
scores = [json.loads(r.value()) for r in read_records(s.kafka, prefix + "scores", start=StartAt(beginning=True))]
print("scores", len(scores), "with model", sum(1 for x in scores if x.get("model_version") is not None))
hi = [x for x in scores if x["score"] >= 0.5]
print("high", len(hi), "high with model", sum(1 for x in hi if x.get("model_version") is not None))
by = collections.defaultdict(list)
for x in scores: by[(x["device"], x["metric"])].append(x)
runs = 0; keys_runs=0
for k, xs in by.items():
    xs.sort(key=lambda x: (x["run"], x["seq"]))
    h = 0; got=False
    for x in xs:
        h = h + 1 if x["score"] >= 0.5 else 0
        if h == 3: runs += 1; got=True
    keys_runs += got
print("3-in-a-row", runs, "keys", keys_runs, "keys total", len(by))
print("runs per key", collections.Counter(len({x["run"] for x in xs}) for xs in by.values()))
import statistics
print("score quantiles", statistics.quantiles([x["score"] for x in scores], n=20))
alerts = [json.loads(r.value()) for r in read_records(s.kafka, prefix + "alerts", start=StartAt(beginning=True))]
print("alerts", collections.Counter((a["rule"], a["status"]) for a in alerts))
print(scores[-1])
