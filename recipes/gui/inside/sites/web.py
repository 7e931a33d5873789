"""A very small web framework for the bundled sites (stdlib only; runs inside the sandbox).

A site is an ``App``: routes (method, path regex, handler), ``reset(seed)`` and ``state()``.
``serve`` runs it on a loopback port with the control endpoints every site has:

* ``GET /__health``: ``ok`` once the site answers;
* ``GET /__reset?seed=N&nonce=..&sig=..``: back to the seeded initial state;
* ``GET /__state?nonce=..&sig=..``: what a grader checks, as JSON, signed (``X-Orchard-Signature``).

The two control endpoints answer only requests signed with the sandbox's key (see
``common``), so neither the browser nor a process of the agent can reset or read the
grader's view. Every change of state (a POST) must come from the episode's browser: it
carries a cookie only the driver and the sites can compute, and the agent's own HTTP
requests (curl, python) are refused.
"""

# HTML and messages are %-templates: long templates read better with positional fields.
# ruff: noqa: UP031

import hashlib
import hmac
import html
import json
import re
import threading
import traceback
import urllib.parse
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from common import sign, signed_request_ok

BROWSER_COOKIE = "orchard_browser"


def browser_token(key):
    """The cookie value the driver sets in its browser; derived, so both ends know it."""
    return hmac.new(key, b"browser-cookie", hashlib.sha256).hexdigest()[:32]


def esc(value):
    return html.escape(str(value), quote=True)


class Request:
    def __init__(self, method, path, query, form, cookies):
        self.method = method
        self.path = path
        self.query = query
        self.form = form
        self.cookies = cookies

    def arg(self, name, default=""):
        values = self.query.get(name) or self.form.get(name)
        return values[0].strip() if values else default

    def field(self, name, default=""):
        values = self.form.get(name)
        return values[0].strip() if values else default


class Response:
    def __init__(self, body="", status=200, content_type="text/html; charset=utf-8", headers=None):
        self.body = body.encode() if isinstance(body, str) else body
        self.status = status
        self.content_type = content_type
        self.headers = headers or {}


def redirect(location):
    return Response("", 303, headers={"Location": location})


STYLE = """
body{font-family:'DejaVu Sans',Arial,sans-serif;margin:0;color:#1d2329;background:#f6f7f9;font-size:15px}
header{background:#24476b;color:#fff;padding:10px 24px;display:flex;gap:24px;align-items:center}
header a{color:#fff;text-decoration:none;font-weight:bold} header nav a{font-weight:normal;margin-right:14px}
main{max-width:1100px;margin:0 auto;padding:16px 24px;background:#fff;min-height:600px}
table{border-collapse:collapse;margin:8px 0} th,td{border:1px solid #cfd6de;padding:4px 10px;text-align:left}
th{background:#eef2f6} .error{color:#b00020;font-weight:bold} .ok{color:#1b7f3b;font-weight:bold}
.grid{display:grid;grid-template-columns:repeat(4,1fr);gap:12px} .card{border:1px solid #dde3ea;padding:10px;border-radius:6px}
.price{font-weight:bold;color:#24476b} label{display:block;margin:6px 0 2px} .muted{color:#66727e;font-size:13px}
button,input[type=submit]{background:#24476b;color:#fff;border:0;padding:6px 14px;border-radius:4px;cursor:pointer}
[role=tablist] button{background:#dde3ea;color:#1d2329} [role=tablist] button[aria-selected=true]{background:#24476b;color:#fff}
aside{float:left;width:210px;margin-right:20px} .pager a{margin-right:8px}
"""

TABS_SCRIPT = """
document.querySelectorAll('[role=tablist]').forEach(function(list){
  list.querySelectorAll('[role=tab]').forEach(function(tab){
    tab.addEventListener('click', function(){
      list.querySelectorAll('[role=tab]').forEach(function(t){
        var on = t === tab; t.setAttribute('aria-selected', on ? 'true' : 'false');
        document.getElementById(t.getAttribute('aria-controls')).hidden = !on;
      });
    });
  });
});
document.querySelectorAll('[data-open-dialog]').forEach(function(b){
  b.addEventListener('click', function(){ document.getElementById(b.dataset.openDialog).showModal(); });
});
document.querySelectorAll('[data-close-dialog]').forEach(function(b){
  b.addEventListener('click', function(){ b.closest('dialog').close(); });
});
"""


def layout(site_title, nav, title, body):
    links = "".join('<a href="%s">%s</a>' % (esc(href), esc(text)) for href, text in nav)
    return (
        "<!doctype html><html lang=en><head><meta charset=utf-8><title>%s - %s</title><style>%s</style></head>"
        '<body><header><a href="/">%s</a><nav>%s</nav></header><main>%s</main><script>%s</script></body></html>'
        % (esc(title), esc(site_title), STYLE, esc(site_title), links, body, TABS_SCRIPT)
    )


