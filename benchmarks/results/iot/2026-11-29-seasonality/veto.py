"""Dev only: the likelihood scorer with a seasonal veto (an alarm is held under the alert score
where the reading is usual against the same time a day or a week before), by NAB."""
import json, math, sys, numpy as np
from pathlib import Path
from kappaflow.iot.evaluation import read_series, corpus, parse_time, rounds
from kappaflow.iot.models import MODELS, ALERT_SCORE, Scorer
from kappaflow.iot.models import scoring
from kappaflow.iot.nab import score_series, Report
Z=float(sys.argv[1]); MIN_PERIODS=int(sys.argv[2])
def run(s, veto):
    m=MODELS["likelihood"]; tr=m.trainer(); sc=Scorer(m); params=None; out=[]
    t=[parse_time(x).timestamp() for x in s.timestamps]; x=s.values
    where={tt:i for i,tt in enumerate(t)}
    diffs={86400:[],7*86400:[]}
    for r in rounds(len(x),512):
        for i in r:
            v=x[i]
            if math.isnan(v): out.append(0.0); continue
            quiet=sc._quiet
            score=sc.score(v, params)
            usual=False
            for P,d in diffs.items():
                j=where.get(t[i]-P)
                if j is None or math.isnan(x[j]): continue
                dd=v-x[j]
                if veto and score>=ALERT_SCORE and quiet==0 and (t[i]-t[0])>=MIN_PERIODS*P and len(d)>50:
                    arr=np.array(d[-2000:]); med=np.median(arr); mad=np.median(np.abs(arr-med))*1.4826+1e-12
                    # the season explains the reading, and explains the series better than its recent level
                    if abs(dd-med)/mad < Z: usual=True
                d.append(dd)
            if usual:
                score=min(score, scoring.MUTED); sc._quiet=0
            out.append(score)
        params=tr.learn(x[r.start:r.stop])
    return out
for veto in (False, True):
    rep=Report()
    for p in corpus(Path("data/anomaly/dev")):
        s=read_series(p); rep.add(score_series(run(s,veto), s.labels, ALERT_SCORE))
    print("veto" if veto else "none", Z, MIN_PERIODS, json.dumps(rep.to_json()))
