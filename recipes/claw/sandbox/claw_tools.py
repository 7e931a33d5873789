"""The Claw tool catalogue: every mock service's tools over one JSON "world", run INSIDE the
sandbox by ``claw_server.py`` and imported by the controller for the catalogue and the
argument validator.

Standard library only (any python3 >= 3.8). A tool is a function ``(world, args, changes)
-> result`` registered with ``@tool("service.name", summary, mutates=..., **params)``; it
raises ``ToolError`` for a call the service refuses, and records what it changed in
``changes`` (the audit). ``TOOLS``, ``SERVICES``, ``EMPTY_WORLD`` and ``catalogue`` are what
the server and the controller read.
"""

import re

if __package__:  # in the sandbox the files next to this one win over any installed orchard_async
    from orchard_async.recipes.claw.sandbox import claw_user  # the controller imports this file as part of its package
else:
    import claw_user  # in the sandbox, next to this file

AUDIT_VALUE_CHARS = 2000  # characters of a string kept in an audit entry's before/after

# -- JSON Schema (the subset the catalogue uses) ------------------------------------------------

SCALAR_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool}


def schema_problem(schema):
    """Why ``schema`` is not a JSON Schema this catalogue can use (None when it is)."""
    if not isinstance(schema, dict) or schema.get("type") != "object":
        return "the schema must be an object schema ({'type': 'object', ...})"
    props = schema.get("properties", {})
    if not isinstance(props, dict):
        return "'properties' must be a mapping"
    for name, prop in props.items():
        if not isinstance(prop, dict):
            return f"property {name!r} must be a mapping"
        kind = prop.get("type")
        if kind not in SCALAR_TYPES:
            return "property {!r} has type {!r}; use one of {}".format(name, kind, ", ".join(SCALAR_TYPES))
        enum = prop.get("enum")
        if enum is not None and (not isinstance(enum, list) or not enum):
            return f"property {name!r}: 'enum' must be a non-empty list"
    required = schema.get("required", [])
    if not isinstance(required, list) or any(r not in props for r in required):
        return "'required' must list names of properties"
    return None


def validate(schema, args):
    """Why ``args`` do not fit ``schema`` (None when they do). Unknown arguments are errors."""
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    props = schema.get("properties", {})
    for name in schema.get("required", []):
        if args.get(name) is None:
            return f"missing required argument {name!r}"
    for name, value in args.items():
        if name not in props:
            return "unknown argument {!r} (this tool takes: {})".format(name, ", ".join(props) or "nothing")
        if value is None:
            continue
        prop = props[name]
        kind = SCALAR_TYPES[prop["type"]]
        if isinstance(value, bool) and prop["type"] != "boolean" or not isinstance(value, kind):
            return "argument {!r} must be a {}, got {!r}".format(name, prop["type"], value)
        if "enum" in prop and value not in prop["enum"]:
            return "argument {!r} must be one of {}, got {!r}".format(name, ", ".join(map(str, prop["enum"])), value)
    return None


JSON_TYPES = {
    "string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list, "object": dict, "null": type(None),
}  # fmt: skip


def validate_loose(schema, args):
    """Why ``args`` do not fit a task's own JSON Schema (None when they do): the required
    arguments and the top-level types; unknown arguments pass (Claw-Eval's services ignore them)."""
    if not isinstance(args, dict):
        return "arguments must be a JSON object"
    props = schema.get("properties") or {}
    for name in schema.get("required") or []:
        if args.get(name) is None:
            return f"missing required argument {name!r}"
    for name, value in args.items():
        kinds = (props.get(name) or {}).get("type")
        if value is None or kinds is None:
            continue
        kinds = kinds if isinstance(kinds, list) else [kinds]
        wanted: list = []
        for kind in kinds:
            found = JSON_TYPES.get(kind, object)
            wanted += list(found) if isinstance(found, tuple) else [found]
        if isinstance(value, bool) and "boolean" not in kinds or not isinstance(value, tuple(wanted)):
            return "argument {!r} must be {}, got {!r}".format(name, " or ".join(map(str, kinds)), value)
    return None


