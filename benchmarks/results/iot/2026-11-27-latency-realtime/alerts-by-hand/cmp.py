import json, os
from collections import defaultdict
from kappaflow.settings import load_settings
from kappaflow.kafka.records import StartAt, read_records
s = load_settings()
def load(topic):
    out = {}
    for r in read_records(s.kafka, topic, start=StartAt(beginning=True)):
        v = json.loads(r.value())
        out[v["id"]] = v
    return out
b, rt = load("scores"), load("scores-rt")
common = set(b) & set(rt)
print("batch", len(b), "rt", len(rt), "common", len(common))
same = sum(1 for i in common if abs(b[i]["score"] - rt[i]["score"]) < 1e-6)
print("same score", same)
for name, d in (("batch", b), ("rt", rt)):
    high = sum(1 for v in d.values() if v["score"] >= 0.5)
    nomodel = sum(1 for v in d.values() if v["model_version"] is None)
    keys = defaultdict(list)
    for v in d.values(): keys[(v["device"], v["metric"])].append(v)
    runs = 0
    for vs in keys.values():
        vs.sort(key=lambda v: v["time"]); n = 0
        for v in vs:
            n = n + 1 if v["score"] >= 0.5 else 0
            if n == 3: runs += 1
    print(name, "high", high, "no model", nomodel, "3-in-a-row", runs)
diff = [i for i in common if abs(b[i]["score"] - rt[i]["score"]) >= 1e-6]
import itertools
for i in diff[:5]: print(b[i]["score"], b[i]["model_version"], rt[i]["score"], rt[i]["model_version"], b[i]["value"], rt[i]["value"])
from kappaflow.iot.alerts import Watch, Scored, _again
for name, d in (("batch", b), ("rt", rt)):
    keys = defaultdict(list)
    for v in d.values(): keys[(v["device"], v["metric"])].append(v)
    dropped = 0; runs = 0
    for vs in keys.values():
        vs.sort(key=lambda v: v["time"]); w = Watch(); n = 0
        first = min(v["seq"] for v in vs)
        for v in vs:
            e = Scored(v["device"], v["metric"], v["value"], v["time"], v["id"], v["score"], v["run"], v["seq"])
            if _again(w, e, first): dropped += 1; continue
            n = n + 1 if v["score"] >= 0.5 else 0
            if n == 3: runs += 1
    print(name, "dropped", dropped, "runs", runs)
    vs = next(iter(keys.values()))
    print([ (v["seq"], v["time"][11:23]) for v in vs[:8]])
