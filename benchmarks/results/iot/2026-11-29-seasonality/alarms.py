# Dev set only: every alarm of the likelihood model at the alert score, TP or FP, with the
# reading's robust z against the same time a day and a week before (where the sampling
# and the series' length show one), from its own earlier lag differences.
import csv, numpy as np
from pathlib import Path
from kappaflow.iot.evaluation import read_series, replay, corpus, parse_time
from kappaflow.iot.models import MODELS, ALERT_SCORE
from kappaflow.iot.nab import windows
man={r["file"]:r for r in csv.DictReader(open("data/anomaly/dev/manifest.tsv"),delimiter="\t")}
for p in corpus(Path("data/anomaly/dev")):
    s=read_series(p); sc=replay(s.values, MODELS["likelihood"], 512)
    w=windows(s.labels); t=np.array([parse_time(x).timestamp() for x in s.timestamps]); x=np.array(s.values)
    step=np.median(np.diff(t))
    alarms=[i for i,v in enumerate(sc) if v>=ALERT_SCORE]
    for a in alarms:
        tp=any(l<=a<=r for l,r in w)
        info=[]
        for P in (86400, 7*86400):
            j=np.searchsorted(t, t[a]-P)
            if j< len(t) and abs(t[j]-(t[a]-P))<step/2 and t[a]-P>=t[0]:
                # seasonal diff vs typical seasonal diffs before a
                idx=np.searchsorted(t, t[:a]-P); ok=(idx<a)&(idx>=0)
                lag=np.array([x[i]-x[k] for i,k in zip(range(a),idx) if k< len(t) and abs(t[k]-(t[i]-P))<step/2 and t[i]-P>=t[0]])
                if len(lag)>20:
                    mad=np.median(np.abs(lag-np.median(lag)))*1.4826+1e-12
                    info.append(f"P{P//86400}d z={(x[a]-x[j]-np.median(lag))/mad:.1f} n={len(lag)}")
        print(p.name, man[p.name]["shape"], a, "TP" if tp else "FP", round(sc[a],2), info)