# -- the catalogue --------------------------------------------------------------------------------

TOOLS = {}  # "service.tool" -> {"description", "schema", "mutates", "fn"}


def tool(qualified, summary, mutates=False, **params):
    """Register a tool. ``params``: name -> (type, description) or (type, description, extra),
    a trailing ``!`` on the type marks the argument required."""

    def register(fn):
        props, required = {}, []
        for pname, spec in params.items():
            kind, desc = spec[0], spec[1]
            if kind.endswith("!"):
                kind = kind[:-1]
                required.append(pname)
            prop = {"type": kind, "description": desc}
            if len(spec) > 2:
                prop.update(spec[2])
            props[pname] = prop
        schema = {"type": "object", "properties": props, "required": required, "additionalProperties": False}
        TOOLS[qualified] = {"description": summary, "schema": schema, "mutates": mutates, "fn": fn}
        return fn

    return register


class ToolError(Exception):
    """The call was understood and refused (not found, bad value): a 4xx for the agent."""

    def __init__(self, message, status=404):
        Exception.__init__(self, message)
        self.status = status


class Changes:
    """The state changes of one call, for its audit entry."""

    def __init__(self):
        self.items = []

    def add(self, op, where, key, before=None, after=None):
        self.items.append({"op": op, "at": where, "key": key, "before": clip(before), "after": clip(after)})


def clip(value):
    if isinstance(value, str) and len(value) > AUDIT_VALUE_CHARS:
        return value[:AUDIT_VALUE_CHARS] + f"...[{len(value)} chars]"
    if isinstance(value, dict):
        return {k: clip(v) for k, v in value.items()}
    if isinstance(value, list):
        return [clip(v) for v in value]
    return value


def _find(items, key, value, what):
    for item in items:
        if item.get(key) == value:
            return item
    raise ToolError(f"no {what} with {key} {value!r}")


def _new_id(items, prefix):
    used = {str(item.get("id")) for item in items}
    n = len(items) + 1
    while f"{prefix}{n}" in used:
        n += 1
    return f"{prefix}{n}"


def _split(text):
    return [part.strip() for part in (text or "").split(",") if part.strip()]


def _matches(record, query, fields):
    query = (query or "").lower()
    return not query or any(query in str(record.get(f, "")).lower() for f in fields)


def _update(record, fields, where, changes):
    for name, value in fields.items():
        if value is not None and record.get(name) != value:
            changes.add(
                "update", where, "{}.{}".format(record.get("id", record.get("path")), name), record.get(name), value
            )
            record[name] = value


# mail ---------------------------------------------------------------------------------------------

FOLDERS = ["inbox", "sent", "drafts", "trash"]


@tool(
    "mail.list",
    "List messages in a mail folder, newest first (id, from, to, subject, date, unread).",
    folder=("string", "folder to list", {"enum": FOLDERS}),
    unread=("boolean", "only unread messages"),
    query=("string", "only messages whose sender, subject or body contains this text"),
)
def mail_list(world, args, changes):
    box = world["mail"]
    messages = box.get(args.get("folder") or "inbox", [])
    found = [
        m
        for m in messages
        if (not args.get("unread") or m.get("unread")) and _matches(m, args.get("query"), ("from", "subject", "body"))
    ]
    found.sort(key=lambda m: m.get("date", ""), reverse=True)
    keys = ("id", "from", "to", "subject", "date", "unread")
    return [{k: m.get(k) for k in keys if k in m} for m in found]


@tool("mail.read", "Read one message (marks it read).", mutates=True, id=("string!", "message id"))
def mail_read(world, args, changes):
    for folder in FOLDERS:
        for message in world["mail"].get(folder, []):
            if message.get("id") == args["id"]:
                if message.get("unread"):
                    _update(message, {"unread": False}, "mail." + folder, changes)
                return message
    raise ToolError("no message with id {!r}".format(args["id"]))


