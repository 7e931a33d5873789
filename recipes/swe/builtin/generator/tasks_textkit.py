TASKS = []

TASKS.append(
    dict(
        repo="textkit",
        problem_statement="""`slugify()` drops accented letters instead of transliterating them

The README example says `slugify("Crème Brûlée!")` gives `"creme-brulee"`, but accented letters are removed entirely:

```python
>>> from textkit import slugify
>>> slugify("Crème Brûlée")
'crme-brle'
>>> slugify("Ångström units")
'ngstrm-units'
>>> slugify("ﬁsh ﬂakes")   # typographic ligatures U+FB01 / U+FB02
'sh-akes'
```

Expected `'creme-brulee'`, `'angstrom-units'` and `'fish-flakes'`. Accented Latin letters should become their base letter and compatibility characters such as ligatures should be decomposed. Characters with no ASCII equivalent (e.g. CJK) should still be dropped as they are now.
""",
        gold=[
            (
                "replace",
                "textkit/slug.py",
                """    text = unicodedata.normalize("NFC", text)
""",
                """    # NFKD splits accented letters into base letter + combining mark (and
    # expands compatibility characters such as ligatures); the marks are then
    # dropped by the ASCII encoding step below.
    text = unicodedata.normalize("NFKD", text)
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_slug.py",
                """

@pytest.mark.parametrize(
    "text, expected",
    [
        ("Crème Brûlée", "creme-brulee"),
        ("Ångström units", "angstrom-units"),
        ("Über naïve Café", "uber-naive-cafe"),
        ("\\ufb01sh \\ufb02akes", "fish-flakes"),
    ],
    ids=["french", "swedish", "mixed", "ligatures"],
)
def test_accented_letters_are_transliterated(text, expected):
    assert slugify(text) == expected


def test_transliteration_with_max_length():
    assert slugify("Déjà vu all over again", max_length=7) == "deja-vu"
""",
            )
        ],
        expect_f2p=[
            "tests/test_slug.py::test_accented_letters_are_transliterated[french]",
            "tests/test_slug.py::test_accented_letters_are_transliterated[swedish]",
            "tests/test_slug.py::test_accented_letters_are_transliterated[mixed]",
            "tests/test_slug.py::test_accented_letters_are_transliterated[ligatures]",
            "tests/test_slug.py::test_transliteration_with_max_length",
        ],
    )
)

TASKS.append(
    dict(
        repo="textkit",
        problem_statement="""`wrap()` breaks lines that would fit exactly

A line whose length is exactly `width` is never produced; the last word is always pushed to the next line:

```python
>>> from textkit import wrap, fill
>>> wrap("aaa bbb", width=7)
['aaa', 'bbb']
>>> fill("The quick brown fox", width=9)
'The\\nquick\\nbrown\\nfox'
```

Expected `['aaa bbb']` and `'The quick\\nbrown fox'`: the documented contract is that lines are *no longer than* `width`, so a line may be exactly `width` characters long. For ordinary text (no words longer than `width`) the output should match the standard library's `textwrap.wrap(text, width)`.
""",
        gold=[
            (
                "replace",
                "textkit/wrap.py",
                """        elif current_len + 1 + len(word) < width:
""",
                """        elif current_len + 1 + len(word) <= width:
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_wrap.py",
                """

def test_line_may_be_exactly_width():
    assert wrap("aaa bbb", width=7) == ["aaa bbb"]
    assert wrap("The quick brown fox", width=9) == ["The quick", "brown fox"]


def test_fill_exact_fit():
    assert fill("The quick brown fox", width=9) == "The quick\\nbrown fox"


def test_matches_textwrap_for_plain_text():
    import textwrap

    text = "Lorem ipsum dolor sit amet consectetur adipiscing elit sed do eiusmod"
    for width in range(11, 40):
        assert wrap(text, width) == textwrap.wrap(text, width), width
""",
            )
        ],
        expect_f2p=[
            "tests/test_wrap.py::test_line_may_be_exactly_width",
            "tests/test_wrap.py::test_fill_exact_fit",
            "tests/test_wrap.py::test_matches_textwrap_for_plain_text",
        ],
    )
)

