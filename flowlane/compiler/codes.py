"""Stable diagnostic codes. A code's meaning never changes once released."""

from __future__ import annotations

CODES: dict[str, str] = {}  # code -> what it means, as docs/diagnostics.md lists it


def _code(code: str, meaning: str) -> str:
    CODES[code] = meaning
    return code


# reading files and YAML syntax
YAML_SYNTAX = _code("FL001", "YAML syntax error")
TAB_INDENT = _code("FL002", "tab character in indentation")
DUPLICATE_KEY = _code("FL003", "duplicate mapping key")
KEY_NOT_PLAIN_STRING = _code("FL004", "mapping key is not a plain string")
UNSUPPORTED_ANCHOR = _code("FL005", "unsupported use of YAML anchors, aliases or merge keys")
UNSUPPORTED_TAG = _code("FL006", "unsupported YAML tag")
NOT_A_MAPPING = _code("FL007", "document is not a mapping")
UNREADABLE = _code("FL008", "file or path cannot be read")
# schema
MISSING_KEY = _code("FL010", "required key missing")
UNKNOWN_KEY = _code("FL011", "unknown key")
WRONG_TYPE = _code("FL012", "value has the wrong type")
INVALID_VALUE = _code("FL013", "invalid value")
UNKNOWN_KIND = _code("FL014", "unknown or missing document kind")
UNSUPPORTED_FORMAT = _code("FL015", "unsupported format version")
DURATION_OUT_OF_RANGE = _code("FL016", "duration out of range")
# names and uniqueness
INVALID_SLUG = _code("FL020", "invalid slug")
DUPLICATE_SLUG = _code("FL021", "duplicate flow or alias slug")
DUPLICATE_STEP = _code("FL022", "duplicate step slug")
# graph
UNKNOWN_DEPENDENCY = _code("FL030", "unknown dependency")
DEPENDENCY_CYCLE = _code("FL031", "dependency cycle")
MAP_WITH_MANY_NEEDS = _code("FL032", "map step with more than one dependency")
WHEN_UNMET_WITHOUT_CONDITION = _code("FL033", "when_unmet without a condition")
DEPENDENCY_TWICE = _code("FL034", "dependency listed twice")
CONDITION_NAMES_NO_NEED = _code("FL035", "condition names a step that is not among the step's needs")
WAIT_STEP_WITH_HANDLER = _code("FL036", "wait step has a handler")
OPTION_MEANS_NOTHING = _code("FL037", "option that means nothing for a wait or child-flow step")
CHILD_FLOW_STEP_CONFLICT = _code("FL038", "child-flow step with a handler, or a wait step with a child flow")
MAP_OVER_CHILD_RUN = _code("FL039", "map step maps the output of a single child-flow step")
# routing and queues
QUEUE_NOT_CANONICAL = _code("FL040", "queue name is not canonical")
ROUTING_MISSES_STEP = _code("FL041", "explicit routing misses a step")
ROUTING_NAMES_UNKNOWN_STEP = _code("FL042", "explicit routing names an unknown step")
PER_STEP_QUEUE_UNNAMEABLE = _code("FL043", "per-step queue name cannot be derived")
FLOW_QUEUE_UNNAMEABLE = _code("FL044", "flow queue name cannot be derived")
QUEUE_OWNED_ELSEWHERE = _code("FL045", "queue owned by one flow is used elsewhere")
ROUTING_NAMES_QUEUELESS_STEP = _code("FL046", "explicit routing names a wait or child-flow step")
# aliases
ALIAS_UNKNOWN_FLOW = _code("FL050", "alias points to an unknown flow")
ALIAS_TAKES_FLOW_SLUG = _code("FL051", "alias slug collides with a flow slug")
ALIAS_LISTS_FLOW_TWICE = _code("FL052", "alias lists a flow twice")
# workers
WORKER_UNKNOWN_FLOW = _code("FL060", "worker lists an unknown flow or alias")
WORKER_FLOW_NOT_ROUTED = _code("FL061", "worker lists a flow that routes no step to its queue")
STEP_WITHOUT_WORKER = _code("FL062", "routed step is covered by no worker")
DUPLICATE_WORKER = _code("FL063", "duplicate worker name")
# handlers and values
INVALID_HANDLER = _code("FL070", "invalid handler reference")
UNSTORABLE_CONDITION = _code("FL071", "condition contains a value PostgreSQL cannot store")
HANDLER_NOT_CALLABLE = _code("FL072", "handler cannot be imported or called with (input, ctx)")
# schedules
INVALID_CRON = _code("FL080", "invalid cron expression")
UNKNOWN_TIME_ZONE = _code("FL081", "unknown time zone")
SCHEDULE_UNKNOWN_FLOW = _code("FL082", "schedule starts an unknown flow or alias")
DUPLICATE_SCHEDULE = _code("FL083", "duplicate schedule name")
SCHEDULE_INPUT_REFUSED = _code("FL084", "schedule input the flow cannot start with")
# data contracts (input_schema, output_schema)
SCHEMA_KEYWORD_UNSUPPORTED = _code("FL100", "schema keyword outside the supported subset")
INVALID_SCHEMA = _code("FL101", "invalid schema")
UNRESOLVED_SCHEMA_REF = _code("FL102", "schema reference cannot be resolved")
CONDITION_NEVER_MATCHES = _code("FL103", "condition can never match the schema of what it tests")
MAP_OVER_NON_ARRAY = _code("FL104", "map over a value whose schema is not an array")
INPUT_REFUSED_BY_CONTRACT = _code(
    "FL105", "input written in the YAML that the target flow's input_schema refuses")