def _outgoing(world, folder, args, changes, body):
    box = world["mail"].setdefault(folder, [])
    message = {
        "id": _new_id(box, folder[0]),
        "from": world["mail"].get("me", "me@example.com"),
        "to": _split(args["to"]),
        "cc": _split(args.get("cc")),
        "subject": args.get("subject") or "",
        "body": body,
        "date": world.get("now", "2026-01-01T09:00"),
    }
    if args.get("in_reply_to"):
        message["in_reply_to"] = args["in_reply_to"]
    if not message["to"]:
        raise ToolError("'to' names no address", 400)
    box.append(message)
    changes.add("insert", "mail." + folder, message["id"], None, message)
    return {"id": message["id"], "to": message["to"]}


@tool(
    "mail.send",
    "Send an email.",
    mutates=True,
    to=("string!", "recipient addresses, comma-separated"),
    subject=("string!", "subject line"),
    body=("string!", "message text"),
    cc=("string", "cc addresses, comma-separated"),
    in_reply_to=("string", "id of the message this answers"),
)
def mail_send(world, args, changes):
    return _outgoing(world, "sent", args, changes, args["body"])


@tool(
    "mail.draft",
    "Save an email as a draft without sending it.",
    mutates=True,
    to=("string!", "recipient addresses, comma-separated"),
    subject=("string!", "subject line"),
    body=("string!", "message text"),
    in_reply_to=("string", "id of the message this answers"),
)
def mail_draft(world, args, changes):
    return _outgoing(world, "drafts", args, changes, args["body"])


@tool(
    "mail.forward",
    "Forward a message to other recipients.",
    mutates=True,
    id=("string!", "id of the message to forward"),
    to=("string!", "recipient addresses, comma-separated"),
    note=("string", "text to put above the forwarded message"),
)
def mail_forward(world, args, changes):
    original = mail_read(world, {"id": args["id"]}, Changes())
    body = (args.get("note") or "") + "\n\n---------- Forwarded message ----------\n" + original.get("body", "")
    fwd = {"to": args["to"], "subject": "Fwd: " + original.get("subject", ""), "in_reply_to": args["id"]}
    return _outgoing(world, "sent", fwd, changes, body)


@tool("mail.delete", "Move a message to the trash.", mutates=True, id=("string!", "message id"))
def mail_delete(world, args, changes):
    for folder in ("inbox", "sent", "drafts"):
        box = world["mail"].get(folder, [])
        for index, message in enumerate(box):
            if message.get("id") == args["id"]:
                box.pop(index)
                world["mail"].setdefault("trash", []).append(message)
                changes.add("move", "mail." + folder, args["id"], folder, "trash")
                return {"id": args["id"], "moved_to": "trash"}
    raise ToolError("no message with id {!r}".format(args["id"]))


# calendar -----------------------------------------------------------------------------------------


def _overlaps(start, end, other_start, other_end):
    return start < other_end and other_start < end


@tool(
    "calendar.list",
    "List my events that overlap a time range (ISO times like 2026-03-12T10:00).",
    start=("string", "range start"),
    end=("string", "range end"),
)
def calendar_list(world, args, changes):
    start, end = args.get("start") or "", args.get("end") or "9999"
    events = [e for e in world["calendar"].get("events", []) if _overlaps(start, end, e["start"], e["end"])]
    return sorted(events, key=lambda e: e["start"])


@tool(
    "calendar.freebusy",
    "Busy intervals of people on one day (mine included), to find a free slot.",
    date=("string!", "the day, YYYY-MM-DD"),
    attendees=("string", "email addresses, comma-separated (I am always included)"),
)
def calendar_freebusy(world, args, changes):
    cal, day = world["calendar"], args["date"]
    me = world["mail"].get("me", "me@example.com")
    result = {}
    for person in [me] + _split(args.get("attendees")):
        if person == me:
            spans = [[e["start"], e["end"]] for e in cal.get("events", []) if e.get("status") != "cancelled"]
        elif person in cal.get("busy", {}):
            spans = [list(span) for span in cal["busy"][person]]
        else:
            raise ToolError(f"no calendar is shared with {person!r}")
        result[person] = sorted(span for span in spans if span[0].startswith(day))
    return result


