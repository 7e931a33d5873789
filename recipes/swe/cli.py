"""``orchard-async swe validate FILE``: per row of a dataset file, its format, its image,
how it will be graded and what is missing, without running anything."""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
from pathlib import Path

from orchard_async import ConfigError
from orchard_async.recipes.swe import formats, scoring
from orchard_async.recipes.swe import swebench_harness as swebench
from orchard_async.recipes.swe.instances import Instance, _Bad, _parquet_rows, _text_rows, parse_instance
from orchard_async.recipes.swe.task import SweOptions


def add_command(parser: argparse.ArgumentParser) -> None:
    actions = parser.add_subparsers(dest="swe_command", required=True, metavar="ACTION")
    validate = actions.add_parser("validate", help="per row: format, image, grading, what is missing")
    validate.add_argument("file", metavar="FILE", help="a .jsonl/.json/.parquet dataset file, or FORMAT:FILE")
    validate.add_argument(
        "--recipe-options", default="{}", metavar="JSON", help="the swe recipe's options (image_map, pro_scripts, ...)"
    )
    validate.set_defaults(func=cmd_validate)


def grading_of(instance: Instance, use_swebench: bool) -> str:
    if instance.pro is not None:
        return "SWE-bench Pro's run_script.sh + parser.py (output.json)"
    if instance.log_parser:
        owner = "the recipe's" if instance.log_parser in scoring.OWN_PARSERS else "swebench's"
        return f"{instance.test_command!r}, its log read by {owner} {instance.log_parser}"
    if swebench.has_official_fields(instance):
        if use_swebench:
            return f"swebench's harness (eval script, {instance.extra['log_parser']})"
        return "the recipe's pytest parser (swebench is not installed: pip install 'orchard-async[swebench]')"
    return "the recipe's pytest parser (-rA summary)"


def missing_of(instance: Instance, image: str | None, use_swebench: bool) -> list[str]:
    missing = []
    if image and shutil.which("docker"):
        found = subprocess.run(["docker", "image", "inspect", image], capture_output=True, timeout=30)
        if found.returncode != 0:
            missing.append(f"image {image} is not here")
    if instance.log_parser in scoring.OWN_PARSERS:
        pass
    elif instance.log_parser and not use_swebench:
        missing.append(f"the swebench package (for {instance.log_parser}): pip install 'orchard-async[swebench]'")
    elif instance.log_parser:
        try:
            swebench.parser_by_name(instance.log_parser)
        except ConfigError as exc:
            missing.append(str(exc))
    return missing


def cmd_validate(args: argparse.Namespace) -> int:
    try:
        options = SweOptions.resolve(json.loads(args.recipe_options))
    except json.JSONDecodeError as exc:
        raise ConfigError(f"--recipe-options is not JSON: {exc}") from None
    prefix, colon, rest = args.file.partition(":")
    fmt = formats.PREFIXES.get(prefix) if colon else None
    path = Path(rest if fmt else args.file).expanduser()
    if not path.is_file():
        raise ConfigError(f"{path}: no such dataset file")
    rows = _parquet_rows(path) if path.suffix.lower() == ".parquet" else _text_rows(path)
    scripts = Path(options.pro_scripts).expanduser() if options.pro_scripts else path.parent / "run_scripts"
    use_swebench = options.harness != "pytest" and swebench.usable()
    runnable = 0
    for number, row in rows:
        label = row.get("instance_id", "?") if isinstance(row, dict) else "?"
        try:
            instance = parse_instance(
                row, base_dir=path.parent, where=f"{path}:{number}", format=fmt, pro_scripts=scripts
            )
        except _Bad as exc:
            print(f"{path.name}:{number} {label}: does not load: {exc}")
            continue
        image = instance.image or swebench.image_name(
            instance.instance_id, namespace=options.image_namespace or None, registry=options.image_registry or None
        )
        image = options.image_map.get(image, image)
        missing = missing_of(instance, image, use_swebench)
        verdict = "runs" if not missing else "cannot run: " + "; ".join(missing)
        runnable += not missing
        where = instance.workdir or "/testbed"
        print(
            f"{path.name}:{number} {instance.instance_id}: {instance.format}, image {image} (repository at {where}), "
            f"graded by {grading_of(instance, use_swebench)}; {verdict}"
        )
    print(f"{runnable} of {len(rows)} rows can run here")
    return 0 if runnable == len(rows) else 1