def tabs(name, panels):
    """A tab widget: panels is a list of (label, html); the first is shown."""
    buttons, bodies = [], []
    for index, (label, content) in enumerate(panels):
        tab_id, panel_id = "%s-tab-%d" % (name, index), "%s-panel-%d" % (name, index)
        selected = "true" if index == 0 else "false"
        buttons.append(
            '<button type=button role=tab id="%s" aria-controls="%s" aria-selected="%s">%s</button>'
            % (tab_id, panel_id, selected, esc(label))
        )
        hidden = "" if index == 0 else " hidden"
        bodies.append(
            '<div role=tabpanel id="%s" aria-labelledby="%s"%s>%s</div>' % (panel_id, tab_id, hidden, content)
        )
    return '<div role=tablist aria-label="%s">%s</div>%s' % (esc(name), "".join(buttons), "".join(bodies))


def options(values, selected="", blank=None):
    out = ['<option value="">%s</option>' % esc(blank)] if blank is not None else []
    for value in values:
        value, label = value if isinstance(value, tuple) else (value, value)
        mark = " selected" if str(value) == str(selected) else ""
        out.append('<option value="%s"%s>%s</option>' % (esc(value), mark, esc(label)))
    return "".join(out)


class App:
    """A site: subclasses fill ``routes`` and implement ``reset`` and ``state``."""

    name = "site"
    title = "Site"
    nav = []

    def __init__(self):
        self.lock = threading.Lock()
        self.routes = []  # (method, compiled regex, handler)

    def route(self, method, pattern, handler):
        self.routes.append((method, re.compile("^" + pattern + "$"), handler))

    def page(self, title, body):
        return Response(layout(self.title, self.nav, title, body))

    def not_found(self, what="page"):
        return Response(
            layout(self.title, self.nav, "Not found", "<h1>Not found</h1><p>No such %s.</p>" % esc(what)), 404
        )

    def reset(self, seed):
        raise NotImplementedError

    def state(self):
        raise NotImplementedError


def make_handler(app, key):
    token = browser_token(key)

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):  # quiet: the log is for errors
            pass

        def _send(self, response):
            self.send_response(response.status)
            self.send_header("Content-Type", response.content_type)
            self.send_header("Content-Length", str(len(response.body)))
            self.send_header("Cache-Control", "no-store")
            for name, value in response.headers.items():
                self.send_header(name, value)
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(response.body)

        def _control(self, path, query):
            nonce = (query.get("nonce") or [""])[0]
            signature = (query.get("sig") or [""])[0]
            if path == "/__health":
                return Response("ok", content_type="text/plain")
            what = path[3:]
            if path == "/__reset":
                what += ":" + (query.get("seed") or ["0"])[0]
            if not nonce or not signed_request_ok(key, nonce, what, signature):
                return Response("forbidden: control endpoints answer only the grader", 403, "text/plain")
            with app.lock:
                if path == "/__reset":
                    app.reset(int((query.get("seed") or ["0"])[0]))
                    body = b'{"reset": true}'
                else:
                    body = json.dumps(app.state(), sort_keys=True).encode()
            return Response(body, 200, "application/json", {"X-Orchard-Signature": sign(key, nonce, body)})

        def _handle(self, method):
            url = urllib.parse.urlsplit(self.path)
            query = urllib.parse.parse_qs(url.query, keep_blank_values=True)
            try:
                if url.path.startswith("/__"):
                    if url.path not in ("/__health", "/__reset", "/__state") or method != "GET":
                        return self._send(app.not_found())
                    return self._send(self._control(url.path, query))
                form = {}
                if method == "POST":
                    length = int(self.headers.get("Content-Length") or 0)
                    form = urllib.parse.parse_qs(
                        self.rfile.read(length).decode("utf-8", "replace"), keep_blank_values=True
                    )
                cookies = {}
                for part in (self.headers.get("Cookie") or "").split(";"):
                    name, _, value = part.strip().partition("=")
                    cookies[name] = value
                if method == "POST" and not hmac.compare_digest(cookies.get(BROWSER_COOKIE, ""), token):
                    return self._send(
                        Response("forbidden: changes are accepted only from the browser", 403, "text/plain")
                    )
                request = Request(method, url.path, query, form, cookies)
                for route_method, pattern, handler in app.routes:
                    match = pattern.match(url.path)
                    if match and route_method == method:
                        with app.lock:
                            return self._send(handler(request, *match.groups()))
                return self._send(app.not_found())
            except Exception:
                traceback.print_exc()
                return self._send(Response("internal error", 500, "text/plain"))

        def do_GET(self):
            self._handle("GET")

        def do_POST(self):
            self._handle("POST")

    return Handler


def serve(app, port, key):
    """Start the site on 127.0.0.1:port in a thread; returns the server."""
    server = ThreadingHTTPServer(("127.0.0.1", port), make_handler(app, key))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, name=app.name, daemon=True).start()
    return server
