"""Orchard OS Community: a documentation wiki (navigation, search, tables, tabs) and a
forum (threads, replies, new threads). Answers must be read off its pages; posting
changes the state a grader reads. The seed shuffles the forum's vote counts only."""

# HTML and messages are %-templates: long templates read better with positional fields.
# ruff: noqa: UP031

import random
import urllib.parse

from web import App, esc, options, redirect, tabs

RELEASES = [
    ("1.0", "2019-04-02", "Acorn", "First public release"),
    ("1.4", "2019-11-19", "Bramble", "Wi-Fi roaming, new installer"),
    ("2.0", "2020-09-08", "Chestnut", "New kernel, 64-bit only"),
    ("2.1", "2021-03-23", "Damson", "Printing stack rewritten"),
    ("2.3", "2021-12-07", "Elderberry", "Encrypted home folders"),
    ("3.0", "2022-10-11", "Fig", "Wayland by default"),
    ("3.2", "2023-06-27", "Greengage", "Long-term support"),
    ("4.0", "2024-09-17", "Hawthorn", "ARM laptops supported"),
]
DEVICES = [
    ("Pinebook Pro", "ARM", 4, "yes", "no", "4.0"),
    ("ThinkPad X220", "x86-64", 16, "yes", "yes", "2.0"),
    ("Framework 13", "x86-64", 32, "yes", "yes", "3.0"),
    ("Raspberry Pi 4", "ARM", 8, "partial", "no", "4.0"),
    ("Dell XPS 13 (9310)", "x86-64", 16, "yes", "partial", "3.2"),
    ("MNT Reform", "ARM", 4, "yes", "no", "4.0"),
    ("HP EliteBook 840 G5", "x86-64", 32, "partial", "yes", "3.0"),
    ("Star LabTop Mk IV", "x86-64", 16, "yes", "yes", "3.2"),
]
ARTICLES = {
    "installation": (
        "Installation guide",
        "<p>Download the image, write it to a USB stick, and boot from it. The installer needs 20 GB of disk and 2 GB of memory.</p><p>Since release 1.4 the installer can join Wi-Fi networks.</p>",
    ),
    "releases": ("Release history", None),
    "hardware": ("Hardware compatibility", None),
    "printing": (
        "Printing",
        "<p>Printing uses the Tangle print service since release 2.1 (Damson). Run <code>tangle-setup</code> to add a printer.</p><p>If a printer is not detected after an upgrade, reinstall the driver package with <code>orchard-pkg reinstall tangle-drivers</code>.</p>",
    ),
    "encryption": (
        "Encrypted home folders",
        "<p>Home folders can be encrypted since release 2.3. The passphrase is asked for at login; it cannot be recovered if lost.</p>",
    ),
}
CATEGORIES = ["Announcements", "Hardware", "Software", "Installation help"]
THREADS = [
    (
        "Announcements",
        "Orchard OS 4.0 Hawthorn is out",
        "mira",
        ["Release notes are in the wiki. Thanks to everyone who tested!"],
    ),
    (
        "Hardware",
        "Printer not detected after upgrade",
        "kwame",
        ["After upgrading to 3.2 my Brother laser printer is gone from the list.", "Same here with an Epson inkjet."],
    ),
    ("Hardware", "Battery life on the Framework 13", "lotte", ["What battery life do you get? I see about 7 hours."]),
    (
        "Software",
        "Which text editor ships by default?",
        "ravi",
        ["I cannot find the editor in the menu.", "It is called Quill, look under Accessories."],
    ),
    (
        "Installation help",
        "Installer freezes at partitioning",
        "sam",
        ["The installer stops responding at the partitioning step on my desktop."],
    ),
    ("Software", "Dark mode for the file manager", "ana", ["Is there a dark theme for Grove, the file manager?"]),
]