@tool(
    "calendar.create",
    "Create an event and invite its attendees.",
    mutates=True,
    title=("string!", "event title"),
    start=("string!", "start, like 2026-03-12T10:00"),
    end=("string!", "end, like 2026-03-12T11:00"),
    attendees=("string", "email addresses, comma-separated"),
    location=("string", "where"),
)
def calendar_create(world, args, changes):
    if not args["start"] < args["end"]:
        raise ToolError("the event must end after it starts", 400)
    events = world["calendar"].setdefault("events", [])
    event = {
        "id": _new_id(events, "ev"),
        "title": args["title"],
        "start": args["start"],
        "end": args["end"],
        "attendees": _split(args.get("attendees")),
        "location": args.get("location") or "",
        "status": "confirmed",
    }
    events.append(event)
    changes.add("insert", "calendar.events", event["id"], None, event)
    return event


@tool("calendar.cancel", "Cancel one of my events.", mutates=True, id=("string!", "event id"))
def calendar_cancel(world, args, changes):
    event = _find(world["calendar"].get("events", []), "id", args["id"], "event")
    _update(event, {"status": "cancelled"}, "calendar.events", changes)
    return event


@tool("calendar.invitations", "Invitations waiting for my answer (and those answered).")
def calendar_invitations(world, args, changes):
    return world["calendar"].get("invitations", [])


@tool(
    "calendar.respond",
    "Answer an invitation; accepting adds it to my events.",
    mutates=True,
    id=("string!", "invitation id"),
    response=("string!", "the answer", {"enum": ["accept", "decline", "tentative"]}),
    comment=("string", "a note to the organizer"),
)
def calendar_respond(world, args, changes):
    invitation = _find(world["calendar"].get("invitations", []), "id", args["id"], "invitation")
    _update(invitation, {"response": args["response"], "comment": args.get("comment")}, "calendar.invitations", changes)
    if args["response"] == "accept":
        events = world["calendar"].setdefault("events", [])
        event = {k: invitation.get(k) for k in ("title", "start", "end", "organizer")}
        event.update({"id": _new_id(events, "ev"), "status": "confirmed", "attendees": [invitation.get("organizer")]})
        events.append(event)
        changes.add("insert", "calendar.events", event["id"], None, event)
    return invitation


# contacts -----------------------------------------------------------------------------------------


@tool("contacts.search", "Find contacts by name, email, company or notes.", query=("string!", "text to look for"))
def contacts_search(world, args, changes):
    fields = ("name", "email", "company", "notes", "phone")
    return [c for c in world["contacts"].get("contacts", []) if _matches(c, args["query"], fields)]


@tool(
    "contacts.add",
    "Add a contact.",
    mutates=True,
    name=("string!", "full name"),
    email=("string!", "email address"),
    phone=("string", "phone number"),
    company=("string", "company"),
)
def contacts_add(world, args, changes):
    people = world["contacts"].setdefault("contacts", [])
    contact = {"id": _new_id(people, "c")}
    contact.update({k: v for k, v in args.items() if v is not None})
    people.append(contact)
    changes.add("insert", "contacts.contacts", contact["id"], None, contact)
    return contact


@tool(
    "contacts.update",
    "Change fields of a contact.",
    mutates=True,
    id=("string!", "contact id"),
    name=("string", "full name"),
    email=("string", "email address"),
    phone=("string", "phone number"),
    company=("string", "company"),
    notes=("string", "notes"),
)
def contacts_update(world, args, changes):
    contact = _find(world["contacts"].get("contacts", []), "id", args["id"], "contact")
    _update(contact, {k: v for k, v in args.items() if k != "id"}, "contacts.contacts", changes)
    return contact


# todo ---------------------------------------------------------------------------------------------


@tool("todo.list", "List to-do items.", status=("string", "which items", {"enum": ["open", "done", "all"]}))
def todo_list(world, args, changes):
    status = args.get("status") or "open"
    items = world["todo"].get("items", [])
    return [i for i in items if status == "all" or (status == "done") == bool(i.get("done"))]


