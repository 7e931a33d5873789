"""Choosing the event loop, the adapter and the recipe by name, and checking their options.

Recipes and their commands are plugins: entry points in the ``orchard_async.recipes``
and ``orchard_async.commands`` groups (see ``protocols.Recipe``). Only their names are read
until one is used, so listing them imports no recipe.

A recipe's settings are its options (``RecipeOptions``): a typed struct per recipe, given as
``--recipe-options JSON`` or as keywords from Python, checked as adapter options are. An
``ORCHARD_*`` variable is only the default of one option, read in one place
(``RecipeOptions.from_env``).

The loop: ``ORCHARD_LOOP`` = ``asyncio`` | ``uvloop`` | ``auto`` (uvloop when installed).
The default is ``asyncio``. Measured on the 2-core reference machine: uvloop spawns child
processes with a real fork, about 4x slower per spawn than asyncio's, which the local
adapter pays once per sandbox; its gain on the pipe traffic of the hot path did not make
up for that (see README, "Event loop").
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import importlib.metadata
import inspect
import os
import re
import signal
import types
import typing
from collections.abc import Awaitable, Callable, Mapping
from typing import Any, ClassVar, NamedTuple, Self, TypeVar

import anyio
import msgspec
import msgspec.inspect

from orchard_async.errors import AdapterUnavailable, ConfigError
from orchard_async.protocols import Adapter, Recipe

T = TypeVar("T")

DEFAULT_LOOP = "asyncio"
ADAPTERS = {
    "local": "orchard_async.adapters.local:LocalAdapter",
    "sim": "orchard_async.adapters.sim:SimAdapter",
    "docker": "orchard_async.adapters.docker:DockerAdapter",
    "kubernetes": "orchard_async.adapters.kubernetes:KubernetesAdapter",
    "remote": "orchard_async.adapters.remote:RemoteAdapter",  # an `orchard-async serve` elsewhere
}
RECIPE_GROUP = "orchard_async.recipes"  # entry point: name = recipe, value = its module
COMMAND_GROUP = "orchard_async.commands"  # entry point: name = command, value = "module:add_command"


# The variables this module reads (docs/variables.md): name -> (default, meaning).
ENVIRONMENT = {"ORCHARD_LOOP": (DEFAULT_LOOP, "the event loop: asyncio, uvloop or auto (uvloop when installed)")}


def loop_choice(loop: str | None = None) -> str:
    """The loop that ``run`` will use: 'asyncio' or 'uvloop'."""
    choice = (loop or os.environ.get("ORCHARD_LOOP") or DEFAULT_LOOP).lower()
    if choice not in ("asyncio", "uvloop", "auto"):
        raise ConfigError(f"unknown event loop {choice!r}; use asyncio, uvloop or auto")
    if choice == "asyncio":
        return "asyncio"
    try:
        importlib.import_module("uvloop")
    except ImportError:
        if choice == "uvloop":
            raise ConfigError("uvloop is not installed; pip install 'orchard-async[fast]'") from None
        return "asyncio"
    return "uvloop"


def run(main: Callable[..., Awaitable[T]], *args: Any, loop: str | None = None) -> T:
    """Run ``main(*args)`` on the chosen event loop (see module docstring). Ctrl-C cancels
    ``main`` (its shielded cleanup runs: sandboxes are closed) and then raises
    ``KeyboardInterrupt``."""
    use_uvloop = loop_choice(loop) == "uvloop"
    return anyio.run(_interruptible, main, *args, backend="asyncio", backend_options={"use_uvloop": use_uvloop})


async def _interruptible(main: Callable[..., Awaitable[T]], *args: Any) -> T:
    """``main(*args)`` under a cancel scope that SIGINT cancels. asyncio's own handling
    cancels the main task natively and turns that into KeyboardInterrupt only if the task ends
    cancelled; a native cancellation that lands while anyio is unwinding one of its own scopes
    can be absorbed, and the run then finished with status 0 as if never interrupted (seen once
    in CI's Ctrl-C test). An anyio cancel scope's cancellation cannot be absorbed that way."""
    loop = asyncio.get_running_loop()
    scope = anyio.CancelScope()
    interrupted = False

    def on_sigint() -> None:
        nonlocal interrupted
        interrupted = True
        scope.cancel()

    try:
        loop.add_signal_handler(signal.SIGINT, on_sigint)
    except (RuntimeError, ValueError):  # not the main thread: asyncio's default handling
        return await main(*args)
    try:
        with scope:
            result = await main(*args)
    finally:
        loop.remove_signal_handler(signal.SIGINT)
    if interrupted:
        raise KeyboardInterrupt
    return result


def _struct_of(annotation: Any) -> type[msgspec.Struct] | None:
    """The msgspec struct in an annotation like ``SimConfig | None``, if there is one."""
    for member in typing.get_args(annotation) or (annotation,):
        if isinstance(member, type) and issubclass(member, msgspec.Struct):
            return member
    return None


def adapter_options(adapter_class: type) -> tuple[list[str] | None, dict[str, type[msgspec.Struct]]]:
    """The options an adapter class takes by keyword (None when it cannot tell: it takes
    ``**options`` without saying which), and which of them are msgspec structs. An adapter
    whose ``**options`` fill a struct parameter (the sim adapter's ``SimConfig``) also takes
    that struct's fields."""
    try:
        hints = typing.get_type_hints(adapter_class.__init__)
    except Exception:  # noqa: BLE001 - hints that do not resolve just give no struct fields
        hints = {}
    names: list[str] = []
    structs: dict[str, type[msgspec.Struct]] = {}
    takes_any = False
    for name, parameter in inspect.signature(adapter_class).parameters.items():
        if parameter.kind is inspect.Parameter.VAR_KEYWORD:
            takes_any = True
        elif parameter.kind in (inspect.Parameter.KEYWORD_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD):
            names.append(name)
            struct = _struct_of(hints.get(name))
            if struct is not None:
                structs[name] = struct
    if takes_any:
        if not structs:
            return None, structs
        names += [field for struct in structs.values() for field in struct.__struct_fields__]
    return names, structs


def get_adapter(name: str, **options: Any) -> Adapter:
    """An adapter by name: local, sim, docker, kubernetes. An option the adapter does not
    take is a ConfigError that lists the ones it does."""
    if name not in ADAPTERS:
        raise ConfigError(f"unknown adapter {name!r}; choose one of: {', '.join(ADAPTERS)}")
    module_name, _, class_name = ADAPTERS[name].partition(":")
    try:
        module = importlib.import_module(module_name)
    except ModuleNotFoundError as exc:
        if exc.name == module_name:
            raise AdapterUnavailable(f"the {name} adapter is not part of this build yet") from None
        raise AdapterUnavailable(f"the {name} adapter needs {exc.name}; pip install 'orchard-async[{name}]'") from None
    adapter_class = getattr(module, class_name)
    valid, structs = adapter_options(adapter_class)
    unknown = sorted(set(options) - set(valid)) if valid is not None else []
    if unknown:
        raise ConfigError(
            f"the {name} adapter has no option {', '.join(map(repr, unknown))}; "
            f"its options are: {', '.join(valid) or '(none)'}"
        )
    try:
        for key, struct in structs.items():  # a struct option given as JSON: convert (and check) it
            if isinstance(options.get(key), dict):
                options[key] = msgspec.convert(options[key], struct)
        return adapter_class(**options)
    except msgspec.ValidationError as exc:  # options of the wrong type, where a struct checks them
        raise ConfigError(f"bad option for the {name} adapter: {exc}") from None


# -- recipes ---------------------------------------------------------------------------------


def _entry_points(group: str) -> dict[str, importlib.metadata.EntryPoint]:
    """The group's entry points by name (the first of each name, when two packages clash)."""
    found: dict[str, importlib.metadata.EntryPoint] = {}
    for point in importlib.metadata.entry_points(group=group):
        found.setdefault(point.name, point)
    return found


def recipe_names() -> list[str]:
    """The installed recipes' names, sorted. Imports none of them."""
    return sorted(_entry_points(RECIPE_GROUP))


def recipe_commands() -> dict[str, importlib.metadata.EntryPoint]:
    """The commands recipes add to ``orchard-async``, by name. Imports none of them."""
    return _entry_points(COMMAND_GROUP)


def recipe_of(point: importlib.metadata.EntryPoint) -> str | None:
    """The name of the recipe an entry point's module belongs to, if it belongs to one."""
    for name, recipe in _entry_points(RECIPE_GROUP).items():
        if point.module == recipe.module or point.module.startswith(recipe.module + "."):
            return name
    return None


def load_entry_point(point: importlib.metadata.EntryPoint, what: str) -> Any:
    """Import what an entry point names; a module it needs that is missing is a ConfigError."""
    try:
        return point.load()
    except ModuleNotFoundError as exc:
        if exc.name and (point.module + ".").startswith(exc.name + "."):  # the plugin itself is gone: stale metadata
            raise ConfigError(
                f"{what} is registered as {point.value} but that module is not installed; reinstall its package"
            ) from None
        raise ConfigError(f"{what} needs the module {exc.name}, which is not installed") from None


def load_recipe(name: str) -> Recipe:
    """A recipe module by name (its ``orchard_async.recipes`` entry point), checked for the
    ``Recipe`` shape: ``load_tasks`` and ``make_policy``."""
    points = _entry_points(RECIPE_GROUP)
    if name not in points:
        if not points:
            raise ConfigError(
                f"no recipe is registered (entry-point group {RECIPE_GROUP}); reinstall orchard-async "
                "(in a checkout: pip install -e .)"
            )
        raise ConfigError(f"unknown recipe {name!r}; choose one of: {', '.join(sorted(points))}")
    module = load_entry_point(points[name], f"the {name} recipe")
    missing = [attr for attr in ("load_tasks", "make_policy") if not callable(getattr(module, attr, None))]
    if missing:
        raise ConfigError(
            f"the {name} recipe ({points[name].value}) has no {' or '.join(missing)}; see orchard_async.Recipe"
        )
    return module


def recipe_options(name: str, recipe: Recipe, given: Mapping[str, Any] | None) -> RecipeOptions | None:
    """The options in force for a recipe: ``given`` (``--recipe-options``) over its variables'
    defaults, checked against its ``OPTIONS`` struct. None for a recipe that declares no
    ``OPTIONS``: it takes none, and any given is a ConfigError."""
    options_class = getattr(recipe, "OPTIONS", None)
    if options_class is None:
        if given:
            raise ConfigError(f"the {name} recipe takes no options; got {', '.join(map(repr, sorted(given)))}")
        return None
    return options_class.resolve(given)


# -- recipe options --------------------------------------------------------------------------


def recipe_option(
    meaning: str, env: str | None = None, *, empty_is_value: bool = False, **constraints: Any
) -> msgspec.Meta:
    """One recipe option's declaration, as ``Annotated[type, recipe_option(...)]`` on a field of a
    ``RecipeOptions`` struct: what it means, the environment variable that gives its default
    (an empty value counts as unset, unless ``empty_is_value``), and msgspec's constraints
    (``ge=0``, ...)."""
    extra = {"env": env, "empty_is_value": empty_is_value} if env else {}
    return msgspec.Meta(description=meaning, extra=extra, **constraints)


class OptionInfo(NamedTuple):
    """One field of a ``RecipeOptions`` struct, as the docs and the error messages show it."""

    name: str
    kind: str  # the type, as a person reads it: "int", "str | None", "auto|swebench|pytest"
    default: Any
    meaning: str
    env: str | None  # the variable that gives its default
    empty_is_value: bool


_TRUE, _FALSE = ("1", "true", "yes", "on"), ("0", "false", "no", "off")


class RecipeOptions(msgspec.Struct, forbid_unknown_fields=True, frozen=True, kw_only=True):
    """The base of a recipe's options: subclass it, one field per option, each annotated with
    ``recipe_option(...)``. ``RECIPE`` names the recipe in messages; ``OPERATIONAL`` are the fields that
    say where or how (a folder, a key), not what an episode does: they are left out of a run's
    header, so a ``--resume`` may change them.

    Three ways to get the options in force, all checked against the struct's types:

    * ``resolve(None | mapping | struct, **keywords)``: what a recipe's ``load_tasks`` and
      ``make_policy`` do with what they are given. A mapping (or keywords) is laid over the
      variables' defaults (``from_env``); a struct is taken as it is (its unset fields are the
      struct's defaults, not the environment's: an embedding trainer that builds one gets the
      same options in any environment), keywords replacing its fields.
    * ``from_env(environ=None, **given)``: every option from its variable when that is set,
      else the struct's default, then ``given`` over them.
    * the constructor: the struct's defaults only; checked when a recipe resolves it.
    """

    RECIPE: ClassVar[str] = "this"
    OPERATIONAL: ClassVar[frozenset[str]] = frozenset()

    @classmethod
    @functools.cache
    def fields(cls) -> tuple[OptionInfo, ...]:
        hints = typing.get_type_hints(cls)
        found = []
        for field in msgspec.inspect.type_info(cls).fields:  # type: ignore[attr-defined]
            meta = field.type if isinstance(field.type, msgspec.inspect.Metadata) else None
            extra = (meta.extra or {}) if meta else {}
            meaning = ((meta.extra_json_schema or {}) if meta else {}).get("description", "")
            default = field.default if field.default is not msgspec.NODEFAULT else field.default_factory()
            kind = _kind(hints[field.name])
            found.append(
                OptionInfo(field.name, kind, default, meaning, extra.get("env"), extra.get("empty_is_value", False))
            )
        return tuple(found)

    @classmethod
    def names(cls) -> str:
        """The options' names, for messages: "a, b, c"."""
        return ", ".join(cls.__struct_fields__)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None, /, **given: Any) -> Self:
        env = os.environ if environ is None else environ
        raw: dict[str, str] = {}
        variable: dict[str, str] = {}
        for info in cls.fields():
            value = env.get(info.env) if info.env and info.name not in given else None  # given: not even read
            if value is None or (not value.strip() and not info.empty_is_value):
                continue
            value = value.strip()
            if info.kind in ("bool", "bool | None") and value.lower() in _TRUE + _FALSE:
                value = "true" if value.lower() in _TRUE else "false"
            raw[info.name], variable[info.name] = value, info.env  # type: ignore[assignment]
        try:
            defaults = msgspec.convert(raw, cls, strict=False)  # the variables' text: "3" is an int here
        except msgspec.ValidationError as exc:
            field = _field_of(exc)
            name = variable.get(field or "", "a variable")
            raise ConfigError(
                f"{name}={raw.get(field or '', '')!r} is not a valid {field} option of the {cls.RECIPE} recipe: "
                f"{cls._explain(exc)}"
            ) from None
        return cls._checked({**{name: getattr(defaults, name) for name in raw}, **given})

    @classmethod
    def resolve(cls, options: Self | Mapping[str, Any] | None = None, /, **keywords: Any) -> Self:
        if isinstance(options, cls):
            return cls._checked({**msgspec.structs.asdict(options), **keywords})
        if options is None:
            options = {}
        if not isinstance(options, Mapping):
            raise ConfigError(
                f"the {cls.RECIPE} recipe's options are a {cls.__name__} or a mapping of its fields, "
                f"got {type(options).__name__}"
            )
        return cls.from_env(**{**options, **keywords})

    @classmethod
    def _checked(cls, values: dict[str, Any]) -> Self:
        unknown = sorted(set(values) - set(cls.__struct_fields__), key=str)
        if unknown:
            raise ConfigError(
                f"the {cls.RECIPE} recipe has no option {', '.join(map(repr, unknown))}; its options are: {cls.names()}"
            )
        try:
            return msgspec.convert(values, cls)
        except msgspec.ValidationError as exc:
            raise ConfigError(
                f"bad option for the {cls.RECIPE} recipe: {cls._explain(exc)}; its options are: {cls.names()}"
            ) from None

    @classmethod
    def _explain(cls, exc: msgspec.ValidationError) -> str:
        """msgspec's message, with the choices named when a value is not one of them."""
        field = _field_of(exc)
        info = next((i for i in cls.fields() if i.name == field), None)
        if info is not None and str(exc).startswith("Invalid enum value"):
            got = str(exc).removeprefix("Invalid enum value ").split(" - at ")[0]
            return f"{field} must be one of {info.kind.replace('|', ', ')}, got {got}"
        return str(exc)

    @classmethod
    def run_header(cls, given: Mapping[str, Any]) -> dict[str, Any]:
        """Of the options ``given``, those a run's header records: all but the operational ones."""
        return {key: value for key, value in sorted(given.items()) if key not in cls.OPERATIONAL}


def _field_of(exc: msgspec.ValidationError) -> str | None:
    """The field a msgspec error is about (its "at `$.name`")."""
    _, found, where = str(exc).rpartition(" - at `$.")
    return re.split(r"[`.\[]", where)[0] or None if found else None


def _kind(annotation: Any) -> str:
    """A type as a person reads it in a table of options."""
    if typing.get_origin(annotation) is typing.Annotated:
        return _kind(typing.get_args(annotation)[0])
    if typing.get_origin(annotation) is typing.Literal:
        return "|".join(str(value) for value in typing.get_args(annotation))
    if typing.get_origin(annotation) in (typing.Union, types.UnionType):
        return " | ".join(_kind(member) for member in typing.get_args(annotation))
    if annotation is type(None):
        return "None"
    if typing.get_origin(annotation) is not None:
        return str(annotation).replace("typing.", "")
    return getattr(annotation, "__name__", str(annotation))
