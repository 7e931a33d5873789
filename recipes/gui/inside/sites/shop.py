"""Northwind Outfitters: a shop in the WebShop mould (search, filters, sort, pages,
product options, cart, checkout). The catalog is generated from the seed."""

# HTML and messages are %-templates: long templates read better with positional fields.
# ruff: noqa: UP031

import random
import sqlite3
import urllib.parse as up

from web import App, esc, options, redirect, tabs

PER_PAGE = 12
CATEGORIES = {
    "Shoes": (
        ["Trail Runner", "Court Sneaker", "Hiking Boot", "Canvas Slip-On", "Leather Loafer"],
        ["40", "41", "42", "43", "44", "45"],
    ),
    "Jackets": (["Rain Shell", "Down Parka", "Fleece Jacket", "Wind Breaker", "Softshell"], ["S", "M", "L", "XL"]),
    "Bags": (["Daypack", "Messenger Bag", "Duffel", "Tote", "Laptop Sleeve"], []),
    "Kitchen": (["Chef Knife", "Cast Iron Skillet", "Pour-Over Kettle", "Cutting Board", "Espresso Grinder"], []),
    "Electronics": (["Wireless Earbuds", "Bluetooth Speaker", "Power Bank", "Smart Watch", "USB-C Hub"], []),
}
ADJECTIVES = [
    "Alpine",
    "Coastal",
    "Urban",
    "Summit",
    "Harbor",
    "Meadow",
    "Granite",
    "Aurora",
    "Cedar",
    "Falcon",
    "Glacier",
    "Willow",
]
BRANDS = ["Northwind", "Kestrel", "Bramble & Co", "Lumen", "Oakridge", "Tundra Works"]
COLORS = ["black", "blue", "green", "grey", "red", "tan", "white"]
SHIPPING = [("standard", "Standard (5-7 days, $4.99)"), ("express", "Express (1-2 days, $14.99)")]
SHIPPING_COST = {"standard": 4.99, "express": 14.99}


def generate_catalog(seed, count=300):
    """The products for a seed: a list of dicts, ids from 1, deterministic."""
    rng = random.Random("northwind-%d" % seed)
    products = []
    for pid in range(1, count + 1):
        category = rng.choice(sorted(CATEGORIES))
        nouns, sizes = CATEGORIES[category]
        brand = rng.choice(BRANDS)
        title = "%s %s %s" % (brand, rng.choice(ADJECTIVES), rng.choice(nouns))
        colors = sorted(rng.sample(COLORS, rng.randint(1, 3)))
        products.append(
            {
                "id": pid,
                "title": title,
                "brand": brand,
                "category": category,
                "price": round(rng.uniform(9, 260), 2),
                "rating": round(rng.uniform(2.5, 5.0), 1),
                "reviews": rng.randint(0, 400),
                "colors": colors,
                "sizes": list(sizes),
                "stock": rng.randint(0, 40),
            }
        )
    return products


