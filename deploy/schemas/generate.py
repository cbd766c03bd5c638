"""Regenerate the vendored JSON Schemas of custom resources the manifests use.

Built-in kinds (Deployment, Service, ...) are checked with the `kubernetes-validate`
package (a test dependency that bundles strict Kubernetes schemas). KEDA's
ScaledObject is not in it, so its schema is generated here from a PyPI package that
models KEDA's CRDs, made strict (an object with known properties accepts no other
key, as the API server does with strict field validation), and committed, so the
tests need neither that package nor a network:

    python3.11 -m venv /tmp/gen && /tmp/gen/bin/pip install 'cloudcoil-models-keda==2.16.1.0'
    /tmp/gen/bin/python deploy/schemas/generate.py
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent


def strict(node: Any) -> Any:
    """additionalProperties: false on every object schema that lists properties and
    says nothing about others; titles dropped (noise)."""
    if isinstance(node, dict):
        out = {k: strict(v) for k, v in node.items() if k != "title"}
        if "properties" in out and "additionalProperties" not in out:
            out["additionalProperties"] = False
        return out
    if isinstance(node, list):
        return [strict(v) for v in node]
    return node


def main() -> None:
    from importlib.metadata import version

    from cloudcoil.models.keda.v1alpha1 import ScaledObject  # type: ignore[import-not-found]

    schema = strict(ScaledObject.model_json_schema(by_alias=True, mode="validation"))
    schema = {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        "$comment": f"KEDA ScaledObject keda.sh/v1alpha1, from cloudcoil-models-keda {version('cloudcoil-models-keda')}"
        " by deploy/schemas/generate.py; strict. Do not edit by hand.",
        **schema,
    }
    out = HERE / "scaledobject-keda-v1alpha1.json"
    out.write_text(json.dumps(schema, indent=1, sort_keys=True) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