@tool(
    "todo.add",
    "Add a to-do item.",
    mutates=True,
    title=("string!", "what to do"),
    due=("string", "due date, YYYY-MM-DD"),
    priority=("string", "priority", {"enum": ["low", "normal", "high"]}),
)
def todo_add(world, args, changes):
    items = world["todo"].setdefault("items", [])
    item = {
        "id": _new_id(items, "t"),
        "title": args["title"],
        "due": args.get("due") or "",
        "priority": args.get("priority") or "normal",
        "done": False,
    }
    items.append(item)
    changes.add("insert", "todo.items", item["id"], None, item)
    return item


@tool("todo.complete", "Mark a to-do item done.", mutates=True, id=("string!", "item id"))
def todo_complete(world, args, changes):
    item = _find(world["todo"].get("items", []), "id", args["id"], "to-do item")
    _update(item, {"done": True}, "todo.items", changes)
    return item


@tool("todo.delete", "Delete a to-do item for good.", mutates=True, id=("string!", "item id"))
def todo_delete(world, args, changes):
    items = world["todo"].get("items", [])
    item = _find(items, "id", args["id"], "to-do item")
    items.remove(item)
    changes.add("delete", "todo.items", item["id"], item, None)
    return {"deleted": item["id"]}


# notes --------------------------------------------------------------------------------------------


@tool(
    "notes.list", "List notes (id, title, tags).", query=("string", "only notes whose title, body or tags contain this")
)
def notes_list(world, args, changes):
    notes = world["notes"].get("notes", [])
    return [
        {k: n.get(k) for k in ("id", "title", "tags")}
        for n in notes
        if _matches(n, args.get("query"), ("title", "body", "tags"))
    ]


@tool("notes.read", "Read a note.", id=("string!", "note id"))
def notes_read(world, args, changes):
    return _find(world["notes"].get("notes", []), "id", args["id"], "note")


@tool(
    "notes.create",
    "Create a note.",
    mutates=True,
    title=("string!", "title"),
    body=("string!", "text"),
    tags=("string", "tags, comma-separated"),
)
def notes_create(world, args, changes):
    notes = world["notes"].setdefault("notes", [])
    note = {"id": _new_id(notes, "n"), "title": args["title"], "body": args["body"], "tags": _split(args.get("tags"))}
    notes.append(note)
    changes.add("insert", "notes.notes", note["id"], None, note)
    return note


@tool(
    "notes.append", "Append text to a note.", mutates=True, id=("string!", "note id"), text=("string!", "text to add")
)
def notes_append(world, args, changes):
    note = _find(world["notes"].get("notes", []), "id", args["id"], "note")
    _update(note, {"body": note.get("body", "") + "\n" + args["text"]}, "notes.notes", changes)
    return note


@tool("notes.delete", "Delete a note for good.", mutates=True, id=("string!", "note id"))
def notes_delete(world, args, changes):
    notes = world["notes"].get("notes", [])
    note = _find(notes, "id", args["id"], "note")
    notes.remove(note)
    changes.add("delete", "notes.notes", note["id"], note, None)
    return {"deleted": note["id"]}


# docs ---------------------------------------------------------------------------------------------


@tool(
    "docs.list",
    "List documents in the drive (path, size, shared_with).",
    folder=("string", "only paths under this folder"),
)
def docs_list(world, args, changes):
    folder = (args.get("folder") or "").strip("/")
    files = world["docs"].get("files", [])
    keep = [f for f in files if not folder or f["path"].startswith(folder + "/")]
    return [
        {"path": f["path"], "size": len(f.get("content", "")), "shared_with": f.get("shared_with", [])} for f in keep
    ]


@tool("docs.read", "Read a document of the drive.", path=("string!", "document path"))
def docs_read(world, args, changes):
    return _find(world["docs"].get("files", []), "path", args["path"], "document")


