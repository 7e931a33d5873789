"""Lakeside Clinic: appointment booking in three steps (choose, details, review), with a
date picker, selects, validation errors, a confirmation page, and cancelling through a
dialog. Which slots are taken, and two existing bookings, come from the seed."""

# HTML and messages are %-templates: long templates read better with positional fields.
# ruff: noqa: UP031

import datetime
import random
import re

from web import App, esc, options, redirect

SERVICES = ["General checkup", "Dental cleaning", "Physiotherapy", "Eye exam", "Vaccination"]
PRACTITIONERS = {
    "General checkup": ["Dr. Amara Okafor", "Dr. Felix Brandt"],
    "Dental cleaning": ["Dr. Ines Moreau"],
    "Physiotherapy": ["Jonas Lindqvist", "Priya Raman"],
    "Eye exam": ["Dr. Hugo Castell"],
    "Vaccination": ["Nurse Tomoko Hale"],
}
TIMES = ["09:00", "09:30", "10:00", "10:30", "11:00", "11:30", "14:00", "14:30", "15:00", "15:30", "16:00"]
FIRST_DAY = datetime.date(2026, 3, 2)
DAYS = 26  # bookable: 2026-03-02 .. 2026-03-27, weekdays only
EMAIL = re.compile(r"^[^@\s]+@[^@\s]+\.[a-z]{2,}$")
STEP1 = ("service", "practitioner", "date", "time")
STEP2 = ("name", "email", "phone", "first_visit", "notes")


def taken_slots(seed):
    """(practitioner, date, time) triples already booked by others, for a seed."""
    rng = random.Random("lakeside-%d" % seed)
    taken = set()
    for day in range(DAYS):
        date = (FIRST_DAY + datetime.timedelta(days=day)).isoformat()
        for names in PRACTITIONERS.values():
            for name in names:
                for time in TIMES:
                    if rng.random() < 0.35:
                        taken.add((name, date, time))
    return taken


