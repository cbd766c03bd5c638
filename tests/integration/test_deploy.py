"""deploy/ checked offline: every manifest against strict Kubernetes schemas, the pod
command against the CLI, the KEDA triggers against the streams layout.

Built-in kinds use the schemas bundled in the `kubernetes-validate` package (strict
variant: an unknown field is an error, as with `kubectl apply --validate=strict`);
KEDA's ScaledObject uses deploy/schemas/ (see generate.py there). No network.
"""

from __future__ import annotations

import copy
import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import jsonschema
import kubernetes_validate
import pytest
import yaml

from actors.cli import build_parser
from actors.pod.roles import ROLES
from streams.layout import CMD_STREAM, EXEC_STREAM, TOOL_KINDS, Layout, tool_consumer, tool_log_consumer

pytestmark = [pytest.mark.timeout(120)]

ROOT = Path(__file__).resolve().parents[2]
DEPLOY = ROOT / "deploy"
K8S = DEPLOY / "k8s"
K8S_VERSION = "1.30"  # the oldest Kubernetes these manifests promise to work on
SCALEDOBJECT_SCHEMA = DEPLOY / "schemas" / "scaledobject-keda-v1alpha1.json"
# what KEDA's nats-jetstream scaler reads from a trigger's metadata (keda pkg/scalers/nats_jetstream_scaler.go)
JETSTREAM_TRIGGER_KEYS = {
    "natsServerMonitoringEndpoint",
    "account",
    "accountID",
    "stream",
    "consumer",
    "lagThreshold",
    "activationLagThreshold",
    "useHttps",
}
JETSTREAM_TRIGGER_REQUIRED = {"natsServerMonitoringEndpoint", "stream", "consumer"}


def manifest_files() -> list[Path]:
    return sorted(p for p in K8S.glob("*.yaml") if p.name != "kustomization.yaml")


def documents(path: Path) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(path.read_text()) if d is not None]


def all_documents() -> list[tuple[str, dict[str, Any]]]:
    return [(f"{p.name}#{i}", d) for p in manifest_files() for i, d in enumerate(documents(p))]


def by_kind(kind: str) -> list[dict[str, Any]]:
    return [d for _, d in all_documents() if d["kind"] == kind]


def validate(doc: dict[str, Any]) -> None:
    """Raise on a schema violation; strict everywhere."""
    if doc.get("apiVersion") == "keda.sh/v1alpha1" and doc.get("kind") == "ScaledObject":
        schema = json.loads(SCALEDOBJECT_SCHEMA.read_text())
        jsonschema.Draft202012Validator(schema).validate(doc)
        return
    kubernetes_validate.validate(doc, K8S_VERSION, strict=True)


# --- schemas -------------------------------------------------------------------------


@pytest.mark.parametrize("name,doc", all_documents(), ids=[n for n, _ in all_documents()])
def test_manifest_is_valid_against_strict_schema(name: str, doc: dict[str, Any]) -> None:
    try:
        validate(doc)
    except (jsonschema.ValidationError, kubernetes_validate.ValidationError) as e:
        pytest.fail(f"{name}: {e.message} at {'/'.join(map(str, e.absolute_path))}", pytrace=False)


def test_a_misspelt_field_fails_validation() -> None:
    """The check has teeth: a field that does not exist is an error, not ignored."""
    deployment = copy.deepcopy(by_kind("Deployment")[0])
    container = deployment["spec"]["template"]["spec"]["containers"][0]
    container["readinesProbe"] = container.pop("readinessProbe")
    with pytest.raises(jsonschema.ValidationError, match="readinesProbe"):
        validate(deployment)

    service = copy.deepcopy(by_kind("Service")[0])
    service["spec"]["port"] = service["spec"].pop("ports")
    with pytest.raises(jsonschema.ValidationError):
        validate(service)

    scaled = copy.deepcopy(by_kind("ScaledObject")[0])
    scaled["spec"]["maxReplicas"] = scaled["spec"].pop("maxReplicaCount")
    with pytest.raises(jsonschema.ValidationError, match="maxReplicas"):
        validate(scaled)
    scaled = copy.deepcopy(by_kind("ScaledObject")[0])
    scaled["spec"]["triggers"][0]["metadata"]["lagThreshold"] = 10  # KEDA wants strings
    with pytest.raises(jsonschema.ValidationError):
        validate(scaled)


