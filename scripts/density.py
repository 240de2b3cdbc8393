#!/usr/bin/env python3
"""KubeVirt's density benchmark on this project's node; run by scripts/density.sh.

Creates N VMIs 100 ms apart in a fresh namespace (v1.9.0 `tests/performance/density.go`), waits
until all are Running (5 minutes at most), measures, deletes them all and waits until nothing is
left. Times are taken by this program from watch events (millisecond resolution), besides the
VMIs' own `status.phaseTransitionTimestamps` (whole seconds). Prints a table and, last, one line:

    density: <running>/<N> Running, p50 <s> s, p95 <s> s, max <s> s, ...

Only the Python standard library: the API is spoken over HTTPS with the cluster's admin token.
"""

import argparse
import http.client
import json
import math
import os
import re
import ssl
import statistics
import sys
import threading
import time
import urllib.parse
from datetime import datetime

NAMESPACE = "density"
LAUNCHER_LABEL = "kubevirt.io=virt-launcher"
RUNNING_TIMEOUT = 300
CLEANUP_TIMEOUT = 300
CGROUP_PODS = "/sys/fs/cgroup/memory/kubevirt-rs/kubepods"
SAMPLE_SECONDS = 0.5


def log(message):
    print(f"density [{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


class Api:
    """Requests to the API server with a bearer token; one connection per thread."""

    def __init__(self, server, token, ca):
        url = urllib.parse.urlsplit(server)
        self.host, self.port = url.hostname, url.port or 443
        self.token = token
        self.context = ssl.create_default_context(cafile=ca)
        self.local = threading.local()

    def connection(self, timeout=30):
        return http.client.HTTPSConnection(self.host, self.port, context=self.context, timeout=timeout)

    def request(self, method, path, body=None, accept="application/json"):
        headers = {"Authorization": f"Bearer {self.token}", "Accept": accept}
        data = None
        if body is not None:
            data = json.dumps(body).encode()
            headers["Content-Type"] = "application/json"
        # A kept-alive connection the server closed while idle fails at once: one retry on a
        # fresh connection.
        for attempt in (1, 2):
            conn = getattr(self.local, "conn", None)
            if conn is None:
                conn = self.local.conn = self.connection()
            try:
                conn.request(method, path, body=data, headers=headers)
                response = conn.getresponse()
                payload = response.read()
                break
            except (http.client.HTTPException, OSError):
                conn.close()
                self.local.conn = None
                if attempt == 2:
                    raise
        if response.status >= 300 and not (method == "DELETE" and response.status == 404):
            raise RuntimeError(f"{method} {path}: {response.status} {payload[:300]!r}")
        if accept == "application/json" and payload:
            return json.loads(payload)
        return payload.decode()

    def watch(self, path, resource_version, on_event, stop):
        """Streams watch events of `path` to on_event(type, object, seconds) until stop is set."""
        while not stop.is_set():
            conn = self.connection(timeout=60)
            query = (f"?watch=1&allowWatchBookmarks=true&timeoutSeconds=30"
                     f"&resourceVersion={resource_version}")
            try:
                conn.request("GET", path + query, headers={"Authorization": f"Bearer {self.token}"})
                response = conn.getresponse()
                buffer = b""
                while not stop.is_set():
                    chunk = response.read1(65536)
                    if not chunk:
                        break
                    buffer += chunk
                    while b"\n" in buffer:
                        line, buffer = buffer.split(b"\n", 1)
                        if not line.strip():
                            continue
                        event = json.loads(line)
                        obj = event.get("object", {})
                        version = obj.get("metadata", {}).get("resourceVersion")
                        if version:
                            resource_version = version
                        if event.get("type") in ("ADDED", "MODIFIED", "DELETED"):
                            on_event(event["type"], obj, time.time())
            except (http.client.HTTPException, OSError, json.JSONDecodeError):
                time.sleep(0.2)
            finally:
                conn.close()


def vmi_manifest(index, shape, image):
    """KubeVirt's perf-scale VMI: 90Mi requested and limited (and, in its shape, 100m CPU
    requested and limited), masquerade on the pod network; the project's disk image in place
    of cirros, booted from the disk."""
    resources = {"requests": {"memory": "90Mi"}, "limits": {"memory": "90Mi"}}
    if shape == "kubevirt":
        resources["requests"]["cpu"] = "100m"
        resources["limits"]["cpu"] = "100m"
    return {
        "apiVersion": "kubevirt.io/v1",
        "kind": "VirtualMachineInstance",
        "metadata": {"name": f"density-{index:03d}", "namespace": NAMESPACE,
                     "labels": {"density": "true"}},
        "spec": {
            "terminationGracePeriodSeconds": 0,
            "domain": {
                "resources": resources,
                "devices": {
                    "disks": [{"name": "rootdisk", "disk": {"bus": "virtio"}}],
                    "interfaces": [{"name": "default", "masquerade": {}}],
                },
            },
            "networks": [{"name": "default", "pod": {}}],
            "volumes": [{"name": "rootdisk", "containerDisk": {
                "image": image, "imagePullPolicy": "IfNotPresent"}}],
        },
    }


def parse_time(text):
    return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()


def request_counts(api):
    """apiserver_request_total summed by (verb, resource, subresource)."""
    counts = {}
    pattern = re.compile(r'^apiserver_request_total\{([^}]*)\} ([0-9.e+]+)$')
    for line in api.request("GET", "/metrics", accept="text/plain").splitlines():
        match = pattern.match(line)
        if not match:
            continue
        labels = dict(re.findall(r'(\w+)="([^"]*)"', match.group(1)))
        key = (labels.get("verb", ""), labels.get("resource", ""), labels.get("subresource", ""))
        counts[key] = counts.get(key, 0) + float(match.group(2))
    return counts


def processes_named(*names):
    found = []
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/comm") as f:
                comm = f.read().strip()
        except OSError:
            continue
        if comm in names:
            found.append((int(pid), comm))
    return found


def cpu_seconds(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return None


def cpu_by_process():
    """CPU seconds (own and reaped children's) of every process, by PID: (comm, seconds)."""
    table = {}
    tick = os.sysconf("SC_CLK_TCK")
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        try:
            with open(f"/proc/{pid}/stat") as f:
                text = f.read()
        except OSError:
            continue
        comm = text[text.index("(") + 1:text.rindex(")")]
        fields = text.rsplit(")", 1)[1].split()
        table[int(pid)] = (comm, sum(int(v) for v in fields[11:15]) / tick)
    return table


def node_busy_seconds():
    """CPU seconds the node spent not idle, all CPUs, from /proc/stat."""
    with open("/proc/stat") as f:
        fields = [int(v) for v in f.readline().split()[1:]]
    idle = fields[3] + fields[4]
    return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")


def cpu_delta(before, after):
    """CPU seconds by command name between two cpu_by_process() tables."""
    by_comm = {}
    for pid, (comm, seconds) in after.items():
        start = before.get(pid)
        used = seconds - (start[1] if start and start[0] == comm else 0)
        by_comm[comm] = by_comm.get(comm, 0) + used
    return by_comm


def status_kib(pid, key):
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith(key + ":"):
                    return int(line.split()[1])
    except OSError:
        pass
    return None


def smaps_kib(pid):
    rss = pss = 0
    try:
        with open(f"/proc/{pid}/smaps_rollup") as f:
            for line in f:
                if line.startswith("Rss:"):
                    rss = int(line.split()[1])
                elif line.startswith("Pss:"):
                    pss = int(line.split()[1])
    except OSError:
        pass
    return rss, pss


def mem_available_kib():
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1])
    return 0