UNSTORABLE_SCHEMA = _code("FL106", "schema holds a value PostgreSQL cannot store")
# child flows
CHILD_FLOW_UNKNOWN = _code("FL140", "child flow is not a flow or alias of this project")
CHILD_FLOW_CYCLE = _code("FL141", "flows start each other in a cycle")
# failure handlers
FAILURE_HANDLER_UNKNOWN = _code("FL142", "failure handler is not a flow or alias of this project")
FAILURE_HANDLER_IS_ITSELF = _code("FL143", "flow names itself as its failure handler")
COMPENSATION_UNKNOWN = _code("FL144", "compensation is not a flow or alias of this project")
COMPENSATION_NEVER_RUNS = _code(
    "FL145", "compensation that can never run: nothing can fail the run once its step completed")
FAILURE_HANDLER_NEVER_RUNS = _code("FL146", "failure handler of a flow whose runs can never fail")
HANDLER_REFUSES_ITS_INPUT = _code(
    "FL147", "failure handler or compensation whose flow refuses the input it starts with")
# flow control (concurrency, queue limits, priorities)
LIMIT_OUT_OF_RANGE = _code("FL180", "concurrency or rate limit out of range")
CONCURRENCY_KEY_NOT_POINTER = _code("FL181", "concurrency key is not a JSON pointer")
DUPLICATE_QUEUE = _code("FL182", "queue declared twice")
QUEUE_NOT_ROUTED = _code("FL183", "queue document names a queue no step is routed to")
RATE_WINDOW_OUT_OF_RANGE = _code("FL184", "rate limit window out of range")
PRIORITY_OUT_OF_RANGE = _code("FL185", "priority out of range")
QUEUE_WITHOUT_LIMIT = _code("FL186", "queue document declares no limit")
# triggers (events in)
TRIGGER_UNKNOWN_FLOW = _code("FL110", "trigger starts an unknown flow or alias")
DUPLICATE_TRIGGER = _code("FL111", "duplicate trigger name")
TRIGGER_POINTER_NEVER_FOUND = _code("FL112", "trigger pointer that never finds a value for its events")
TRIGGER_INPUT_REFUSED = _code("FL113", "trigger input the flow's input contract refuses")
# webhooks (events in over HTTP)
WEBHOOK_UNKNOWN_FLOW = _code("FL114", "webhook starts or signals an unknown flow or alias")
DUPLICATE_WEBHOOK = _code("FL115", "duplicate webhook name")
WEBHOOK_SIGNALS_NO_WAIT_STEP = _code("FL116", "webhook signals a step that is not a wait step of its flow")
WEBHOOK_INPUT_REFUSED = _code("FL117", "webhook input the flow's input contract refuses")
INVALID_WHEN_FULL = _code("FL187", "concurrency when_full is not queue, replace_waiting or cancel_running")
CONCURRENCY_KEY_NEVER_PRESENT = _code("FL188", "concurrency key names a field the input_schema never allows")
DEBOUNCE_CONFLICT = _code("FL189", "debounce max_wait shorter than its period, or debounce beside dedup")
CACHE_TTL_TOO_SHORT = _code("FL190", "step cache ttl under one second")
CACHE_KEY_NEVER_PRESENT = _code("FL191", "step cache key names a field the step's input never has")
# check (compiled SQL against the YAML and the base revision)
STALE_SQL = _code("FL090", "compiled SQL is stale, missing or hand-edited")
NEW_VERSION_REQUIRED = _code("FL091", "NEW_VERSION_REQUIRED: a committed flow changed its shape")

CHECK_CODES = frozenset({STALE_SQL, NEW_VERSION_REQUIRED})
# found by importing the handlers (`validate --handlers`), not from the YAML alone
HANDLER_CODES = frozenset({HANDLER_NOT_CALLABLE})


def describe(code: str) -> str:
    return CODES.get(code, "flowlane diagnostic")
