import json
from collections import Counter
from kappaflow.settings import load_settings
from kappaflow.kafka.records import StartAt, read_records
s = load_settings()
c = Counter()
for r in read_records(s.kafka, "alerts-rt", start=StartAt(beginning=True)):
    v = json.loads(r.value()); c[(v["rule"], v["status"])] += 1
print(c)