def pod_cgroups(uid):
    """The memory cgroup directory of the pod with this UID, if there is one."""
    for qos in ("", "burstable", "besteffort"):
        path = os.path.join(CGROUP_PODS, qos, f"pod{uid}")
        if os.path.isdir(path):
            return path
    return None


def pod_memory(uid):
    """RSS and PSS of every process of the pod, in KiB."""
    path = pod_cgroups(uid)
    rss = pss = 0
    if path is None:
        return None
    for container in os.listdir(path):
        procs = os.path.join(path, container, "cgroup.procs")
        if not os.path.isfile(procs):
            continue
        with open(procs) as f:
            for pid in f.read().split():
                r, p = smaps_kib(pid)
                rss += r
                pss += p
    return rss, pss


class Sampler(threading.Thread):
    """CPU seconds and peak RSS of virt-controller and virt-handler during the run."""

    def __init__(self):
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.first_cpu = {}
        self.last_cpu = {}
        self.peak_rss = {}
        self.comm = {}

    def run(self):
        while not self.stop.is_set():
            for pid, comm in processes_named("virt-controller", "virt-handler"):
                cpu = cpu_seconds(pid)
                rss = status_kib(pid, "VmRSS")
                if cpu is None or rss is None:
                    continue
                self.comm[pid] = comm
                self.first_cpu.setdefault(pid, cpu)
                self.last_cpu[pid] = cpu
                self.peak_rss[pid] = max(self.peak_rss.get(pid, 0), rss)
            self.stop.wait(SAMPLE_SECONDS)

    def summary(self, comm):
        pids = [p for p, c in self.comm.items() if c == comm]
        cpu = sum(self.last_cpu[p] - self.first_cpu[p] for p in pids)
        rss = max((self.peak_rss[p] for p in pids), default=0)
        return cpu, rss, len(pids)