class Shop(App):
    name = "shop"
    title = "Northwind Outfitters"
    nav = [("/search", "All products"), ("/cart", "Cart"), ("/orders", "Orders")]

    def __init__(self):
        super().__init__()
        self.db = sqlite3.connect(":memory:", check_same_thread=False)
        self.route("GET", "/", self.home)
        self.route("GET", "/search", self.search)
        self.route("GET", r"/product/(\d+)", self.product)
        self.route("POST", "/cart/add", self.cart_add)
        self.route("GET", "/cart", self.cart_page)
        self.route("POST", "/cart/update", self.cart_update)
        self.route("GET", "/checkout", self.checkout_page)
        self.route("POST", "/checkout", self.checkout)
        self.route("GET", "/orders", self.orders_page)
        self.route("GET", r"/orders/(\d+)", self.order_page)
        self.reset(0)

    def reset(self, seed):
        self.products = {p["id"]: p for p in generate_catalog(seed)}
        self.db.execute("DROP TABLE IF EXISTS product")
        self.db.execute(
            "CREATE TABLE product (id INTEGER PRIMARY KEY, title TEXT, brand TEXT, category TEXT, price REAL, rating REAL, reviews INTEGER, colors TEXT)"
        )
        self.db.executemany(
            "INSERT INTO product VALUES (?,?,?,?,?,?,?,?)",
            [
                (
                    p["id"],
                    p["title"],
                    p["brand"],
                    p["category"],
                    p["price"],
                    p["rating"],
                    p["reviews"],
                    " ".join(p["colors"]),
                )
                for p in self.products.values()
            ],
        )
        self.cart = []
        self.orders = []

    def state(self):
        return {"cart": self.cart, "orders": self.orders}

    def home(self, request):
        cats = "".join('<li><a href="/search?category=%s">%s</a></li>' % (esc(c), esc(c)) for c in sorted(CATEGORIES))
        body = (
            "<h1>Welcome to Northwind Outfitters</h1>"
            '<form action="/search" method=get role=search><label for=q>Search products</label>'
            '<input id=q name=q type=search placeholder="e.g. rain shell"> <button type=submit>Search</button></form>'
            "<h2>Shop by category</h2><ul>%s</ul>" % cats
        )
        return self.page("Home", body)

    def search(self, request):
        q, category, color = request.arg("q"), request.arg("category"), request.arg("color")
        max_price, min_rating, sort = (
            request.arg("max_price"),
            request.arg("min_rating"),
            request.arg("sort", "relevance"),
        )
        page = max(1, int(request.arg("page", "1") or 1)) if request.arg("page", "1").isdigit() else 1
        where, params = [], []
        for word in q.lower().split():
            where.append("(lower(title) LIKE ? OR lower(brand) LIKE ?)")
            params += ["%" + word + "%", "%" + word + "%"]
        if category:
            where.append("category = ?")
            params.append(category)
        if color:
            where.append("(' ' || colors || ' ') LIKE ?")
            params.append("% " + color + " %")
        try:
            if max_price:
                where.append("price <= ?")
                params.append(float(max_price))
            if min_rating:
                where.append("rating >= ?")
                params.append(float(min_rating))
        except ValueError:
            return self.page("Search", "<p class=error role=alert>Price and rating must be numbers.</p>")
        order = {
            "price_asc": "price ASC, id",
            "price_desc": "price DESC, id",
            "rating": "rating DESC, reviews DESC, id",
        }.get(sort, "id")
        sql = "SELECT id FROM product" + (" WHERE " + " AND ".join(where) if where else "")
        ids = [row[0] for row in self.db.execute(sql + " ORDER BY " + order, params)]
        total, pages = len(ids), max(1, (len(ids) + PER_PAGE - 1) // PER_PAGE)
        page = min(page, pages)
        cards = []
        for pid in ids[(page - 1) * PER_PAGE : page * PER_PAGE]:
            p = self.products[pid]
            cards.append(
                '<div class=card><a href="/product/%d">%s</a><div class=price>$%.2f</div>'
                "<div class=muted>%s · rated %.1f (%d reviews)</div></div>"
                % (pid, esc(p["title"]), p["price"], esc(p["category"]), p["rating"], p["reviews"])
            )
        filters = (
            '<form action="/search" method=get aria-label=Filters><aside>'
            '<label for=fq>Keywords</label><input id=fq name=q value="%s">'
            "<label for=fcat>Category</label><select id=fcat name=category>%s</select>"
            "<label for=fcolor>Color</label><select id=fcolor name=color>%s</select>"
            '<label for=fmax>Max price ($)</label><input id=fmax name=max_price type=number min=0 step=1 value="%s">'
            "<label for=frating>Minimum rating</label><select id=frating name=min_rating>%s</select>"
            "<label for=fsort>Sort by</label><select id=fsort name=sort>%s</select>"
            "<p><button type=submit>Apply filters</button></p></aside></form>"
            % (
                esc(q),
                options(sorted(CATEGORIES), category, "All categories"),
                options(COLORS, color, "Any color"),
                esc(max_price),
                options([("4.5", "4.5 and up"), ("4", "4 and up"), ("3", "3 and up")], min_rating, "Any rating"),
                options(
                    [
                        ("relevance", "Relevance"),
                        ("price_asc", "Price: low to high"),
                        ("price_desc", "Price: high to low"),
                        ("rating", "Top rated"),
                    ],
                    sort,
                ),
            )
        )
        base = {
            k: v
            for k, v in (
                ("q", q),
                ("category", category),
                ("color", color),
                ("max_price", max_price),
                ("min_rating", min_rating),
                ("sort", sort),
            )
            if v
        }
        pager = []
        if page > 1:
            pager.append('<a href="/search?%s">Previous page</a>' % esc(up.urlencode(dict(base, page=page - 1))))
        if page < pages:
            pager.append('<a href="/search?%s">Next page</a>' % esc(up.urlencode(dict(base, page=page + 1))))
        body = (
            "%s<section><h1>Products</h1><p>%d results · page %d of %d</p><div class=grid>%s</div><nav class=pager aria-label=Pages>%s</nav></section>"
            % (filters, total, page, pages, "".join(cards) or "<p>No products match.</p>", "".join(pager))
        )
        return self.page("Search", body)

    def product(self, request, pid):
        p = self.products.get(int(pid))
        if not p:
            return self.not_found("product")
        color_inputs = "".join(
            '<label><input type=radio name=color value="%s"%s> %s</label>'
            % (esc(c), " checked" if i == 0 else "", esc(c))
            for i, c in enumerate(p["colors"])
        )
        size = ""
        if p["sizes"]:
            size = "<label for=size>Size</label><select id=size name=size required>%s</select>" % options(
                p["sizes"], "", "Choose a size"
            )
        specs = (
            "<table><tr><th>Brand</th><td>%s</td></tr><tr><th>Category</th><td>%s</td></tr><tr><th>In stock</th><td>%d</td></tr></table>"
            % (esc(p["brand"]), esc(p["category"]), p["stock"])
        )
        error = "<p class=error role=alert>%s</p>" % esc(request.arg("error")) if request.arg("error") else ""
        body = (
            "<h1>%s</h1><div class=price>$%.2f</div><p class=muted>Rated %.1f out of 5 (%d reviews)</p>%s"
            '<form action="/cart/add" method=post aria-label="Add to cart"><input type=hidden name=product_id value="%d">'
            "<fieldset><legend>Color</legend>%s</fieldset>%s"
            "<label for=qty>Quantity</label><input id=qty name=qty type=number min=1 max=9 value=1>"
            "<p><button type=submit>Add to cart</button></p></form>%s"
            % (
                esc(p["title"]),
                p["price"],
                p["rating"],
                p["reviews"],
                error,
                p["id"],
                color_inputs,
                size,
                tabs(
                    "Product details",
                    [
                        (
                            "Description",
                            "<p>The %s is a %s by %s.</p>"
                            % (esc(p["title"]), esc(p["category"].lower()), esc(p["brand"])),
                        ),
                        ("Specifications", specs),
                    ],
                ),
            )
        )
        return self.page(p["title"], body)

    def cart_add(self, request):
        p = self.products.get(int(request.field("product_id", "0") or 0))
        if not p:
            return self.not_found("product")
        color, size = request.field("color"), request.field("size")
        try:
            qty = int(request.field("qty", "1"))
        except ValueError:
            qty = 0
        if p["sizes"] and size not in p["sizes"]:
            return redirect("/product/%d?error=Please+choose+a+size" % p["id"])
        if color not in p["colors"] or not 1 <= qty <= 9:
            return redirect("/product/%d?error=Please+choose+a+color+and+a+quantity+from+1+to+9" % p["id"])
        for item in self.cart:
            if (item["product_id"], item["color"], item["size"]) == (p["id"], color, size):
                item["qty"] = min(9, item["qty"] + qty)
                break
        else:
            self.cart.append(
                {
                    "product_id": p["id"],
                    "title": p["title"],
                    "color": color,
                    "size": size,
                    "qty": qty,
                    "price": p["price"],
                }
            )
        return redirect("/cart")

    def _cart_total(self):
        return round(sum(i["price"] * i["qty"] for i in self.cart), 2)

    def cart_page(self, request):
        if not self.cart:
            return self.page(
                "Cart", '<h1>Your cart</h1><p>Your cart is empty.</p><a href="/search">Browse products</a>'
            )
        rows = []
        for index, item in enumerate(self.cart):
            rows.append(
                '<tr><td><a href="/product/%d">%s</a></td><td>%s</td><td>%s</td><td>$%.2f</td>'
                '<td><form action="/cart/update" method=post><input type=hidden name=index value=%d>'
                "<label>Quantity of %s <input name=qty type=number min=0 max=9 value=%d></label> <button type=submit>Update</button></form></td>"
                '<td><form action="/cart/update" method=post><input type=hidden name=index value=%d><input type=hidden name=qty value=0>'
                '<button type=submit aria-label="Remove %s">Remove</button></form></td></tr>'
                % (
                    item["product_id"],
                    esc(item["title"]),
                    esc(item["color"]),
                    esc(item["size"] or "-"),
                    item["price"],
                    index,
                    esc(item["title"]),
                    item["qty"],
                    index,
                    esc(item["title"]),
                )
            )
        body = (
            "<h1>Your cart</h1><table><tr><th>Product</th><th>Color</th><th>Size</th><th>Price</th><th>Quantity</th><th></th></tr>%s</table>"
            '<p>Subtotal: <span class=price>$%.2f</span></p><a href="/checkout">Proceed to checkout</a>'
            % ("".join(rows), self._cart_total())
        )
        return self.page("Cart", body)

    def cart_update(self, request):
        try:
            index, qty = int(request.field("index")), int(request.field("qty"))
        except ValueError:
            return redirect("/cart")
        if 0 <= index < len(self.cart):
            if qty <= 0:
                self.cart.pop(index)
            else:
                self.cart[index]["qty"] = min(9, qty)
        return redirect("/cart")

    def checkout_page(self, request, errors=(), values=None):
        values = values or {}
        if not self.cart:
            return self.page("Checkout", "<h1>Checkout</h1><p>Your cart is empty.</p>")
        error_list = "".join("<li>%s</li>" % esc(e) for e in errors)
        shipping = "".join(
            '<label><input type=radio name=shipping value="%s"%s> %s</label>'
            % (value, " checked" if values.get("shipping", "standard") == value else "", esc(label))
            for value, label in SHIPPING
        )
        body = (
            "<h1>Checkout</h1>%s<p>Order subtotal: $%.2f</p>"
            '<form action="/checkout" method=post aria-label=Checkout>'
            '<label for=name>Full name</label><input id=name name=name value="%s">'
            '<label for=address>Street address</label><input id=address name=address value="%s">'
            '<label for=city>City</label><input id=city name=city value="%s">'
            "<fieldset><legend>Shipping method</legend>%s</fieldset>"
            "<p><button type=submit>Place order</button></p></form>"
            % (
                "<ul class=error role=alert>%s</ul>" % error_list if errors else "",
                self._cart_total(),
                esc(values.get("name", "")),
                esc(values.get("address", "")),
                esc(values.get("city", "")),
                shipping,
            )
        )
        return self.page("Checkout", body)

    def checkout(self, request):
        values = {k: request.field(k) for k in ("name", "address", "city", "shipping")}
        errors = [
            label + " is required."
            for key, label in (("name", "Full name"), ("address", "Street address"), ("city", "City"))
            if not values[key]
        ]
        if values["shipping"] not in SHIPPING_COST:
            errors.append("Choose a shipping method.")
        if not self.cart:
            errors.append("Your cart is empty.")
        if errors:
            return self.checkout_page(request, errors, values)
        order = dict(
            values,
            id=len(self.orders) + 1,
            items=self.cart,
            total=round(self._cart_total() + SHIPPING_COST[values["shipping"]], 2),
        )
        self.orders.append(order)
        self.cart = []
        return redirect("/orders/%d" % order["id"])

    def orders_page(self, request):
        rows = "".join(
            '<li><a href="/orders/%d">Order #%d</a> · $%.2f</li>' % (o["id"], o["id"], o["total"]) for o in self.orders
        )
        return self.page("Orders", "<h1>Your orders</h1><ul>%s</ul>" % (rows or "<li>No orders yet.</li>"))

    def order_page(self, request, oid):
        if not 1 <= int(oid) <= len(self.orders):
            return self.not_found("order")
        o = self.orders[int(oid) - 1]
        items = "".join(
            "<li>%d × %s (%s%s)</li>"
            % (i["qty"], esc(i["title"]), esc(i["color"]), ", size " + esc(i["size"]) if i["size"] else "")
            for i in o["items"]
        )
        body = (
            "<h1 class=ok>Thank you! Order #%d is confirmed.</h1><ul>%s</ul><p>Ship to %s, %s, %s (%s). Total $%.2f</p>"
            % (o["id"], items, esc(o["name"]), esc(o["address"]), esc(o["city"]), esc(o["shipping"]), o["total"])
        )
        return self.page("Order %d" % o["id"], body)
