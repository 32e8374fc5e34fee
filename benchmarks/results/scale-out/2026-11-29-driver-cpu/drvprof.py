"""Throwaway: profile the driver of one scale-out run (passthrough or counts)."""
import os, sys, time, uuid, subprocess, json
from pathlib import Path
import psutil
from kappaflow import services as svc
from kappaflow.settings import load_settings, SettingsOverrides
from kappaflow.jobs.manager import ACTIVE_STATES, JobManager
from kappaflow.kafka.topics import create_topic
from kappaflow.spark.standalone import StandaloneCluster
from kappaflow.waiting import wait_for
from kappaflow_bench.api import _accounted, _forget_app
from kappaflow_bench.count import produce_backlog
from kappaflow_bench.scale_out import JOBS, _DriverSampler

job = sys.argv[1]; events = int(sys.argv[2]); workers = int(sys.argv[3]); tag = sys.argv[4]
topic = sys.argv[5] if len(sys.argv) > 5 else None
out = Path("/tmp/kf-scale/prof") / tag; out.mkdir(parents=True, exist_ok=True)
settings = load_settings(state_dir=Path("/tmp/kf-scale/state"), jars_dir=Path("/work/wt-scale/.kappaflow/jars"))
def threads(pid):
    tick = os.sysconf("SC_CLK_TCK"); res = {}
    for t in Path(f"/proc/{pid}/task").iterdir():
        try:
            name = (t / "comm").read_text().strip()
            f = (t / "stat").read_text().rsplit(")", 1)[1].split()
            cpu = (int(f[11]) + int(f[12])) / tick
        except OSError:
            continue
        key = name.rstrip("0123456789")
        res[key] = res.get(key, 0) + cpu
    return dict(sorted(res.items(), key=lambda kv: -kv[1]))
with svc.embedded_services(settings, print):
    if topic is None:
        topic = f"bench.scale.{uuid.uuid4().hex[:6]}"
        create_topic(settings.kafka, topic, partitions=4)
        print("produce", produce_backlog(settings, topic, events, 10_000))
        print("TOPIC", topic, flush=True)
    cluster = StandaloneCluster(settings)
    cluster.stop(); cluster.start(workers, cores=1, memory="2g")
    try:
        app, output = JOBS[job]
        jfr = out / "driver.jfr"
        ov = SettingsOverrides(spark_master=cluster.master_url, spark_conf={
            "spark.cores.max": str(workers), "spark.executor.memory": "2g",
            "spark.driver.extraJavaOptions": f"-XX:StartFlightRecording=filename={jfr},settings=profile,dumponexit=true"},
            state_dir=Path("/tmp/kf-scale/state"))
        name = f"prof-{uuid.uuid4().hex[:6]}"
        jobs = JobManager(settings)
        t0 = time.perf_counter()
        rec = jobs.start(name, app, {"topic": topic}, overrides=ov)
        t_started = time.perf_counter() - t0
        sampler = _DriverSampler(rec.pid)
        spy = subprocess.Popen(["/work/wt-scale/.venv/bin/py-spy", "record", "--nonblocking", "-r", "50", "-p", str(rec.pid), "-f", "raw", "-o", str(out / "pyspy.txt")], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        started = time.perf_counter()
        def done():
            sampler.sample()
            return True if _accounted(settings, name, output) >= events else None
        wait_for(done, timeout=3600, interval=0.5, what="accounted")
        secs = time.perf_counter() - started
        sampler.sample()
        jvm = [p for p in psutil.Process(rec.pid).children(recursive=True) if "java" in p.name()]
        th = threads(jvm[0].pid) if jvm else {}
        py = psutil.Process(rec.pid).cpu_times()
        subprocess.run(["jcmd", str(jvm[0].pid), "JFR.dump", f"filename={jfr}"], capture_output=True)
        spy.send_signal(2); spy.wait(30)
        summary = {"job": job, "workers": workers, "seconds": secs, "start_call_s": t_started, "rate": events/secs,
                   "driver_cpu_s": sum(sampler.cpu.values()), "peak_mb": sampler.peak_rss/2**20,
                   "python_cpu_s": py.user + py.system, "jvm_threads": th}
        print(json.dumps(summary, indent=1))
        (out / "summary.json").write_text(json.dumps(summary, indent=1))
        (out / "driver.log").write_text("\n".join(jobs.log_lines(name, 2000)))
    finally:
        if jobs.get_state(name) in ACTIVE_STATES:
            jobs.stop(name)
        _forget_app(settings, name, output)
        cluster.stop()