def test_kustomization_lists_every_manifest_and_renders() -> None:
    kust = yaml.safe_load((K8S / "kustomization.yaml").read_text())
    assert kust["apiVersion"] == "kustomize.config.k8s.io/v1beta1" and kust["kind"] == "Kustomization"
    assert sorted(kust["resources"]) == sorted(p.name for p in manifest_files())
    images = {d["spec"]["template"]["spec"]["containers"][0]["image"] for d in by_kind("Deployment")}
    assert images == {i["name"] for i in kust["images"]}, "every Deployment's image is set by kustomization images"

    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl not installed: the rendered output is not checked")
    # `kubectl kustomize` renders offline; check what would really be applied
    out = subprocess.run([kubectl, "kustomize", str(K8S)], capture_output=True, text=True, timeout=60, check=True)
    rendered = [d for d in yaml.safe_load_all(out.stdout) if d]
    assert len(rendered) == len(all_documents())
    for doc in rendered:
        validate(doc)
        if doc["kind"] != "Namespace":
            assert doc["metadata"]["namespace"] == kust["namespace"]


# --- the pod command --------------------------------------------------------------------


def dockerfile_instruction(name: str) -> list[str]:
    lines = [ln.strip() for ln in (DEPLOY / "Dockerfile").read_text().splitlines()]
    found = [ln[len(name) :].strip() for ln in lines if ln.upper().startswith(name + " ")]
    assert len(found) == 1, f"one {name} expected in deploy/Dockerfile, found {found}"
    value: list[str] = json.loads(found[0])  # exec form: no shell between the signal and the process
    return value


def test_dockerfile_runs_actors_cli_serve_as_non_root() -> None:
    text = (DEPLOY / "Dockerfile").read_text()
    assert re.search(r"^FROM python:3\.11-slim\b", text, re.M)
    user = re.findall(r"^USER\s+(\S+)", text, re.M)
    assert user and user[-1].split(":")[0] not in ("0", "root")
    entry = dockerfile_instruction("ENTRYPOINT")
    assert entry == ["actors-cli", "serve"]
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    assert entry[0] in scripts
    # every package the project installs is copied into the image
    packages = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"]["find"]["include"]
    for pattern in packages:
        assert re.search(rf"^COPY\s+{pattern.rstrip('*')}\s", text, re.M), f"{pattern} not copied into the image"
    # the image's default arguments parse
    build_parser().parse_args([*entry[1:], *dockerfile_instruction("CMD")])