class Booking(App):
    name = "booking"
    title = "Lakeside Clinic"
    nav = [("/book", "Book an appointment"), ("/bookings", "My bookings")]

    def __init__(self):
        super().__init__()
        self.route("GET", "/", self.home)
        self.route("GET", "/book", self.step1)
        self.route("POST", "/book/details", self.step2)
        self.route("POST", "/book/review", self.step3)
        self.route("POST", "/book/confirm", self.confirm)
        self.route("GET", r"/booking/([A-Z0-9-]+)", self.booking_page)
        self.route("GET", "/bookings", self.bookings_page)
        self.route("POST", r"/booking/([A-Z0-9-]+)/cancel", self.cancel)
        self.reset(0)

    def reset(self, seed):
        self.seed = seed
        self.taken = taken_slots(seed)
        self.rejected = 0
        self.bookings = []
        rng = random.Random("lakeside-existing-%d" % seed)
        for service in ("Eye exam", "Physiotherapy"):
            name = rng.choice(PRACTITIONERS[service])
            free = [(d, t) for d, t in self._all_slots() if (name, d, t) not in self.taken]
            date, time = rng.choice(free)
            self._add(
                {
                    "service": service,
                    "practitioner": name,
                    "date": date,
                    "time": time,
                    "name": "Dana Whitfield",
                    "email": "dana.whitfield@example.org",
                    "phone": "555-0142",
                    "first_visit": False,
                    "notes": "",
                }
            )

    def _all_slots(self):
        for day in range(DAYS):
            date = FIRST_DAY + datetime.timedelta(days=day)
            if date.weekday() < 5:
                for time in TIMES:
                    yield date.isoformat(), time

    def _add(self, values):
        ref = "LC-%d%03d" % (self.seed % 10, len(self.bookings) + 101)
        booking = dict(values, ref=ref, status="confirmed")
        self.bookings.append(booking)
        self.taken.add((values["practitioner"], values["date"], values["time"]))
        return booking

    def state(self):
        return {"bookings": self.bookings, "rejected_submissions": self.rejected}

    def home(self, request):
        body = (
            "<h1>Lakeside Clinic</h1><p>Book appointments online, Monday to Friday, 2 to 27 March 2026.</p>"
            '<ul><li><a href="/book">Book an appointment</a></li><li><a href="/bookings">My bookings</a></li></ul>'
        )
        return self.page("Home", body)

    def _hidden(self, values, keys):
        return "".join('<input type=hidden name="%s" value="%s">' % (k, esc(values.get(k, ""))) for k in keys)

    def _errors(self, errors):
        if not errors:
            return ""
        return "<div class=error role=alert><p>Please fix the following:</p><ul>%s</ul></div>" % "".join(
            "<li>%s</li>" % esc(e) for e in errors
        )

    def step1(self, request, errors=(), values=None):
        values = values or {k: request.arg(k) for k in STEP1}
        practitioners = [p for s in SERVICES for p in PRACTITIONERS[s]]
        body = (
            "<h1>Book an appointment</h1><p>Step 1 of 3: choose a service and a time.</p>%s"
            '<form action="/book/details" method=post aria-label="Choose a time">'
            "<label for=service>Service</label><select id=service name=service>%s</select>"
            "<label for=practitioner>Practitioner</label><select id=practitioner name=practitioner>%s</select>"
            '<label for=date>Date</label><input id=date name=date type=date min="2026-03-02" max="2026-03-27" value="%s">'
            "<label for=time>Time</label><select id=time name=time>%s</select>"
            "<p class=muted>Times already taken are refused on the next step.</p>"
            "<p><button type=submit>Continue</button></p></form>"
            % (
                self._errors(errors),
                options(SERVICES, values.get("service"), "Choose a service"),
                options(practitioners, values.get("practitioner"), "Choose a practitioner"),
                esc(values.get("date", "")),
                options(TIMES, values.get("time"), "Choose a time"),
            )
        )
        return self.page("Book an appointment", body)

    def _check_step1(self, v):
        errors = []
        if v["service"] not in PRACTITIONERS:
            errors.append("Choose a service.")
        elif v["practitioner"] not in PRACTITIONERS[v["service"]]:
            errors.append("%s does not offer %s." % (v["practitioner"] or "No practitioner chosen:", v["service"]))
        try:
            day = datetime.date.fromisoformat(v["date"])
            if not (FIRST_DAY <= day < FIRST_DAY + datetime.timedelta(days=DAYS)) or day.weekday() >= 5:
                errors.append("Choose a weekday between 2 and 27 March 2026.")
        except ValueError:
            errors.append("Choose a date.")
        if v["time"] not in TIMES:
            errors.append("Choose a time.")
        elif not errors and (v["practitioner"], v["date"], v["time"]) in self.taken:
            errors.append("%s is not available on %s at %s." % (v["practitioner"], v["date"], v["time"]))
        return errors

    def step2(self, request, errors=(), values=None):
        values = values or {k: request.field(k) for k in STEP1 + STEP2}
        if values is not None and not errors:
            step1_errors = self._check_step1(values)
            if step1_errors:
                self.rejected += 1
                return self.step1(request, step1_errors, values)
        checked = " checked" if values.get("first_visit") == "yes" else ""
        body = (
            "<h1>Your details</h1><p>Step 2 of 3: %s with %s on %s at %s.</p>%s"
            '<form action="/book/review" method=post aria-label="Your details">%s'
            '<label for=name>Full name</label><input id=name name=name value="%s">'
            '<label for=email>Email</label><input id=email name=email type=text value="%s">'
            '<label for=phone>Phone</label><input id=phone name=phone type=tel value="%s">'
            "<label><input type=checkbox name=first_visit value=yes%s> This is my first visit</label>"
            "<label for=notes>Notes for the practitioner</label><textarea id=notes name=notes rows=3>%s</textarea>"
            "<label><input type=checkbox name=consent value=yes> I agree to the clinic's cancellation policy</label>"
            "<p><button type=submit>Review booking</button></p></form>"
            % (
                esc(values["service"]),
                esc(values["practitioner"]),
                esc(values["date"]),
                esc(values["time"]),
                self._errors(errors),
                self._hidden(values, STEP1),
                esc(values.get("name", "")),
                esc(values.get("email", "")),
                esc(values.get("phone", "")),
                checked,
                esc(values.get("notes", "")),
            )
        )
        return self.page("Your details", body)

    def step3(self, request):
        values = {k: request.field(k) for k in STEP1 + STEP2}
        errors = self._check_step1(values)
        if errors:
            self.rejected += 1
            return self.step1(request, errors, values)
        if not values["name"]:
            errors.append("Full name is required.")
        if not EMAIL.match(values["email"]):
            errors.append("Enter a valid email address.")
        if len(re.sub(r"\D", "", values["phone"])) < 7:
            errors.append("Enter a phone number with at least 7 digits.")
        if request.field("consent") != "yes":
            errors.append("You must agree to the cancellation policy.")
        if errors:
            self.rejected += 1
            return self.step2(request, errors, values)
        rows = "".join(
            "<tr><th>%s</th><td>%s</td></tr>" % (esc(k.replace("_", " ").capitalize()), esc(values[k] or "-"))
            for k in STEP1 + STEP2
        )
        body = (
            "<h1>Review your booking</h1><p>Step 3 of 3.</p><table>%s</table>"
            '<form action="/book/confirm" method=post aria-label="Confirm booking">%s<button type=submit>Confirm booking</button></form>'
            '<form action="/book/details" method=post aria-label="Edit booking">%s<button type=submit>Edit details</button></form>'
            % (rows, self._hidden(values, STEP1 + STEP2), self._hidden(values, STEP1 + STEP2))
        )
        return self.page("Review your booking", body)

    def confirm(self, request):
        values = {k: request.field(k) for k in STEP1 + STEP2}
        errors = self._check_step1(values)
        if errors or not values["name"] or not EMAIL.match(values["email"]):
            self.rejected += 1
            return self.step1(request, errors or ["Your details were incomplete; start again."], values)
        values["first_visit"] = values["first_visit"] == "yes"
        booking = self._add(values)
        return redirect("/booking/" + booking["ref"])

    def _find(self, ref):
        for booking in self.bookings:
            if booking["ref"] == ref:
                return booking
        return None

    def booking_page(self, request, ref):
        b = self._find(ref)
        if not b:
            return self.not_found("booking")
        headline = (
            "Booking %s is confirmed" % b["ref"]
            if b["status"] == "confirmed"
            else "Booking %s was cancelled" % b["ref"]
        )
        body = '<h1 class=ok>%s</h1><p>%s with %s on %s at %s, for %s.</p><a href="/bookings">My bookings</a>' % (
            esc(headline),
            esc(b["service"]),
            esc(b["practitioner"]),
            esc(b["date"]),
            esc(b["time"]),
            esc(b["name"]),
        )
        return self.page(headline, body)

    def bookings_page(self, request):
        rows = []
        for b in self.bookings:
            action = ""
            if b["status"] == "confirmed":
                dialog = "cancel-" + b["ref"]
                action = (
                    '<button type=button data-open-dialog="%s">Cancel %s</button>'
                    '<dialog id="%s" aria-label="Cancel booking %s"><p>Cancel %s on %s at %s?</p>'
                    '<form action="/booking/%s/cancel" method=post><button type=submit>Yes, cancel it</button></form>'
                    "<button type=button data-close-dialog>Keep booking</button></dialog>"
                    % (dialog, b["ref"], dialog, b["ref"], esc(b["service"]), esc(b["date"]), esc(b["time"]), b["ref"])
                )
            rows.append(
                "<tr><td>%s</td><td>%s</td><td>%s</td><td>%s %s</td><td>%s</td><td>%s</td><td>%s</td></tr>"
                % (
                    b["ref"],
                    esc(b["service"]),
                    esc(b["practitioner"]),
                    esc(b["date"]),
                    esc(b["time"]),
                    esc(b["name"]),
                    esc(b["status"]),
                    action,
                )
            )
        body = (
            "<h1>My bookings</h1><table><tr><th>Reference</th><th>Service</th><th>Practitioner</th><th>When</th><th>Patient</th>"
            "<th>Status</th><th></th></tr>%s</table>" % "".join(rows)
        )
        return self.page("My bookings", body)

    def cancel(self, request, ref):
        b = self._find(ref)
        if not b:
            return self.not_found("booking")
        if b["status"] == "confirmed":
            b["status"] = "cancelled"
            self.taken.discard((b["practitioner"], b["date"], b["time"]))
        return redirect("/bookings")