@tool(
    "docs.write",
    "Create or overwrite a document in the drive.",
    mutates=True,
    path=("string!", "document path"),
    content=("string!", "the whole text"),
)
def docs_write(world, args, changes):
    files = world["docs"].setdefault("files", [])
    for doc in files:
        if doc["path"] == args["path"]:
            _update(doc, {"content": args["content"]}, "docs.files", changes)
            return {"path": doc["path"], "size": len(doc["content"])}
    doc = {"path": args["path"], "content": args["content"], "shared_with": []}
    files.append(doc)
    changes.add("insert", "docs.files", doc["path"], None, doc)
    return {"path": doc["path"], "size": len(doc["content"])}


@tool("docs.delete", "Delete a document for good.", mutates=True, path=("string!", "document path"))
def docs_delete(world, args, changes):
    files = world["docs"].get("files", [])
    doc = _find(files, "path", args["path"], "document")
    files.remove(doc)
    changes.add("delete", "docs.files", doc["path"], doc, None)
    return {"deleted": doc["path"]}


@tool(
    "docs.share",
    "Share a document with someone.",
    mutates=True,
    path=("string!", "document path"),
    email=("string!", "who gets access"),
    role=("string", "access", {"enum": ["view", "edit"]}),
)
def docs_share(world, args, changes):
    doc = _find(world["docs"].get("files", []), "path", args["path"], "document")
    shared = list(doc.get("shared_with", []))
    entry = "{}:{}".format(args["email"], args.get("role") or "view")
    if entry not in shared:
        _update(doc, {"shared_with": shared + [entry]}, "docs.files", changes)
    return {"path": doc["path"], "shared_with": doc.get("shared_with", [])}


# helpdesk -----------------------------------------------------------------------------------------

TICKET_STATUS = ["open", "pending", "closed"]


@tool(
    "helpdesk.list",
    "List support tickets (id, customer, subject, status, priority).",
    status=("string", "which tickets", {"enum": TICKET_STATUS + ["all"]}),
    query=("string", "only tickets whose subject or body contains this"),
)
def helpdesk_list(world, args, changes):
    status = args.get("status") or "open"
    tickets = world["helpdesk"].get("tickets", [])
    keys = ("id", "customer", "subject", "status", "priority", "assignee")
    found = [
        t
        for t in tickets
        if (status == "all" or t.get("status") == status) and _matches(t, args.get("query"), ("subject", "body"))
    ]
    return [{k: t.get(k) for k in keys} for t in found]


@tool("helpdesk.read", "Read a ticket with its replies.", id=("string!", "ticket id"))
def helpdesk_read(world, args, changes):
    return _find(world["helpdesk"].get("tickets", []), "id", args["id"], "ticket")


@tool(
    "helpdesk.reply",
    "Reply to the customer on a ticket.",
    mutates=True,
    id=("string!", "ticket id"),
    message=("string!", "reply text"),
)
def helpdesk_reply(world, args, changes):
    ticket = _find(world["helpdesk"].get("tickets", []), "id", args["id"], "ticket")
    replies = list(ticket.get("replies", [])) + [args["message"]]
    _update(ticket, {"replies": replies}, "helpdesk.tickets", changes)
    return ticket


@tool(
    "helpdesk.update",
    "Change a ticket's status, priority or assignee.",
    mutates=True,
    id=("string!", "ticket id"),
    status=("string", "new status", {"enum": TICKET_STATUS}),
    priority=("string", "new priority", {"enum": ["low", "normal", "high", "urgent"]}),
    assignee=("string", "who handles it"),
)
def helpdesk_update(world, args, changes):
    ticket = _find(world["helpdesk"].get("tickets", []), "id", args["id"], "ticket")
    _update(ticket, {k: v for k, v in args.items() if k != "id"}, "helpdesk.tickets", changes)
    return ticket


@tool(
    "helpdesk.create",
    "Open a new ticket.",
    mutates=True,
    customer=("string!", "who it is for"),
    subject=("string!", "subject"),
    body=("string!", "description"),
    priority=("string", "priority", {"enum": ["low", "normal", "high", "urgent"]}),
)
def helpdesk_create(world, args, changes):
    tickets = world["helpdesk"].setdefault("tickets", [])
    ticket = {
        "id": _new_id(tickets, "T-"),
        "status": "open",
        "priority": args.get("priority") or "normal",
        "replies": [],
    }
    ticket.update({k: args[k] for k in ("customer", "subject", "body")})
    tickets.append(ticket)
    changes.add("insert", "helpdesk.tickets", ticket["id"], None, ticket)
    return ticket


