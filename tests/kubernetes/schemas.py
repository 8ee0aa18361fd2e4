"""Strict JSON schemas for the custom resources in deploy/kubernetes, whose schemas the
kubernetes-validate package does not ship.

Each covers the fields of its API that exist upstream (written from the API types: LWS
`api/leaderworkerset/v1/leaderworkerset_types.go`, prometheus-operator `PodMonitor`, Gateway API
Inference Extension `api/v1/inferencepool_types.go`, Gateway API `HTTPRoute`), restricted to the
ones ferrite could plausibly use, with unknown fields refused, enums and required fields as
upstream has them. Embedded Kubernetes types (pod templates, metadata) are validated by check.py
against the real Kubernetes schemas instead, so here they are only `object`.
"""


def strict(properties, required=()):
    return {"type": "object", "properties": properties, "required": list(required), "additionalProperties": False}


OBJECT = {"type": "object"}
STRING = {"type": "string", "minLength": 1}
INT = {"type": "integer"}
PORT_NUMBER = {"type": "integer", "minimum": 1, "maximum": 65535}
INT_OR_STRING = {"oneOf": [{"type": "integer"}, {"type": "string", "pattern": r"^[0-9]+%?$"}]}
DURATION = {"type": "string", "pattern": r"^([0-9]{1,5}(h|m|s|ms)){1,4}$"}
LABELS = {"type": "object", "additionalProperties": {"type": "string"}}
LABEL_SELECTOR = strict({
    "matchLabels": LABELS,
    "matchExpressions": {"type": "array", "items": strict(
        {"key": STRING, "operator": {"enum": ["In", "NotIn", "Exists", "DoesNotExist"]},
         "values": {"type": "array", "items": {"type": "string"}}}, ["key", "operator"])},
})


def resource(api_version, kind, spec):
    return strict({
        "apiVersion": {"const": api_version},
        "kind": {"const": kind},
        "metadata": OBJECT,
        "spec": spec,
    }, ["apiVersion", "kind", "metadata", "spec"])


LEADER_WORKER_SET = resource("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet", strict({
    "replicas": {"type": "integer", "minimum": 0, "maximum": 1000000},
    "startupPolicy": {"enum": ["LeaderCreated", "LeaderReady"]},
    "networkConfig": strict({"subdomainPolicy": {"enum": ["Shared", "UniquePerReplica"]}}, ["subdomainPolicy"]),
    "rolloutStrategy": strict({
        "type": {"enum": ["RollingUpdate"]},
        "rollingUpdateConfiguration": strict({
            "partition": {"type": "integer", "minimum": 0},
            "maxUnavailable": INT_OR_STRING,
            "maxSurge": INT_OR_STRING,
        }),
    }, ["type"]),
    "leaderWorkerTemplate": strict({
        "leaderTemplate": OBJECT,
        "workerTemplate": OBJECT,
        "size": {"type": "integer", "minimum": 1},
        "restartPolicy": {"enum": ["RecreateGroupOnPodRestart", "RecreateGroupAfterStart", "None", "Default"]},
        "subGroupPolicy": strict({
            "subGroupPolicyType": {"enum": ["LeaderWorker", "LeaderExcluded"]},
            "subGroupSize": {"type": "integer", "minimum": 1},
        }),
        "volumeClaimTemplates": {"type": "array", "items": OBJECT},
    }, ["workerTemplate"]),
}, ["leaderWorkerTemplate"]))

POD_MONITOR = resource("monitoring.coreos.com/v1", "PodMonitor", strict({
    "jobLabel": STRING,
    "podTargetLabels": {"type": "array", "items": STRING},
    "selector": LABEL_SELECTOR,
    "namespaceSelector": strict({"any": {"type": "boolean"}, "matchNames": {"type": "array", "items": STRING}}),
    "podMetricsEndpoints": {"type": "array", "minItems": 1, "items": strict({
        "port": STRING,
        "portNumber": PORT_NUMBER,
        "path": {"type": "string", "pattern": "^/"},
        "scheme": {"enum": ["http", "https", "HTTP", "HTTPS"]},
        "interval": DURATION,
        "scrapeTimeout": DURATION,
        "honorLabels": {"type": "boolean"},
    })},
}, ["selector", "podMetricsEndpoints"]))

INFERENCE_POOL = resource("inference.networking.k8s.io/v1", "InferencePool", strict({
    "selector": strict({"matchLabels": {**LABELS, "minProperties": 1, "maxProperties": 64}}, ["matchLabels"]),
    "targetPorts": {"type": "array", "minItems": 1, "maxItems": 8,
                    "items": strict({"number": PORT_NUMBER}, ["number"])},
    "appProtocol": {"enum": ["http", "kubernetes.io/h2c"]},
    "endpointPickerRef": strict({
        "group": {"type": "string"},
        "kind": STRING,
        "name": STRING,
        "port": strict({"number": PORT_NUMBER}, ["number"]),
        "failureMode": {"enum": ["FailOpen", "FailClose"]},
    }, ["name"]),
}, ["selector", "targetPorts", "endpointPickerRef"]))

PARENT_REF = strict({"group": {"type": "string"}, "kind": STRING, "namespace": STRING, "name": STRING,
                     "sectionName": STRING, "port": PORT_NUMBER}, ["name"])
HTTP_ROUTE = resource("gateway.networking.k8s.io/v1", "HTTPRoute", strict({
    "parentRefs": {"type": "array", "maxItems": 32, "items": PARENT_REF},
    "hostnames": {"type": "array", "items": STRING},
    "rules": {"type": "array", "maxItems": 16, "items": strict({
        "name": STRING,
        "matches": {"type": "array", "items": strict({
            "path": strict({"type": {"enum": ["Exact", "PathPrefix", "RegularExpression"]},
                            "value": {"type": "string", "pattern": "^/"}}),
            "method": {"enum": ["GET", "HEAD", "POST", "PUT", "DELETE", "CONNECT", "OPTIONS", "TRACE", "PATCH"]},
        })},
        "backendRefs": {"type": "array", "items": strict({
            "group": {"type": "string"}, "kind": STRING, "name": STRING, "namespace": STRING,
            "port": PORT_NUMBER, "weight": {"type": "integer", "minimum": 0, "maximum": 1000000},
        }, ["name"])},
        "timeouts": strict({"request": DURATION, "backendRequest": DURATION}),
    })},
}))

CUSTOM = {
    ("leaderworkerset.x-k8s.io/v1", "LeaderWorkerSet"): LEADER_WORKER_SET,
    ("monitoring.coreos.com/v1", "PodMonitor"): POD_MONITOR,
    ("inference.networking.k8s.io/v1", "InferencePool"): INFERENCE_POOL,
    ("gateway.networking.k8s.io/v1", "HTTPRoute"): HTTP_ROUTE,
}
