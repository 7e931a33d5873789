import pytest

from textkit import camel_to_snake, snake_to_camel, title_case


@pytest.mark.parametrize(
    "text, expected",
    [
        ("the lord of the rings", "The Lord of the Rings"),
        ("a tale of two cities", "A Tale of Two Cities"),
        ("war and peace", "War and Peace"),
        ("  extra   spaces here ", "Extra Spaces Here"),
    ],
    ids=["articles", "leading-article", "conjunction", "extra-whitespace"],
)
def test_title_case(text, expected):
    assert title_case(text) == expected


def test_title_case_keeps_inner_capitals():
    assert title_case("my new iPhone review") == "My New iPhone Review"


def test_title_case_hyphenated_words():
    assert title_case("state-of-the-art design") == "State-Of-The-Art Design"


@pytest.mark.parametrize(
    "name, expected",
    [
        ("camelCase", "camel_case"),
        ("PascalCase", "pascal_case"),
        ("already_snake", "already_snake"),
        ("version2Update", "version2_update"),
        ("x", "x"),
    ],
)
def test_camel_to_snake(name, expected):
    assert camel_to_snake(name) == expected


@pytest.mark.parametrize(
    "name, expected",
    [
        ("snake_case_name", "snakeCaseName"),
        ("single", "single"),
        ("_private_value", "_privateValue"),
        ("double__underscore", "doubleUnderscore"),
    ],
)
def test_snake_to_camel(name, expected):
    assert snake_to_camel(name) == expected


def test_snake_to_pascal():
    assert snake_to_camel("http_server", upper_first=True) == "HttpServer"