# finance ------------------------------------------------------------------------------------------


@tool("finance.balance", "Balances of my accounts.")
def finance_balance(world, args, changes):
    return world["finance"].get("accounts", [])


@tool(
    "finance.transactions",
    "List transactions, optionally of one month and category.",
    month=("string", "YYYY-MM"),
    category=("string", "category name"),
)
def finance_transactions(world, args, changes):
    month, category = args.get("month") or "", (args.get("category") or "").lower()
    rows = world["finance"].get("transactions", [])
    return [
        t
        for t in rows
        if t.get("date", "").startswith(month) and (not category or t.get("category", "").lower() == category)
    ]


@tool("finance.invoices", "List invoices.", status=("string", "which invoices", {"enum": ["unpaid", "paid", "all"]}))
def finance_invoices(world, args, changes):
    status = args.get("status") or "unpaid"
    return [i for i in world["finance"].get("invoices", []) if status == "all" or i.get("status") == status]


def _debit(world, amount, changes):
    account = world["finance"].get("accounts", [{}])[0]
    if account.get("balance", 0) < amount:
        raise ToolError("insufficient funds", 409)
    _update(account, {"balance": round(account["balance"] - amount, 2)}, "finance.accounts", changes)


@tool("finance.pay", "Pay an invoice from the main account.", mutates=True, invoice_id=("string!", "invoice id"))
def finance_pay(world, args, changes):
    invoice = _find(world["finance"].get("invoices", []), "id", args["invoice_id"], "invoice")
    if invoice.get("status") == "paid":
        raise ToolError("invoice {} is already paid".format(invoice["id"]), 409)
    _debit(world, invoice["amount"], changes)
    _update(invoice, {"status": "paid"}, "finance.invoices", changes)
    return invoice


@tool(
    "finance.transfer",
    "Transfer money from the main account to another account.",
    mutates=True,
    to_account=("string!", "destination account (IBAN or name)"),
    amount=("number!", "amount"),
    memo=("string", "reference"),
)
def finance_transfer(world, args, changes):
    if args["amount"] <= 0:
        raise ToolError("the amount must be positive", 400)
    _debit(world, args["amount"], changes)
    transfers = world["finance"].setdefault("transfers", [])
    entry = {
        "id": _new_id(transfers, "x"),
        "to_account": args["to_account"],
        "amount": args["amount"],
        "memo": args.get("memo") or "",
    }
    transfers.append(entry)
    changes.add("insert", "finance.transfers", entry["id"], None, entry)
    return entry


# chat ---------------------------------------------------------------------------------------------


@tool("chat.channels", "List chat channels.")
def chat_channels(world, args, changes):
    return [
        {"name": c["name"], "topic": c.get("topic", ""), "messages": len(c.get("messages", []))}
        for c in world["chat"].get("channels", [])
    ]


@tool(
    "chat.history",
    "Recent messages of a channel.",
    channel=("string!", "channel name"),
    limit=("integer", "how many, newest last"),
)
def chat_history(world, args, changes):
    channel = _find(world["chat"].get("channels", []), "name", args["channel"].lstrip("#"), "channel")
    messages = channel.get("messages", [])
    return messages[-args["limit"] :] if args.get("limit") else messages


@tool(
    "chat.post",
    "Post a message to a channel.",
    mutates=True,
    channel=("string!", "channel name"),
    text=("string!", "message"),
)
def chat_post(world, args, changes):
    channel = _find(world["chat"].get("channels", []), "name", args["channel"].lstrip("#"), "channel")
    messages = channel.setdefault("messages", [])
    message = {"id": _new_id(messages, "m"), "user": "me", "text": args["text"]}
    messages.append(message)
    changes.add("insert", "chat.channels.{}".format(channel["name"]), message["id"], None, message)
    return message


