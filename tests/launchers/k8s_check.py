"""issue 15: examples/k8s/hetps.yaml checked offline.

`kubectl apply --dry-run=client` needs an API server (it downloads the
OpenAPI schema and the resource mappings), which a test here cannot reach,
so this check does what matters for the job instead: each object has the
apiVersion of its kind and the fields Kubernetes requires, and the objects
agree with one another and with the job — the headless Service selects the
server pods and exposes the rendezvous port, the StatefulSet runs
cluster.servers replicas with the ordinal as --rank, the Indexed Job runs
cluster.workers completions with the index as --rank, the rendezvous names
server 0 under the Service, the token reaches both from the Secret the
header's command creates, and the embedded job.yaml is one `hetps` accepts.

    /usr/bin/python3 tests/launchers/k8s_check.py build/hetps examples/k8s/hetps.yaml
"""
import os
import re
import subprocess
import sys
import tempfile

import yaml

API = {"ConfigMap": "v1", "Service": "v1", "Secret": "v1",
       "StatefulSet": "apps/v1", "Job": "batch/v1"}


def fail(message):
    sys.exit("FAIL: " + message)


def container(obj):
    spec = obj["spec"]["template"]["spec"]
    if len(spec["containers"]) != 1:
        fail(f"{obj['metadata']['name']}: expected one container")
    return spec, spec["containers"][0]


def main(hetps, path):
    text = open(path).read()
    objects = {}
    for obj in yaml.safe_load_all(text):
        kind = obj.get("kind")
        if kind not in API:
            fail(f"unexpected kind {kind!r}")
        if obj.get("apiVersion") != API[kind]:
            fail(f"{kind}: apiVersion {obj.get('apiVersion')!r}, not {API[kind]}")
        if not obj.get("metadata", {}).get("name"):
            fail(f"{kind}: no metadata.name")
        objects[kind] = obj
    for kind in ("ConfigMap", "Service", "StatefulSet", "Job"):
        if kind not in objects:
            fail(f"no {kind}")
    config_map, service = objects["ConfigMap"], objects["Service"]
    servers, workers = objects["StatefulSet"], objects["Job"]
    job = yaml.safe_load(config_map["data"]["job.yaml"])
    cluster = job["cluster"]

    # The rendezvous: server 0 of the StatefulSet under the headless Service.
    if service["spec"].get("clusterIP") != "None":
        fail("the Service must be headless (clusterIP: None)")
    if servers["spec"]["serviceName"] != service["metadata"]["name"]:
        fail("StatefulSet.serviceName is not the Service")
    port = int(cluster["rendezvous"].rsplit(":", 1)[1])
    expected = (f"{servers['metadata']['name']}-0."
                f"{service['metadata']['name']}:{port}")
    if cluster["rendezvous"] != expected:
        fail(f"cluster.rendezvous {cluster['rendezvous']!r}, not {expected!r}")
    if port not in [p["port"] for p in service["spec"]["ports"]]:
        fail(f"the Service does not expose the rendezvous port {port}")

    # Selectors and labels.
    labels = servers["spec"]["template"]["metadata"]["labels"]
    for selector in (service["spec"]["selector"],
                     servers["spec"]["selector"]["matchLabels"]):
        if any(labels.get(k) != v for k, v in selector.items()):
            fail(f"selector {selector} does not match server pods {labels}")
    worker_labels = workers["spec"]["template"]["metadata"]["labels"]
    if all(worker_labels.get(k) == v
           for k, v in service["spec"]["selector"].items()):
        fail("the Service would select worker pods too")

    # Counts and ranks.
    if servers["spec"]["replicas"] != cluster["servers"]:
        fail("StatefulSet replicas != cluster.servers")
    spec = workers["spec"]
    if spec.get("completionMode") != "Indexed":
        fail("the worker Job must be Indexed (the index is the rank)")
    if not spec["completions"] == spec["parallelism"] == cluster["workers"]:
        fail("Job completions/parallelism != cluster.workers")
    for obj, role, rank in ((servers, "server", "${HOSTNAME##*-}"),
                            (workers, "worker", "$JOB_COMPLETION_INDEX")):
        pod, c = container(obj)
        command = " ".join(c["command"])
        mount = next(m["mountPath"] for m in c["volumeMounts"])
        wanted = f"hetps {role} --config {mount}/job.yaml --rank {rank}"
        if wanted not in command:
            fail(f"{role}: command {command!r} lacks {wanted!r}")
        volume = next(v for v in pod["volumes"]
                      if v["name"] == c["volumeMounts"][0]["name"])
        if volume["configMap"]["name"] != config_map["metadata"]["name"]:
            fail(f"{role}: the job volume is not the ConfigMap")
        # The token: from the Secret the header's command creates.
        env = {e["name"]: e for e in c["env"]}
        token = env.get(job["auth"]["token_env"])
        if token is None:
            fail(f"{role}: no {job['auth']['token_env']} (auth.token_env)")
        ref = token["valueFrom"]["secretKeyRef"]
        made = re.search(r"create secret generic (\S+) --from-literal=(\w+)=",
                         text)
        if not made or (made.group(1), made.group(2)) != (ref["name"],
                                                          ref["key"]):
            fail(f"{role}: secret {ref} is not the one the header creates")

    # The job itself: `hetps status` validates it (and its auth) before it
    # connects, exiting 2 on a configuration error, 1 on no coordinator.
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        f.write(config_map["data"]["job.yaml"])
        f.flush()
        env = dict(os.environ, **{job["auth"]["token_env"]: "check"})
        result = subprocess.run(
            [hetps, "status", "--config", f.name, "--coordinator",
             "127.0.0.1:1"], env=env, capture_output=True, text=True,
            timeout=60)
        if result.returncode != 1:
            fail(f"hetps refused job.yaml (exit {result.returncode}): "
                 f"{result.stdout}{result.stderr}")
    print(f"PASS: {len(objects)} objects agree; {cluster['servers']} servers, "
          f"{cluster['workers']} workers, rendezvous {cluster['rendezvous']}")


if __name__ == "__main__":
    main(*sys.argv[1:])