class Forum(App):
    name = "forum"
    title = "Orchard OS Community"
    nav = [("/wiki", "Wiki"), ("/forum", "Forum"), ("/search", "Search")]

    def __init__(self):
        super().__init__()
        self.route("GET", "/", self.home)
        self.route("GET", "/wiki", self.wiki_index)
        self.route("GET", r"/wiki/([a-z-]+)", self.article)
        self.route("GET", "/search", self.search)
        self.route("GET", "/forum", self.forum_index)
        self.route("GET", r"/forum/thread/(\d+)", self.thread)
        self.route("POST", r"/forum/thread/(\d+)/reply", self.reply)
        self.route("GET", "/forum/new", self.new_thread_page)
        self.route("POST", "/forum/new", self.new_thread)
        self.reset(0)

    def reset(self, seed):
        rng = random.Random("forum-%d" % seed)
        self.threads = []
        for number, (category, title, author, posts) in enumerate(THREADS, start=1):
            self.threads.append(
                {
                    "id": number,
                    "category": category,
                    "title": title,
                    "author": author,
                    "votes": rng.randint(0, 60),
                    "posts": [
                        {"author": author if i == 0 else "guest%d" % (number * 10 + i), "body": body}
                        for i, body in enumerate(posts)
                    ],
                }
            )
        self.new_posts = []
        self.new_threads = []

    def state(self):
        return {"posts": self.new_posts, "threads": self.new_threads}

    def home(self, request):
        body = (
            "<h1>Orchard OS Community</h1><p>Documentation and discussion for Orchard OS.</p>"
            '<ul><li><a href="/wiki">Read the wiki</a></li><li><a href="/forum">Visit the forum</a></li></ul>'
        )
        return self.page("Home", body)

    def _sidebar(self):
        items = "".join(
            '<li><a href="/wiki/%s">%s</a></li>' % (slug, esc(title)) for slug, (title, _) in ARTICLES.items()
        )
        return '<aside><nav aria-label="Wiki pages"><h2>Pages</h2><ul>%s</ul></nav></aside>' % items

    def wiki_index(self, request):
        return self.page("Wiki", self._sidebar() + "<h1>Wiki</h1><p>Choose a page from the list.</p>")

    def article(self, request, slug):
        if slug not in ARTICLES:
            return self.not_found("wiki page")
        title, content = ARTICLES[slug]
        if slug == "releases":
            rows = "".join(
                "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s</td></tr>" % tuple(map(esc, r)) for r in RELEASES
            )
            content = (
                "<table><caption>Orchard OS releases</caption><tr><th>Version</th><th>Released</th><th>Codename</th><th>Highlights</th></tr>%s</table>"
                % rows
            )
        if slug == "hardware":
            by_arch = []
            for arch in ("x86-64", "ARM"):
                rows = "".join(
                    "<tr><td>%s</td><td>%d GB</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                    % (esc(d[0]), d[2], d[3], d[4], d[5])
                    for d in DEVICES
                    if d[1] == arch
                )
                by_arch.append(
                    (
                        arch,
                        "<table><tr><th>Device</th><th>RAM</th><th>Wi-Fi</th><th>Fingerprint reader</th><th>Supported since</th></tr>%s</table>"
                        % rows,
                    )
                )
            content = "<p>Tested devices, by processor architecture.</p>" + tabs("Architecture", by_arch)
        return self.page(title, self._sidebar() + "<article><h1>%s</h1>%s</article>" % (esc(title), content))

    def search(self, request):
        q = request.arg("q")
        results = []
        if q:
            for slug, (title, content) in ARTICLES.items():
                text = (
                    title
                    + " "
                    + (content or "")
                    + (" ".join(" ".join(r) for r in RELEASES) if slug == "releases" else "")
                    + (" ".join(d[0] for d in DEVICES) if slug == "hardware" else "")
                )
                if q.lower() in text.lower():
                    results.append('<li><a href="/wiki/%s">%s</a> (wiki)</li>' % (slug, esc(title)))
            for t in self.threads:
                if q.lower() in (t["title"] + " ".join(p["body"] for p in t["posts"])).lower():
                    results.append('<li><a href="/forum/thread/%d">%s</a> (forum)</li>' % (t["id"], esc(t["title"])))
        body = (
            '<h1>Search</h1><form action="/search" method=get role=search><label for=q>Search the wiki and forum</label>'
            '<input id=q name=q type=search value="%s"> <button type=submit>Search</button></form>%s'
            % (
                esc(q),
                ("<ul>%s</ul>" % "".join(results)) if results else ("<p>No results for %s.</p>" % esc(q) if q else ""),
            )
        )
        return self.page("Search", body)

    def forum_index(self, request):
        category = request.arg("category")
        rows = "".join(
            '<tr><td><a href="/forum/thread/%d">%s</a></td><td>%s</td><td>%s</td><td>%d</td><td>%d</td></tr>'
            % (t["id"], esc(t["title"]), esc(t["category"]), esc(t["author"]), len(t["posts"]), t["votes"])
            for t in self.threads
            if not category or t["category"] == category
        )
        body = (
            '<h1>Forum</h1><form action="/forum" method=get aria-label="Filter threads"><label for=category>Category</label>'
            "<select id=category name=category>%s</select> <button type=submit>Show</button></form>"
            "<table><tr><th>Thread</th><th>Category</th><th>Started by</th><th>Posts</th><th>Votes</th></tr>%s</table>"
            '<p><a href="/forum/new">Start a new thread</a></p>'
            % (options(CATEGORIES, category, "All categories"), rows)
        )
        return self.page("Forum", body)

    def _thread(self, number):
        number = int(number)
        return self.threads[number - 1] if 1 <= number <= len(self.threads) else None

    def thread(self, request, number, error=""):
        t = self._thread(number)
        if not t:
            return self.not_found("thread")
        posts = "".join(
            '<article aria-label="Post by %s"><p><strong>%s</strong> wrote:</p><p>%s</p></article><hr>'
            % (esc(p["author"]), esc(p["author"]), esc(p["body"]))
            for p in t["posts"]
        )
        body = (
            "<h1>%s</h1><p class=muted>%s · %d votes</p>%s%s"
            '<form action="/forum/thread/%d/reply" method=post aria-label=Reply><label for=body>Your reply</label>'
            "<textarea id=body name=body rows=4 cols=70></textarea><p><button type=submit>Post reply</button></p></form>"
            % (
                esc(t["title"]),
                esc(t["category"]),
                t["votes"],
                posts,
                "<p class=error role=alert>%s</p>" % esc(error) if error else "",
                t["id"],
            )
        )
        return self.page(t["title"], body)

    def reply(self, request, number):
        t = self._thread(number)
        if not t:
            return self.not_found("thread")
        text = request.field("body")
        if len(text) < 5:
            return self.thread(request, number, "A reply needs at least 5 characters.")
        post = {"author": "you", "body": text}
        t["posts"].append(post)
        self.new_posts.append({"thread_id": t["id"], "thread": t["title"], "body": text})
        return redirect("/forum/thread/%d" % t["id"])

    def new_thread_page(self, request, errors=(), values=None):
        values = values or {}
        error = "<ul class=error role=alert>%s</ul>" % "".join("<li>%s</li>" % esc(e) for e in errors) if errors else ""
        body = (
            '<h1>Start a new thread</h1>%s<form action="/forum/new" method=post aria-label="New thread">'
            '<label for=title>Title</label><input id=title name=title size=60 value="%s">'
            "<label for=category>Category</label><select id=category name=category>%s</select>"
            "<label for=body>Message</label><textarea id=body name=body rows=6 cols=70>%s</textarea>"
            "<p><button type=submit>Create thread</button></p></form>"
            % (
                error,
                esc(values.get("title", "")),
                options(CATEGORIES, values.get("category", ""), "Choose a category"),
                esc(values.get("body", "")),
            )
        )
        return self.page("New thread", body)

    def new_thread(self, request):
        values = {k: request.field(k) for k in ("title", "category", "body")}
        errors = []
        if len(values["title"]) < 5:
            errors.append("The title needs at least 5 characters.")
        if values["category"] not in CATEGORIES:
            errors.append("Choose a category.")
        if len(values["body"]) < 5:
            errors.append("The message needs at least 5 characters.")
        if errors:
            return self.new_thread_page(request, errors, values)
        number = len(self.threads) + 1
        self.threads.append(
            {
                "id": number,
                "category": values["category"],
                "title": values["title"],
                "author": "you",
                "votes": 0,
                "posts": [{"author": "you", "body": values["body"]}],
            }
        )
        self.new_threads.append(dict(values, id=number))
        return redirect("/forum/thread/%d?%s" % (number, urllib.parse.urlencode({"created": "1"})))