@tool(
    "chat.dm",
    "Send a direct message to a person.",
    mutates=True,
    user=("string!", "user name"),
    text=("string!", "message"),
)
def chat_dm(world, args, changes):
    dms = world["chat"].setdefault("dms", [])
    message = {"id": _new_id(dms, "d"), "to": args["user"], "text": args["text"]}
    dms.append(message)
    changes.add("insert", "chat.dms", message["id"], None, message)
    return message


# web ----------------------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


@tool(
    "web.search",
    "Search the web (results: url, title, snippet).",
    query=("string!", "search words"),
    limit=("integer", "results, default 5"),
)
def web_search(world, args, changes):
    words = set(_WORD.findall(args["query"].lower()))
    scored = []
    for page in world["web"].get("pages", []):
        text = (page.get("title", "") + " " + page.get("text", "")).lower()
        score = sum(text.count(word) for word in words)
        if score:
            scored.append((-score, page["url"], page))
    scored.sort()
    return [
        {"url": p["url"], "title": p.get("title", ""), "snippet": p.get("text", "")[:160]}
        for _, _, p in scored[: args.get("limit") or 5]
    ]


@tool("web.fetch", "Fetch a web page's text.", url=("string!", "page address"))
def web_fetch(world, args, changes):
    return _find(world["web"].get("pages", []), "url", args["url"], "page")


# the simulated user and the final answer ----------------------------------------------------------


@tool(
    "user.ask", "Ask the user a question and wait for the answer.", mutates=True, question=("string!", "the question")
)
def user_ask(world, args, changes, model=None):
    """The scripted user, or with ``model`` (the controller's user model) a language model
    grounded in the script (claw_user.py)."""
    user = world["user"]
    asked = user.setdefault("asked", [])
    if user.get("model_failure"):
        raise ToolError("the simulated user is unavailable", 503)
    if len(asked) >= int(user.get("max_rounds", 3)):
        raise ToolError("the user has stopped answering questions", 429)
    if model:
        try:
            reply, confirms = claw_user.answer(user, args["question"], model)
        except claw_user.UserModelFailure as exc:
            changes.add("update", "user", "model_failure", None, str(exc))
            user["model_failure"] = str(exc)
            raise ToolError("the simulated user is unavailable", 503) from None
        entry = {"question": args["question"], "reply": reply, "confirms": confirms, "by": "model"}
        asked.append(entry)
        changes.add("insert", "user.asked", len(asked), None, entry)
        return {"reply": reply}
    question = args["question"].lower()
    reply, confirms = user.get("default_reply", "I have nothing to add; please go ahead as you see fit."), False
    for rule in user.get("script", []):
        if any(word.lower() in question for word in rule.get("when", [])):
            reply, confirms = rule["reply"], bool(rule.get("confirms"))
            break
    entry = {"question": args["question"], "reply": reply, "confirms": confirms}
    asked.append(entry)
    changes.add("insert", "user.asked", len(asked), None, entry)
    return {"reply": reply}


@tool(
    "agent.answer",
    "Give your final answer to the user (the last thing you do).",
    mutates=True,
    text=("string!", "the answer"),
)
def agent_answer(world, args, changes):
    changes.add("update", "agent", "answer", world.get("answer"), args["text"])
    world["answer"] = args["text"]
    return {"recorded": True}


ALWAYS_OFFERED = ("agent.answer",)
NO_FAULTS = ("agent.answer", "user.ask")  # the task's own channels, never the services under test
SERVICES = sorted({name.split(".")[0] for name in TOOLS})
EMPTY_WORLD = {
    "mail": {},
    "calendar": {},
    "contacts": {},
    "todo": {},
    "notes": {},
    "docs": {},
    "helpdesk": {},
    "finance": {},
    "chat": {},
    "web": {},
    "user": {},
}


def catalogue(offered=None):
    """The tools as function-calling definitions (name with a dot replaced by ``__``)."""
    names = [n for n in TOOLS if offered is None or n in offered or n in ALWAYS_OFFERED]
    return [{"name": n, "description": TOOLS[n]["description"], "parameters": TOOLS[n]["schema"]} for n in names]