def test_entrypoint_command_exists_and_serve_help_works() -> None:
    exe = Path(sys.executable).parent / "actors-cli"
    command = [str(exe)] if exe.exists() else [sys.executable, "-m", "actors.cli"]
    out = subprocess.run([*command, "serve", "--help"], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    for flag in ("--role", "--http-port", "--drain-timeout", "--nats"):
        assert flag in out.stdout


def containers() -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    return [
        (d["metadata"]["name"], d, c)
        for d in by_kind("Deployment")
        for c in d["spec"]["template"]["spec"]["containers"]
    ]


def test_every_deployment_runs_a_valid_role_with_probes_on_the_served_port() -> None:
    entry = dockerfile_instruction("ENTRYPOINT")
    served: set[str] = set()
    for name, deployment, c in containers():
        assert "command" not in c, f"{name}: keep the image's ENTRYPOINT (actors-cli serve)"
        args = build_parser().parse_args([*entry[1:], *c["args"]])  # exits (fails) on an unknown flag or role
        assert args.role in (*ROLES, "ui"), f"{name}: --role {args.role} is not a role ({ROLES}) nor ui"
        served.add(args.role)
        ports = {p["name"]: p["containerPort"] for p in c["ports"]}
        assert ports["http"] == args.http_port
        assert c["readinessProbe"]["httpGet"]["path"] == "/readyz"
        assert c["livenessProbe"]["httpGet"]["path"] == "/healthz"
        for probe in ("readinessProbe", "livenessProbe"):
            assert c[probe]["httpGet"]["port"] in ("http", args.http_port)
        pod = deployment["spec"]["template"]
        assert pod["metadata"]["annotations"]["prometheus.io/port"] == str(args.http_port)
        assert pod["metadata"]["annotations"]["prometheus.io/path"] == "/metrics"
        # the pod must be given longer than it allows itself to stop (drain + 20 s)
        assert pod["spec"]["terminationGracePeriodSeconds"] > args.drain_timeout + 20
        for kind in ("requests", "limits"):
            assert {"cpu", "memory"} <= set(c["resources"][kind]), f"{name}: resources.{kind}"
        assert {"configMapRef": {"name": "actors-config"}} in c["envFrom"]
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
    assert served == {*ROLES, "ui"}, f"roles without a Deployment: {({*ROLES, 'ui'}) - served}"


def test_config_gives_a_valid_layout() -> None:
    (config,) = [d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "actors-config"]
    env = config["data"]
    assert env["NATS_URL"].startswith("tls://")  # the chart's client port requires TLS (deploy/nats/values.yaml)
    assert env["ACTORS_REPLICAS"] == "3"
    layout = Layout(
        partitions=int(env["ACTORS_PARTITIONS"]),
        replicas=int(env["ACTORS_REPLICAS"]),
        ack_wait=float(env["ACTORS_ACK_WAIT"]),
    )
    assert layout.partitions >= 1


def test_scaled_object_targets_the_tools_deployment_on_tool_consumers() -> None:
    (scaled,) = by_kind("ScaledObject")
    (tools,) = [d for d in by_kind("Deployment") if "tools" in d["spec"]["template"]["spec"]["containers"][0]["args"]]
    assert scaled["spec"]["scaleTargetRef"]["name"] == tools["metadata"]["name"]
    assert "replicas" not in tools["spec"], "KEDA owns the tools replica count"
    consumers = []
    for t in scaled["spec"]["triggers"]:
        assert t["type"] == "nats-jetstream"
        meta = t["metadata"]
        assert set(meta) <= JETSTREAM_TRIGGER_KEYS, (
            f"unknown nats-jetstream field(s) {set(meta) - JETSTREAM_TRIGGER_KEYS}"
        )
        assert JETSTREAM_TRIGGER_REQUIRED <= set(meta)
        assert int(meta["lagThreshold"]) > 0
        assert re.fullmatch(r"[a-z0-9.-]+:\d+", meta["natsServerMonitoringEndpoint"])
        consumers.append((meta["stream"], meta["consumer"]))
    # each kind's commands in CMD, and those held by decision records in EXEC
    assert sorted(consumers) == sorted(
        [(CMD_STREAM, tool_consumer(k)) for k in TOOL_KINDS] + [(EXEC_STREAM, tool_log_consumer(k)) for k in TOOL_KINDS]
    )


# --- the NATS chart values ------------------------------------------------------------------

# the value paths this file may set, as they are in the nats chart's values.yaml
# (nats-io/k8s, helm/charts/nats, chart 2.14.2): a misspelt key is silently ignored by
# helm, so it is caught here instead
NATS_CHART_KEYS = {
    "config.cluster.enabled",
    "config.cluster.replicas",
    "config.jetstream.enabled",
    "config.jetstream.fileStore.enabled",
    "config.jetstream.fileStore.dir",
    "config.jetstream.fileStore.pvc.enabled",
    "config.jetstream.fileStore.pvc.size",
    "config.jetstream.fileStore.pvc.storageClassName",
    "config.jetstream.memoryStore.enabled",
    "config.monitor.enabled",
    "config.monitor.port",
    "container.env.GOMEMLIMIT",
    "container.env.GOGC",
    "container.resources.requests.cpu",
    "container.resources.requests.memory",
    "container.resources.limits.memory",
    "promExporter.enabled",
    "promExporter.podMonitor.enabled",
    "podTemplate.topologySpreadConstraints.kubernetes.io/hostname.maxSkew",
    "podTemplate.topologySpreadConstraints.kubernetes.io/hostname.whenUnsatisfiable",
    "podDisruptionBudget.enabled",
    "natsBox.enabled",
    # security: TLS for clients and routes, JetStream encrypted at rest
    "tlsCA.enabled",
    "tlsCA.secretName",
    "tlsCA.key",
    "config.nats.tls.enabled",
    "config.nats.tls.secretName",
    "config.cluster.tls.enabled",
    "config.cluster.tls.secretName",
    "config.jetstream.merge.cipher",
    "config.jetstream.merge.key",
    "container.env.JETSTREAM_KEY.valueFrom.secretKeyRef.name",
    "container.env.JETSTREAM_KEY.valueFrom.secretKeyRef.key",
}


def leaf_paths(node: Any, prefix: str = "") -> set[str]:
    if isinstance(node, dict) and node:
        return {p for k, v in node.items() for p in leaf_paths(v, f"{prefix}.{k}" if prefix else str(k))}
    return {prefix}


def test_nats_values_make_a_three_node_jetstream_cluster_on_files() -> None:
    values = yaml.safe_load((DEPLOY / "nats" / "values.yaml").read_text())
    assert leaf_paths(values) <= NATS_CHART_KEYS, f"not chart values: {leaf_paths(values) - NATS_CHART_KEYS}"
    cfg = values["config"]
    assert cfg["cluster"]["enabled"] is True and cfg["cluster"]["replicas"] == 3
    js = cfg["jetstream"]
    assert js["enabled"] is True and js["fileStore"]["enabled"] is True and js["fileStore"]["pvc"]["enabled"] is True
    assert js["memoryStore"]["enabled"] is False
    assert cfg["monitor"]["enabled"] is True
    # KEDA reads the monitor port the chart serves
    (scaled,) = by_kind("ScaledObject")
    for t in scaled["spec"]["triggers"]:
        assert t["metadata"]["natsServerMonitoringEndpoint"].endswith(f":{cfg['monitor']['port']}")


def test_nats_values_require_tls_and_encrypt_jetstream_with_a_key_from_a_secret() -> None:
    values = yaml.safe_load((DEPLOY / "nats" / "values.yaml").read_text())
    cfg = values["config"]
    secret = cfg["nats"]["tls"]["secretName"]
    assert cfg["nats"]["tls"]["enabled"] is True and cfg["cluster"]["tls"]["enabled"] is True
    assert cfg["cluster"]["tls"]["secretName"] == secret
    assert values["tlsCA"] == {"enabled": True, "secretName": secret, "key": "ca.crt"}
    # the certificate cert-manager makes is that Secret, for the names clients and routes dial
    (cert,) = [
        d
        for d in yaml.safe_load_all((DEPLOY / "nats" / "certificates.yaml").read_text())
        if d["kind"] == "Certificate" and not d["spec"].get("isCA")
    ]
    assert cert["spec"]["secretName"] == secret
    assert {"nats.nats.svc.cluster.local", "*.nats-headless"} <= set(cert["spec"]["dnsNames"])
    # encryption at rest: a cipher nats-server knows, the key an environment variable
    # filled from a Secret, never a literal in the values
    merge = cfg["jetstream"]["merge"]
    assert merge["cipher"] in ("aes", "chachapoly")
    var = re.fullmatch(r"<< \$([A-Z_]+) >>", merge["key"])
    assert var, merge["key"]
    assert set(values["container"]["env"][var.group(1)]["valueFrom"]["secretKeyRef"]) == {"name", "key"}


def test_every_pod_trusts_the_nats_ca_it_mounts() -> None:
    (config,) = [d for d in by_kind("ConfigMap") if d["metadata"]["name"] == "actors-config"]
    ca = config["data"]["NATS_TLS_CA"]
    for deployment in by_kind("Deployment"):
        pod = deployment["spec"]["template"]["spec"]
        (container,) = pod["containers"]
        mounts = {m["name"]: m["mountPath"] for m in container.get("volumeMounts", [])}
        volumes = {v["name"]: v for v in pod.get("volumes", [])}
        found = [n for n, path in mounts.items() if ca.startswith(path.rstrip("/") + "/")]
        assert found, f"{deployment['metadata']['name']}: nothing mounted at {ca}"
        assert volumes[found[0]]["configMap"]["name"] == "nats-ca"