TASKS.append(
    dict(
        repo="textkit",
        problem_statement="""`title_case()` lowercases a small word at the end of a title

`title_case` keeps "small words" (a, of, for, to, ...) in lower case, but the docstring says that does not apply to the first or the last word. The last word is lowercased anyway:

```python
>>> from textkit import title_case
>>> title_case("what are you looking for")
'What Are You Looking for'
>>> title_case("the thing to hold on to")
'The Thing to Hold on to'
```

Expected `'What Are You Looking For'` and `'The Thing to Hold on To'`. Small words in the middle of a title should stay lower case, and a single-word title like `"a"` should still be capitalised.
""",
        gold=[
            (
                "replace",
                "textkit/case.py",
                """    words = text.split()
    result = []
    for index, word in enumerate(words):
        lower = word.lower()
        if index > 0 and lower in SMALL_WORDS:
""",
                """    words = text.split()
    last = len(words) - 1
    result = []
    for index, word in enumerate(words):
        lower = word.lower()
        if 0 < index < last and lower in SMALL_WORDS:
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_case.py",
                """

@pytest.mark.parametrize(
    "text, expected",
    [
        ("what are you looking for", "What Are You Looking For"),
        ("the thing to hold on to", "The Thing to Hold on To"),
        ("a", "A"),
        ("of mice and men", "Of Mice and Men"),
    ],
    ids=["trailing-preposition", "phrasal-verb", "single-small-word", "leading-small-word"],
)
def test_title_case_first_and_last_words_are_capitalized(text, expected):
    assert title_case(text) == expected
""",
            )
        ],
        expect_f2p=[
            "tests/test_case.py::test_title_case_first_and_last_words_are_capitalized[trailing-preposition]",
            "tests/test_case.py::test_title_case_first_and_last_words_are_capitalized[phrasal-verb]",
        ],
    )
)

TASKS.append(
    dict(
        repo="textkit",
        problem_statement="""`camel_to_snake()` does not split acronyms

The `camel_to_snake` docstring promises that runs of capitals are treated as acronyms (`"parseHTTPResponse"` -> `"parse_http_response"`), but an acronym followed by another word is glued to it:

```python
>>> from textkit import camel_to_snake
>>> camel_to_snake("HTTPServer")
'httpserver'
>>> camel_to_snake("parseHTTPResponse")
'parse_httpresponse'
>>> camel_to_snake("getXMLHttpRequest")
'get_xmlhttp_request'
```

Expected `'http_server'`, `'parse_http_response'` and `'get_xml_http_request'`. Acronyms at the end of a name already work (`"userID"` -> `"user_id"`) and should keep working, as should ordinary camelCase/PascalCase names.
""",
        gold=[
            (
                "replace",
                "textkit/case.py",
                """_LOWER_TO_UPPER = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
""",
                """_LOWER_TO_UPPER = re.compile(r"(?<=[a-z0-9])(?=[A-Z])")
# End of an acronym: a capital followed by a capitalised word ("HTTPServer").
_ACRONYM_END = re.compile(r"(?<=[A-Z])(?=[A-Z][a-z])")
""",
            ),
            (
                "replace",
                "textkit/case.py",
                """    return _LOWER_TO_UPPER.sub("_", name).lower()
""",
                """    name = _ACRONYM_END.sub("_", name)
    return _LOWER_TO_UPPER.sub("_", name).lower()
""",
            ),
        ],
        tests=[
            (
                "append",
                "tests/test_case.py",
                """

@pytest.mark.parametrize(
    "name, expected",
    [
        ("HTTPServer", "http_server"),
        ("parseHTTPResponse", "parse_http_response"),
        ("getXMLHttpRequest", "get_xml_http_request"),
        ("IOError", "io_error"),
        ("userID", "user_id"),
    ],
    ids=["leading-acronym", "inner-acronym", "two-acronyms", "short-acronym", "trailing-acronym"],
)
def test_camel_to_snake_acronyms(name, expected):
    assert camel_to_snake(name) == expected
""",
            )
        ],
        expect_f2p=[
            "tests/test_case.py::test_camel_to_snake_acronyms[leading-acronym]",
            "tests/test_case.py::test_camel_to_snake_acronyms[inner-acronym]",
            "tests/test_case.py::test_camel_to_snake_acronyms[two-acronyms]",
            "tests/test_case.py::test_camel_to_snake_acronyms[short-acronym]",
        ],
    )
)

TASKS.append(
    dict(
        repo="textkit",
        problem_statement="""`dedent()` does nothing when the text contains an empty line

`dedent` is documented to ignore whitespace-only lines when computing the common margin, like `textwrap.dedent`. In practice a single empty line (or a trailing newline) disables dedenting completely:

```python
>>> from textkit import dedent
>>> dedent("    first\\n\\n    second")
'    first\\n\\n    second'
>>> dedent("    line one\\n    line two\\n")
'    line one\\n    line two\\n'
>>> dedent("    a\\n  \\n      b")
'  a\\n\\n    b'
```

Expected `'first\\n\\nsecond'`, `'line one\\nline two\\n'` and `'a\\n\\n  b'`: whitespace-only lines must not influence the margin and come out as empty lines. Text whose non-blank lines share no common indentation should be returned unchanged apart from that normalisation.
""",
        gold=[
            (
                "replace",
                "textkit/strings.py",
                """    lines = text.split("\\n")
    margin = None
    for line in lines:
        prefix = _leading_whitespace(line)
""",
                """    lines = [line if line.strip() else "" for line in text.split("\\n")]
    margin = None
    for line in lines:
        if not line:
            continue
        prefix = _leading_whitespace(line)
""",
            ),
            (
                "replace",
                "textkit/strings.py",
                """    if not margin:
        return text
    return "\\n".join(line[len(margin) :] for line in lines)
""",
                """    if not margin:
        return "\\n".join(lines)
    return "\\n".join(line[len(margin) :] for line in lines)
""",
            ),
        ],
        tests=[
            (
                "append",
                "tests/test_strings.py",
                """

def test_dedent_ignores_empty_lines():
    assert dedent("    first\\n\\n    second") == "first\\n\\nsecond"


def test_dedent_with_trailing_newline():
    assert dedent("    line one\\n    line two\\n") == "line one\\nline two\\n"


def test_dedent_whitespace_only_lines_become_empty():
    assert dedent("    a\\n  \\n      b") == "a\\n\\n  b"


def test_dedent_matches_textwrap_on_docstring():
    import textwrap

    text = "\\n        Summary line.\\n\\n        Details here,\\n            indented more.\\n        "
    assert dedent(text) == textwrap.dedent(text)
""",
            )
        ],
        expect_f2p=[
            "tests/test_strings.py::test_dedent_ignores_empty_lines",
            "tests/test_strings.py::test_dedent_with_trailing_newline",
            "tests/test_strings.py::test_dedent_whitespace_only_lines_become_empty",
            "tests/test_strings.py::test_dedent_matches_textwrap_on_docstring",
        ],
    )
)

TASKS.append(
    dict(
        repo="textkit",
        problem_statement="""`truncate()` drops a whole word that would have fit

When the word boundary falls exactly at the truncation point, `truncate` still backs off to the previous space and throws away a word that fits:

```python
>>> from textkit import truncate
>>> truncate("hello world again", 12)
'hello…'
>>> truncate("one two three", 10, placeholder="...")
'one...'
```

With a width of 12 and a one-character placeholder there is room for 11 characters, and `"hello world"` is exactly 11, so the expected result is `'hello world…'`; likewise `'one two...'` in the second example. Cutting in the middle of a word must still back off to the previous word (`truncate("The quick brown fox", 12) == "The quick…"`), and the result must never be longer than `width`.
""",
        gold=[
            (
                "replace",
                "textkit/strings.py",
                """    cut = text[:limit]
    space = cut.rfind(" ")
    if space > 0:
        cut = cut[:space]
""",
                """    cut = text[:limit]
    # Only back off to the previous space if the cut splits a word; when the
    # next character is whitespace the last word fits completely.
    if not text[limit].isspace():
        space = cut.rfind(" ")
        if space > 0:
            cut = cut[:space]
""",
            )
        ],
        tests=[
            (
                "append",
                "tests/test_strings.py",
                """

def test_truncate_keeps_word_ending_at_the_limit():
    assert truncate("hello world again", 12) == "hello world…"
    assert truncate("one two three", 10, placeholder="...") == "one two..."
""",
            )
        ],
        expect_f2p=["tests/test_strings.py::test_truncate_keeps_word_ending_at_the_limit"],
    )
)
