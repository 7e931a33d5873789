"""Set-of-marks: numbered boxes on the elements an agent can act on, drawn into the screenshot
and listed with their boxes in the observation (stdlib only; runs inside the sandbox).

A mark's number is the element's id in the accessibility tree (its backend DOM node id), so
``click{element: N}`` acts on mark N and the tree, the marks and the actions share one id
space. Boxes are ``x,y,w,h`` in screenshot pixels (the viewport), listed so that a viewer
can draw them on the screenshot too.
"""

# The overlay script is a %-template (JS braces would need doubling in str.format).
# ruff: noqa: UP031

import json

INTERACTIVE_ROLES = {
    "button",
    "checkbox",
    "combobox",
    "link",
    "listbox",
    "menuitem",
    "menuitemcheckbox",
    "menuitemradio",
    "option",
    "radio",
    "searchbox",
    "slider",
    "spinbutton",
    "switch",
    "tab",
    "textbox",
    "Date",
    "DateTime",
    "InputTime",
}
MAX_MARKS = 80  # the list stays a small part of the step's text
OVERLAY_ID = "__orchard_marks"
COLORS = ("#d7263d", "#1b998b", "#2e86ab", "#f46036", "#6a4c93", "#c5283d", "#3a7d44", "#8f2d56")
DRAW = """(function(marks, colors, id) {
  const root = document.createElement('div');
  root.id = id;
  root.setAttribute('aria-hidden', 'true');
  root.style.cssText = 'position:fixed;left:0;top:0;width:0;height:0;z-index:2147483647;pointer-events:none';
  marks.forEach(function(mark, i) {
    const color = colors[i %% colors.length];
    const box = document.createElement('div');
    box.style.cssText = 'position:fixed;box-sizing:border-box;border:2px solid ' + color +
      ';left:' + mark[1] + 'px;top:' + mark[2] + 'px;width:' + mark[3] + 'px;height:' + mark[4] + 'px';
    const label = document.createElement('span');
    label.textContent = String(mark[0]);
    // Above the box, so the element's own text stays readable; inside it at the top of the page.
    label.style.cssText = 'position:absolute;left:-2px;top:' + (mark[2] >= 13 ? '-15px' : '-2px') +
      ';padding:0 2px;background:' + color + ';color:#fff;font:bold 11px/13px monospace';
    box.appendChild(label);
    root.appendChild(box);
  });
  (document.body || document.documentElement).appendChild(root);
})(%s, %s, %s)"""
REMOVE = "(function(el) { if (el) el.remove(); })(document.getElementById(%s))" % json.dumps(OVERLAY_ID)


def candidates(ax_nodes):
    """{backend node id: (role, name)} of the tree's nodes an agent can act on."""
    found = {}
    for node in ax_nodes:
        role = (node.get("role") or {}).get("value", "")
        backend = node.get("backendDOMNodeId")
        if node.get("ignored") or backend is None or role not in INTERACTIVE_ROLES:
            continue
        disabled = any(p["name"] == "disabled" and p["value"].get("value") for p in node.get("properties", []))
        if not disabled:
            found[backend] = (role, str((node.get("name") or {}).get("value", "")).strip())
    return found


def visible_boxes(snapshot, wanted, width, height):
    """[(id, x, y, w, h)] of the wanted nodes whose layout box shows in the viewport, from a
    ``DOMSnapshot.captureSnapshot`` of the main frame, in document order."""
    document = snapshot["documents"][0]
    backend_ids = document["nodes"]["backendNodeId"]
    layout = document["layout"]
    scroll_x, scroll_y = document.get("scrollOffsetX", 0), document.get("scrollOffsetY", 0)
    boxes, seen = [], set()
    for position, node_index in enumerate(layout["nodeIndex"]):
        backend, bounds = backend_ids[node_index], layout["bounds"][position]
        if backend not in wanted or backend in seen:
            continue
        x, y, w, h = bounds[0] - scroll_x, bounds[1] - scroll_y, bounds[2], bounds[3]
        left, top, right, bottom = max(x, 0), max(y, 0), min(x + w, width), min(y + h, height)
        if w < 1 or h < 1 or right - left < 1 or bottom - top < 1:
            continue  # no size, or outside the viewport
        seen.add(backend)
        boxes.append((backend, round(left), round(top), round(right - left), round(bottom - top)))
    return boxes


def find(cdp, session, ax_nodes, width, height):
    """The marks of the current page: [(id, role, name, x, y, w, h)], at most MAX_MARKS."""
    wanted = candidates(ax_nodes)
    if not wanted:
        return []
    snapshot = cdp.call("DOMSnapshot.captureSnapshot", {"computedStyles": []}, session)
    marks = []
    for backend, x, y, w, h in visible_boxes(snapshot, wanted, width, height)[:MAX_MARKS]:
        role, name = wanted[backend]
        marks.append((backend, role, name, x, y, w, h))
    return marks


def draw(cdp, session, marks):
    expression = DRAW % (
        json.dumps([[m[0], m[3], m[4], m[5], m[6]] for m in marks]),
        json.dumps(COLORS),
        json.dumps(OVERLAY_ID),
    )
    cdp.call("Runtime.evaluate", {"expression": expression}, session)


def remove(cdp, session):
    cdp.call("Runtime.evaluate", {"expression": REMOVE}, session)


def text(marks):
    """The observation's marks section: one mark a line, ``[id] role "name" x,y,w,h``."""
    lines = ["marks: %d (the number on a box is the element id; box x,y,w,h in pixels)" % len(marks)]
    for backend, role, name, x, y, w, h in marks:
        label = " " + json.dumps(name[:80], ensure_ascii=False) if name else ""
        lines.append("[%s] %s%s %d,%d,%d,%d" % (backend, role, label, x, y, w, h))
    return "\n".join(lines)
