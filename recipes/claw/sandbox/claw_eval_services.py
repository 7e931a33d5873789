"""Claw-Eval's mock services (gmail, calendar, todo, contacts, kb, inventory, scheduler, notes),
run INSIDE the sandbox by ``claw_server.py`` next to the recipe's own services. Standard library only.

A Claw-Eval task names its tools (``tools[]``) and where each is answered (``tool_endpoints[]``:
``http://localhost:9100/gmail/send``); its services (``services[]``) name their port, health
check, reset endpoint and fixture files (``env``). Each service here is a store of records
seeded from those fixtures, and an endpoint's path says what it does to them:

    .../get, .../read                  one record by its id argument
    .../send, .../reply, .../forward   a message sent         (gmail audit: ``sent``)
    .../drafts/save, .../draft         a draft saved          (``drafts``)
    .../create, .../add, .../schedule  a record created       (``created_<collection>``)
    .../update, .../complete, ...      a record changed       (``updated_<collection>``)
    .../delete, .../remove, .../cancel a record removed       (``deleted_<collection>``)
    anything else                      a listing or search, filtered by the arguments

Everything a service did lands in the world under ``claw_eval.<service>``: its records
(``state``) and its audit (``audit``: ``calls`` with each endpoint, request and response body, and
the action lists above), which ``GET /<service>/audit`` serves and the graders read as Claw-Eval's
``audit_data``. Being part of the world, it is in the MAC'd snapshot and comes back on reset.
"""

import copy
import json

# In the sandbox the files next to this one win over any installed orchard_async (whose version may differ).
if __package__:
    from orchard_async.recipes.claw.sandbox import claw_tools as tools  # the controller imports this package
else:
    import claw_tools as tools  # type: ignore[no-redef]  # in the sandbox, next to this file

SERVICES = ("gmail", "calendar", "todo", "contacts", "kb", "inventory", "scheduler", "notes")
DEFAULT_COLLECTION = {
    "gmail": "messages",
    "calendar": "events",
    "todo": "tasks",
    "contacts": "contacts",
    "kb": "articles",
    "inventory": "items",
    "scheduler": "jobs",
    "notes": "notes",
}
GET_WORDS = {"get", "read", "detail", "details", "show", "view", "fetch"}
SEND_WORDS = {"send", "reply", "forward"}
CREATE_WORDS = {"create", "add", "new", "schedule", "insert", "save"}
UPDATE_WORDS = {"update", "edit", "modify", "complete", "move", "adjust", "set", "mark", "restock", "pause", "resume"}
DELETE_WORDS = {"delete", "remove", "cancel", "archive", "trash"}
SEARCH_ARGS = ("query", "q", "keyword", "keywords", "search", "text")
LIMIT_ARGS = ("max_results", "limit", "top_k", "page_size")
RESPONSE_CHARS = 4000  # of a response body kept in a call record


def verb(path):
    """What an endpoint does, from its path: get, send, draft, create, update, delete or list."""
    parts = [p for p in path.lower().strip("/").split("/") if p]
    last = parts[-1] if parts else ""
    words = set(last.replace("-", "_").split("_"))
    if "draft" in path.lower() and (last in CREATE_WORDS or last.startswith("draft")):
        return "draft"
    for name, vocabulary in (
        ("get", GET_WORDS),
        ("send", SEND_WORDS),
        ("create", CREATE_WORDS),
        ("update", UPDATE_WORDS),
        ("delete", DELETE_WORDS),
    ):
        if last in vocabulary or words & vocabulary and len(parts) > 1:
            return name
    return "list"


def mutates(path):
    return verb(path) not in ("get", "list")


def _records_of(data, default):
    """A fixture file's content as collections of records."""
    if isinstance(data, list):
        return {default: [r for r in data if isinstance(r, dict)]}
    if isinstance(data, dict):
        lists = {k: [r for r in v if isinstance(r, dict)] for k, v in data.items() if isinstance(v, list)}
        if lists:
            return lists
        return {default: [data]}
    return {default: []}


def seed(services):
    """The initial ``claw_eval`` part of the world: each service's records and an empty audit.
    ``services``: [{"name", "fixtures": [parsed fixture content, ...]}]."""
    world = {}
    for service in services:
        name = service["name"]
        default = DEFAULT_COLLECTION.get(name, "records")
        state: dict = {}
        for data in service.get("fixtures") or []:
            for collection, records in _records_of(data, default).items():
                state.setdefault(collection, []).extend(records)
        state.setdefault(default, [])
        world[name] = {"state": state, "audit": {"calls": []}}
    return world


def _collection(state, path, service):
    for part in path.lower().strip("/").split("/")[1:]:
        if part in state:
            return part
        if part + "s" in state:
            return part + "s"
    return DEFAULT_COLLECTION.get(service, next(iter(state), "records"))


def _id_args(args):
    return {k: v for k, v in args.items() if (k == "id" or k.endswith("_id")) and isinstance(v, (str, int))}


def _id_key(records, collection):
    for record in records:
        for key in record:
            if key == "id" or key.endswith("_id"):
                return key
    return collection.rstrip("s") + "_id"


