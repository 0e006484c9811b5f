"""Stable diagnostic codes. A code's meaning never changes once released."""

from __future__ import annotations

CODES: dict[str, str] = {
    # reading files and YAML syntax
    "FL001": "YAML syntax error",
    "FL002": "tab character in indentation",
    "FL003": "duplicate mapping key",
    "FL004": "mapping key is not a plain string",
    "FL005": "unsupported use of YAML anchors, aliases or merge keys",
    "FL006": "unsupported YAML tag",
    "FL007": "document is not a mapping",
    "FL008": "file or path cannot be read",
    # schema
    "FL010": "required key missing",
    "FL011": "unknown key",
    "FL012": "value has the wrong type",
    "FL013": "invalid value",
    "FL014": "unknown or missing document kind",
    "FL015": "unsupported format version",
    "FL016": "duration out of range",
    # names and uniqueness
    "FL020": "invalid slug",
    "FL021": "duplicate flow or alias slug",
    "FL022": "duplicate step slug",
    # graph
    "FL030": "unknown dependency",
    "FL031": "dependency cycle",
    "FL032": "map step with more than one dependency",
    "FL033": "when_unmet without a condition",
    "FL034": "dependency listed twice",
    "FL035": "condition names a step that is not among the step's needs",
    "FL036": "wait step has a handler",
    "FL037": "option that means nothing for a wait or child-flow step",
    "FL038": "child-flow step with a handler, or a wait step with a child flow",
    "FL039": "map step maps the output of a single child-flow step",
    # routing and queues
    "FL040": "queue name is not canonical",
    "FL041": "explicit routing misses a step",
    "FL042": "explicit routing names an unknown step",
    "FL043": "per-step queue name cannot be derived",
    "FL044": "flow queue name cannot be derived",
    "FL045": "queue owned by one flow is used elsewhere",
    "FL046": "explicit routing names a wait or child-flow step",
    # aliases
    "FL050": "alias points to an unknown flow",
    "FL051": "alias slug collides with a flow slug",
    "FL052": "alias lists a flow twice",
    # workers
    "FL060": "worker lists an unknown flow or alias",
    "FL061": "worker lists a flow that routes no step to its queue",
    "FL062": "routed step is covered by no worker",
    "FL063": "duplicate worker name",
    # handlers and values
    "FL070": "invalid handler reference",
    "FL071": "condition contains a value PostgreSQL cannot store",
    "FL072": "handler cannot be imported or called with (input, ctx)",
    # schedules
    "FL080": "invalid cron expression",
    "FL081": "unknown time zone",
    "FL082": "schedule starts an unknown flow or alias",
    "FL083": "duplicate schedule name",
    "FL084": "schedule input the flow cannot start with",
    # data contracts (input_schema, output_schema)
    "FL100": "schema keyword outside the supported subset",
    "FL101": "invalid schema",
    "FL102": "schema reference cannot be resolved",
    "FL103": "condition can never match the schema of what it tests",
    "FL104": "map over a value whose schema is not an array",
    "FL105": "input written in the YAML that the target flow's input_schema refuses",
    "FL106": "schema holds a value PostgreSQL cannot store",
    # child flows
    "FL140": "child flow is not a flow or alias of this project",
    "FL141": "flows start each other in a cycle",
    # failure handlers
    "FL142": "failure handler is not a flow or alias of this project",
    "FL143": "flow names itself as its failure handler",
    "FL144": "compensation is not a flow or alias of this project",
    # flow control (concurrency, queue limits, priorities)
    "FL180": "concurrency or rate limit out of range",
    "FL181": "concurrency key is not a JSON pointer",
    "FL182": "queue declared twice",
    "FL183": "queue document names a queue no step is routed to",
    "FL184": "rate limit window out of range",
    "FL185": "priority out of range",
    "FL186": "queue document declares no limit",
    # triggers (events in)
    "FL110": "trigger starts an unknown flow or alias",
    "FL111": "duplicate trigger name",
    "FL112": "trigger pointer that never finds a value for its events",
    "FL113": "trigger input the flow's input contract refuses",
    # webhooks (events in over HTTP)
    "FL114": "webhook starts or signals an unknown flow or alias",
    "FL115": "duplicate webhook name",
    "FL116": "webhook signals a step that is not a wait step of its flow",
    "FL117": "webhook input the flow's input contract refuses",
    "FL187": "concurrency when_full is not queue, replace_waiting or cancel_running",
    "FL188": "concurrency key names a field the input_schema never allows",
    "FL189": "debounce max_wait shorter than its period, or debounce beside dedup",
    "FL190": "step cache ttl under one second",
    "FL191": "step cache key names a field the step's input never has",
    # check (compiled SQL against the YAML and the base revision)
    "FL090": "compiled SQL is stale, missing or hand-edited",
    "FL091": "NEW_VERSION_REQUIRED: a committed flow changed its shape",
}

# the codes by name, for the code that reports them
UNKNOWN_KEY = "FL011"
WRONG_TYPE = "FL012"
DEPENDENCY_CYCLE = "FL031"
ROUTING_MISSES_STEP = "FL041"
ROUTING_NAMES_UNKNOWN_STEP = "FL042"
ROUTING_NAMES_QUEUELESS_STEP = "FL046"
NEW_VERSION_REQUIRED = "FL091"

CHECK_CODES = frozenset({"FL090", "FL091"})
# found by importing the handlers (`validate --handlers`), not from the YAML alone
HANDLER_CODES = frozenset({"FL072"})


def describe(code: str) -> str:
    return CODES.get(code, "flowlane diagnostic")