def percentile(values, fraction):
    """Nearest-rank percentile: the smallest value with `fraction` of the values at or below."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    index = max(0, min(len(ordered) - 1, math.ceil(fraction * len(ordered)) - 1))
    return ordered[index]


def leftovers(uids):
    """What is left of the deleted VMIs' pods on the node."""
    left = []
    launchers = processes_named("virt-launcher", "virt-launcher-m", "virt-tail")
    if launchers:
        left.append(f"{len(launchers)} launcher processes")
    cgroups = [u for u in uids if pod_cgroups(u)]
    if cgroups:
        left.append(f"{len(cgroups)} pod cgroups")
    with open("/proc/mounts") as f:
        mounts = [line for line in f if any(u in line for u in uids)]
    if mounts:
        left.append(f"{len(mounts)} mounts")
    return left


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--server", required=True)
    parser.add_argument("--token", required=True)
    parser.add_argument("--ca", required=True)
    parser.add_argument("--count", type=int, required=True)
    parser.add_argument("--shape", choices=["kubevirt", "density"], required=True)
    parser.add_argument("--image", required=True)
    parser.add_argument("--json", help="write the measurements here")
    args = parser.parse_args()
    api = Api(args.server, args.token, args.ca)
    n = args.count

    vmis_path = f"/apis/kubevirt.io/v1/namespaces/{NAMESPACE}/virtualmachineinstances"
    pods_path = f"/api/v1/namespaces/{NAMESPACE}/pods"
    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")
    deadline = time.time() + CLEANUP_TIMEOUT
    while True:
        try:
            api.request("GET", f"/api/v1/namespaces/{NAMESPACE}")
        except RuntimeError:
            break
        if time.time() > deadline:
            sys.exit(f"namespace {NAMESPACE} from an earlier run is still being deleted")
        time.sleep(1)
    api.request("POST", "/api/v1/namespaces", {"metadata": {"name": NAMESPACE}})
    # The namespace's default ServiceAccount, which pods need, comes a moment later.
    while True:
        try:
            api.request("GET", f"/api/v1/namespaces/{NAMESPACE}/serviceaccounts/default")
            break
        except RuntimeError:
            time.sleep(0.2)

    # Every event's arrival, by object name: the first time each milestone is seen.
    lock = threading.Lock()
    vmi_seen = {}   # name -> {milestone: seconds}
    pod_seen = {}   # VMI name -> {milestone: seconds}
    vmi_objects = {}
    pod_uids = set()

    def first(table, name, milestone, when):
        table.setdefault(name, {}).setdefault(milestone, when)

    def on_vmi(kind, obj, when):
        name = obj["metadata"]["name"]
        with lock:
            if kind == "DELETED":
                first(vmi_seen, name, "Deleted", when)
                return
            vmi_objects[name] = obj
            phase = obj.get("status", {}).get("phase")
            if phase:
                first(vmi_seen, name, phase, when)

    def on_pod(kind, obj, when):
        meta = obj["metadata"]
        owner = next((o["name"] for o in meta.get("ownerReferences", [])
                      if o.get("kind") == "VirtualMachineInstance"), None)
        if owner is None:
            return
        with lock:
            pod_uids.add(meta["uid"])
            if kind == "DELETED":
                first(pod_seen, owner, "Deleted", when)
                return
            first(pod_seen, owner, "Created", when)
            if obj.get("spec", {}).get("nodeName"):
                first(pod_seen, owner, "Bound", when)
            conditions = {c["type"]: c["status"] for c in obj.get("status", {}).get("conditions", [])}
            if conditions.get("PodReadyToStartContainers") == "True":
                first(pod_seen, owner, "SandboxReady", when)
            if obj.get("status", {}).get("phase") == "Running":
                first(pod_seen, owner, "Running", when)

    stop = threading.Event()
    watchers = []
    for path, handler in ((vmis_path, on_vmi), (pods_path, on_pod)):
        version = api.request("GET", path)["metadata"]["resourceVersion"]
        thread = threading.Thread(target=api.watch, args=(path, version, handler, stop), daemon=True)
        thread.start()
        watchers.append(thread)

    sampler = Sampler()
    sampler.start()
    before_requests = request_counts(api)
    available_before = mem_available_kib()
    cpu_before = cpu_by_process()
    busy_before = node_busy_seconds()

    log(f"creating {n} VMIs ({args.shape} shape) 100 ms apart")
    created = {}
    start = time.time()
    for i in range(n):
        target = start + i * 0.1
        delay = target - time.time()
        if delay > 0:
            time.sleep(delay)
        manifest = vmi_manifest(i, args.shape, args.image)
        created[manifest["metadata"]["name"]] = time.time()
        api.request("POST", vmis_path, manifest)

    log("waiting until every VMI is Running (300 s at most)")
    deadline = start + RUNNING_TIMEOUT
    while time.time() < deadline:
        with lock:
            running = sum(1 for name in created if "Running" in vmi_seen.get(name, {}))
        if running == n:
            break
        time.sleep(0.2)
    all_running_after = time.time() - start
    cpu_used = cpu_delta(cpu_before, cpu_by_process())
    busy = node_busy_seconds() - busy_before
    with lock:
        running_names = [name for name in created if "Running" in vmi_seen.get(name, {})]
    log(f"{len(running_names)}/{n} Running after {all_running_after:.1f} s")

    # Memory with every VMI up (give the guests a few seconds to boot first).
    time.sleep(5)
    available_running = mem_available_kib()
    with lock:
        uids = list(pod_uids)
    pods = [m for m in (pod_memory(u) for u in uids) if m]
    after_requests = request_counts(api)
    sampler.stop.set()
    sampler.join()

    # Creation to Running, as the watch saw it and as the VMI recorded it.
    watched = [vmi_seen[name]["Running"] - created[name] for name in running_names]
    recorded = []
    with lock:
        for name in running_names:
            status = vmi_objects[name].get("status", {})
            stamps = {t["phase"]: t["phaseTransitionTimestamp"]
                      for t in status.get("phaseTransitionTimestamps", [])}
            if "Running" in stamps:
                recorded.append(parse_time(stamps["Running"])
                                - parse_time(vmi_objects[name]["metadata"]["creationTimestamp"]))

    # Where the seconds go: consecutive milestones of each VMI and its pod.
    steps = [
        ("virt-controller: VMI created -> launcher pod created", lambda v, p: (v.get("Created"), p.get("Created"))),
        ("kube-scheduler: pod created -> bound to the node", lambda v, p: (p.get("Created"), p.get("Bound"))),
        ("kubelet: bound -> sandbox and CNI ready", lambda v, p: (p.get("Bound"), p.get("SandboxReady"))),
        ("kubelet: sandbox ready -> containers running", lambda v, p: (p.get("SandboxReady"), p.get("Running"))),
        ("virt-controller: pod running -> VMI Scheduled", lambda v, p: (p.get("Running"), v.get("Scheduled"))),
        ("virt-handler, launcher, VMM: Scheduled -> Running", lambda v, p: (v.get("Scheduled"), v.get("Running"))),
    ]
    timeline = []
    for label, span in steps:
        values = []
        for name in running_names:
            v = dict(vmi_seen.get(name, {}), Created=created[name])
            a, b = span(v, pod_seen.get(name, {}))
            if a is not None and b is not None:
                values.append(b - a)
        timeline.append((label, values))

    requests = {}
    for key, value in after_requests.items():
        delta = value - before_requests.get(key, 0)
        if delta > 0:
            requests[key] = int(round(delta))
    vmi_writes = sum(v for (verb, resource, _), v in requests.items()
                     if resource == "virtualmachineinstances" and verb in ("UPDATE", "PATCH"))

    controller_cpu, controller_rss, controllers = sampler.summary("virt-controller")
    handler_cpu, handler_rss, _ = sampler.summary("virt-handler")
    node_per_vmi = (available_before - available_running) / max(1, len(running_names)) / 1024
    pss_per_pod = statistics.mean(p for _, p in pods) / 1024 if pods else float("nan")
    rss_per_pod = statistics.mean(r for r, _ in pods) / 1024 if pods else float("nan")

    # Requested by each launcher pod (all its containers, as the scheduler counts them).
    requested = float("nan")
    pod_list = api.request("GET", pods_path)["items"]
    if pod_list:
        def mib(q):
            units = {"Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "k": 1e3, "M": 1e6, "G": 1e9}
            for suffix, factor in units.items():
                if q.endswith(suffix):
                    return float(q[: -len(suffix)]) * factor / (1 << 20)
            return float(q) / (1 << 20)
        spec = pod_list[0]["spec"]
        app = sum(mib(c.get("resources", {}).get("requests", {}).get("memory", "0"))
                  for c in spec["containers"])
        sidecars = sum(mib(c.get("resources", {}).get("requests", {}).get("memory", "0"))
                       for c in spec.get("initContainers", []) if c.get("restartPolicy") == "Always")
        requested = app + sidecars

    # Delete everything and time the clean-up.
    log("deleting every VMI; waiting until nothing is left")
    delete_start = time.time()
    api.request("DELETE", vmis_path)
    left = ["not checked"]
    while time.time() < delete_start + CLEANUP_TIMEOUT:
        vmis_left = len(api.request("GET", vmis_path)["items"])
        pods_left = len(api.request("GET", pods_path)["items"])
        left = ([f"{vmis_left} VMIs"] if vmis_left else []) + \
            ([f"{pods_left} pods"] if pods_left else []) + leftovers(uids)
        if not left:
            break
        time.sleep(0.5)
    cleanup = time.time() - delete_start
    stop.set()
    api.request("DELETE", f"/api/v1/namespaces/{NAMESPACE}")

    # The report.
    def s(v):
        return f"{v:.2f}" if v == v else "-"
    print(f"\nDensity benchmark: {n} VMIs, {args.shape} shape, created 100 ms apart\n")
    print("| Measure | Value |")
    print("|---|---|")
    print(f"| VMIs Running | {len(running_names)} of {n} (all Running {all_running_after:.1f} s after the first create) |")
    print(f"| creation -> Running, watched: p50 / p95 / max | {s(percentile(watched, .5))} / {s(percentile(watched, .95))} / {s(max(watched, default=float('nan')))} s |")
    print(f"| creation -> Running, phaseTransitionTimestamps (whole s): p50 / p95 / max | {s(percentile(recorded, .5))} / {s(percentile(recorded, .95))} / {s(max(recorded, default=float('nan')))} s |")
    print(f"| VMI UPDATE + PATCH per VMI | {vmi_writes / n:.2f} ({vmi_writes} in all) |")
    print(f"| virt-controller: CPU s ({controllers} replicas) / peak RSS | {controller_cpu:.1f} s / {controller_rss / 1024:.1f} MiB |")
    print(f"| virt-handler: CPU s / peak RSS | {handler_cpu:.1f} s / {handler_rss / 1024:.1f} MiB |")
    print(f"| node memory per VMI (MemAvailable drop / VMIs) | {node_per_vmi:.1f} MiB |")
    print(f"| launcher pod processes: RSS / PSS per VMI | {rss_per_pod:.1f} / {pss_per_pod:.1f} MiB |")
    print(f"| memory requested per launcher pod | {requested:.1f} MiB |")
    print(f"| delete all -> nothing left | {cleanup:.1f} s{'' if not left else ' (left: ' + ', '.join(left) + ')'} |")
    print("\nWhere the seconds go (per VMI, from watch events):\n")
    print("| Step | p50 s | p95 s | max s |")
    print("|---|---|---|---|")
    for label, values in timeline:
        print(f"| {label} | {s(percentile(values, .5))} | {s(percentile(values, .95))} | {s(max(values, default=float('nan')))} |")
    print(f"\nCPU from the first create until all Running ({all_running_after:.0f} s, "
          f"{os.cpu_count()} CPUs): node busy {busy:.0f} s; by process (own and reaped "
          f"children's; processes that ended and were not reaped by a survivor are missing):\n")
    print("| Process | CPU s |")
    print("|---|---|")
    for comm, seconds in sorted(cpu_used.items(), key=lambda kv: -kv[1])[:12]:
        print(f"| {comm} | {seconds:.1f} |")
    print("\nAPI requests during the run, by verb and resource (apiserver_request_total):\n")
    print("| Verb | Resource | Requests |")
    print("|---|---|---|")
    for (verb, resource, sub), count in sorted(requests.items(), key=lambda kv: -kv[1]):
        if count >= max(2, n // 10):
            print(f"| {verb} | {resource}{'/' + sub if sub else ''} | {count} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"count": n, "shape": args.shape, "running": len(running_names),
                       "watched": watched, "recorded": recorded,
                       "timeline": {label: values for label, values in timeline},
                       "requests": {"/".join(k): v for k, v in requests.items()},
                       "controller": [controller_cpu, controller_rss],
                       "handler": [handler_cpu, handler_rss],
                       "node_busy_s": busy, "cpu_by_process": cpu_used,
                       "node_per_vmi_mib": node_per_vmi, "pod_pss_mib": pss_per_pod,
                       "requested_mib": requested, "cleanup_s": cleanup, "left": left}, f)
    print(f"\ndensity: {len(running_names)}/{n} Running, p50 {s(percentile(watched, .5))} s, "
          f"p95 {s(percentile(watched, .95))} s, max {s(max(watched, default=float('nan')))} s, "
          f"VMI writes/VMI {vmi_writes / n:.2f}, node MiB/VMI {node_per_vmi:.1f}, "
          f"requested MiB/pod {requested:.1f}, controller {controller_rss / 1024:.0f} MiB, "
          f"handler {handler_rss / 1024:.0f} MiB, clean-up {cleanup:.1f} s"
          f"{'' if not left else ' (left: ' + ', '.join(left) + ')'}")
    return 0 if len(running_names) == n and not left else 1


if __name__ == "__main__":
    sys.exit(main())