def _find(records, ids, what):
    for record in records:
        for key, value in ids.items():
            candidates = [record.get(key), record.get("id")] + [v for k, v in record.items() if k.endswith("_id")]
            if any(c is not None and str(c) == str(value) for c in candidates):
                return record
    shown = ", ".join(f"{k}={v!r}" for k, v in ids.items()) or "no id given"
    raise tools.ToolError(f"no {what} with {shown}")


def _text(value):
    if isinstance(value, (dict, list)):
        return json.dumps(value, ensure_ascii=False)
    return "" if value is None else str(value)


def _listing(records, args):
    found = []
    query = next((str(args[k]) for k in SEARCH_ARGS if args.get(k) not in (None, "")), "")
    fields = {key for record in records for key in record}
    # an argument that names a field of these records filters by it; others (days_back) do not
    wanted = {
        key: _text(value).lower()
        for key, value in args.items()
        if key in fields and key not in SEARCH_ARGS and isinstance(value, (str, int, float, bool))
    }
    for record in records:
        if query and query.lower() not in _text(record).lower():
            continue
        if any(_text(record.get(key)).lower() != value for key, value in wanted.items()):
            continue
        found.append(record)
    limit = next((args[k] for k in LIMIT_ARGS if isinstance(args.get(k), int) and args[k] > 0), None)
    return found[:limit] if limit else found


def _record(entry, status, reply):
    body = reply if len(json.dumps(reply, ensure_ascii=False)) <= RESPONSE_CHARS else {"truncated": True}
    entry.update({"status": status, "response_body": body})


def call(world, service, path, method, args, changes):
    """One call of a Claw-Eval endpoint on the world: its result, audited in the service's
    ``calls`` and action lists (a refused call raises ``ToolError``, audited too)."""
    store = world.setdefault("claw_eval", {}).setdefault(service, {"state": {}, "audit": {"calls": []}})
    state, audit = store["state"], store["audit"]
    entry = {"endpoint": path, "method": method, "request_body": copy.deepcopy(args)}
    audit.setdefault("calls", []).append(entry)
    try:
        result = _perform(state, audit, service, path, args, changes)
    except tools.ToolError as exc:
        _record(entry, exc.status, {"error": str(exc)})
        raise
    _record(entry, 200, result)
    return result


def _log(audit, key, record, changes, service):
    audit.setdefault(key, []).append(copy.deepcopy(record))
    changes.add("insert", f"claw_eval.{service}.audit.{key}", len(audit[key]) - 1, None, record)


def _perform(state, audit, service, path, args, changes):
    action = verb(path)
    collection = _collection(state, path, service)
    records = state.setdefault(collection, [])
    if action == "list":
        found = _listing(records, args)
        return {collection: found, "total": len(found)}
    if action == "get":
        return _find(records, _id_args(args), collection.rstrip("s"))
    if action == "send":
        message = dict(args)
        message.setdefault("message_id", f"sent_{len(audit.get('sent', [])) + 1:03d}")
        _log(audit, "sent", message, changes, service)
        return {"status": "sent", "message_id": message["message_id"]}
    if action == "draft":
        draft = dict(args)
        draft.setdefault("draft_id", f"draft_{len(audit.get('drafts', [])) + 1:03d}")
        _log(audit, "drafts", draft, changes, service)
        return {"status": "saved", "draft_id": draft["draft_id"]}
    if action == "create":
        record = dict(args)
        key = _id_key(records, collection)
        if key not in record:
            record[key] = f"{collection.rstrip('s')}_{len(records) + 1:03d}"
        records.append(record)
        _log(audit, f"created_{collection}", record, changes, service)
        return {"status": "created", key: record[key], collection.rstrip("s"): record}
    target = _find(records, _id_args(args), collection.rstrip("s"))
    if action == "delete":
        records.remove(target)
        _log(audit, f"deleted_{collection}", target, changes, service)
        return {"status": "deleted"}
    before = copy.deepcopy(target)
    ids = _id_args(args)
    target.update({k: v for k, v in args.items() if k not in ids})
    last = path.rstrip("/").rsplit("/", 1)[-1].lower()
    if last == "complete":
        target["status"] = "completed"
    _log(audit, f"updated_{collection}", {"before": before, "after": target}, changes, service)
    return {"status": "updated", collection.rstrip("s"): target}


def register(config, handlers):
    """Claw-Eval's tools into ``tools.TOOLS`` (``config["tools"]``: name, service, path, method,
    description, schema), each answered by ``call``; ``handlers`` maps (path, method) to the tool."""
    for spec in config.get("tools") or []:
        service, path, method = spec["service"], spec["path"], spec["method"]

        def fn(world, args, changes, service=service, path=path, method=method):
            return call(world, service, path, method, args, changes)

        tools.TOOLS[spec["name"]] = {
            "description": spec["description"],
            "schema": spec["schema"],
            "mutates": mutates(path),
            "fn": fn,
            "loose": True,  # Claw-Eval's JSON Schemas go beyond the catalogue's subset: checked loosely
        }
        handlers[(path, method.upper())] = spec["name"]
