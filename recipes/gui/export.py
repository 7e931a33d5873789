"""GUI trajectories -> training data with screenshots: SFT chats and RL (GRPO) groups.

The same two formats and the same rules as every recipe's export (``orchard_async.records.export``,
docs/training-formats.md): only scored episodes are data (an infrastructure end, a task's
or a policy's error is never exported, counted in ``skipped_reasons``); ``rl`` gives each
sample its advantage within its run-prefixed group. What differs:

* the chat is the GUI policy's own (``conversation``): the system prompt for the
  addressing (and set-of-marks), the task and first page, then each model reply and the
  observation that followed, for the latest ``screenshots`` observations with the image the
  model had seen when it gave its last reply (older ones say the image was omitted): the
  conversation as it saw it then;
* every message's ``content`` is its text (a string, in every message of every record) and
  its ``image_urls`` the images it showed after that text (``[]`` for most): one type per
  field, so ``datasets`` loads each record back unchanged (a column mixing strings and lists
  of parts it cannot). ``openai_content(message)`` gives the parts an OpenAI-compatible server
  takes, text then images, as the policy sent them;
* images come from the folder the run kept them in (its ``screenshot_dir`` option), by
  hash: ``image_urls="inline"`` (default) puts each in as a ``data:image/png;base64`` URL
  (self-contained records), ``"file"`` as a ``file://`` URL of the PNG (small records; the
  trainer reads the files). A screenshot the folder lacks is a ConfigError: a record without
  the image the model acted on would teach something it never saw;
* each record also lists its screenshots' hashes in order (``images``: the order of the
  messages' ``image_urls``) (and has no SWE ``patch``);
* the policy's own ``submit`` after an answer is not a model turn and never trained on;
* an episode that ended ``parse_failures`` is RL data (its reward teaches the format) but
  not SFT data (its chat ends in replies that are not actions).

    orchard-async export sft out/gui.jsonl --screenshots out/shots --out out/gui-sft.jsonl
    orchard-async export-gui rl out/gui.jsonl --screenshots out/shots --out out/gui-rl.jsonl  # GUI runs only
"""

from __future__ import annotations

import argparse
import base64
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from orchard_async import ConfigError, Trajectory
from orchard_async.recipes.gui.conversation import (
    OBSERVATION_CHARS,
    conversation,
    fill_images,
    model_steps,
    observation_text,
    system_prompt,
)
from orchard_async.recipes.gui.task import DEFAULT_SCREENSHOTS, GuiOptions
from orchard_async.records import export as training_data

ImageUrls = Literal["inline", "file"]


class GuiChats:
    """Builds each trajectory's chat with its images, and remembers which images it used."""

    def __init__(
        self,
        screenshots_dir: str | Path,
        *,
        screenshots: int = DEFAULT_SCREENSHOTS,
        addressing: str = "element",
        marks: bool = False,
        image_urls: ImageUrls = "inline",
    ):
        self.folder = Path(screenshots_dir)
        if not self.folder.is_dir():
            raise ConfigError(
                f"--screenshots {self.folder}: no such folder; give the folder the run kept its screenshots in "
                "(the screenshot_dir option of `orchard-async run gui`)"
            )
        if addressing not in ("element", "coordinates"):
            raise ConfigError(f"--addressing must be element or coordinates, got {addressing!r}")
        if image_urls not in ("inline", "file"):
            raise ConfigError(f"--image-urls must be inline or file, got {image_urls!r}")
        if screenshots < 0:
            raise ConfigError("--last-screenshots must be 0 or more")
        self.screenshots = screenshots
        self.prompt = system_prompt(addressing, marks)
        self.image_urls = image_urls
        self._digest_of: dict[str, str] = {}  # image URL -> the screenshot's hash (to list a record's images)

    def __call__(self, trajectory: Trajectory) -> list[dict[str, Any]]:
        """The chat as the model saw it at its last reply, then that reply and, as text only
        (no model saw it), the observation that followed; each message's text and images
        apart (``content``, ``image_urls``)."""
        steps = model_steps(trajectory.steps)
        messages, shown = conversation(
            trajectory.instruction, steps[:-1], prompt=self.prompt, screenshots=self.screenshots
        )
        if steps:
            messages.append({"role": "assistant", "content": steps[-1].action.raw or steps[-1].action.command})
            messages.append({"role": "user", "content": observation_text(steps[-1])[:OBSERVATION_CHARS]})
        return [text_and_images(message) for message in fill_images(messages, {d: self.url(d) for d in shown})]

    def url(self, digest: str) -> str:
        url = self._url(digest)
        self._digest_of[url] = digest
        return url

    def _url(self, digest: str) -> str:
        path = self.folder / f"{digest}.png"
        if not path.is_file():
            raise ConfigError(
                f"screenshot {digest[:12]}… is not in {self.folder}; export from the folder the run kept its "
                "screenshots in (the run's screenshot_dir option)"
            )
        if self.image_urls == "file":
            return path.resolve().as_uri()
        return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode()

    def finish(self, record: dict[str, Any], trajectory: Trajectory) -> dict[str, Any]:
        """A record as the GUI export writes it, with ``images``: the hashes of its messages'
        images, in order."""
        record["images"] = [self._digest_of[url] for message in record["messages"] for url in message["image_urls"]]
        return record


def text_and_images(message: dict[str, Any]) -> dict[str, Any]:
    """A chat message (content a string or a list of parts) as the export writes it: its text
    as ``content`` and its images' URLs as ``image_urls``, in order."""
    content = message["content"]
    if isinstance(content, str):
        return {**message, "content": content, "image_urls": []}
    text = "".join(part["text"] for part in content if part.get("type") == "text")
    urls = [part["image_url"]["url"] for part in content if part.get("type") == "image_url"]
    return {**message, "content": text, "image_urls": urls}


def openai_content(message: dict[str, Any]) -> str | list[dict[str, Any]]:
    """An exported message's content as an OpenAI-compatible server takes it: the text alone,
    or the text then each image as parts (as the policy sent it)."""
    if not message.get("image_urls"):
        return message["content"]
    return [{"type": "text", "text": message["content"]}] + [
        {"type": "image_url", "image_url": {"url": url}} for url in message["image_urls"]
    ]


def export(
    kind: str,
    sources: training_data.Source | Sequence[training_data.Source],
    out: str | Path,
    chats: GuiChats,
    **options: Any,
) -> training_data.ExportSummary:
    """Write ``sft`` or ``rl`` (``grpo``) records of GUI trajectories to ``out`` (``options``:
    those of ``orchard_async.records.export.export``)."""
    return training_data.export(kind, sources, out, chats, finish=chats.finish, **options)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    training_data.add_arguments(parser)
    add_export_arguments(parser.add_argument_group("gui"))


def add_export_arguments(gui: argparse._ArgumentGroup | argparse.ArgumentParser) -> None:
    """The GUI export's own options (``orchard-async export`` adds them for GUI runs)."""
    gui.add_argument(
        "--screenshots",
        help="the folder the run kept its screenshots in (default: the screenshot_dir option's variable, "
        "docs/variables.md)",
    )
    gui.add_argument(
        "--last-screenshots",
        type=int,
        default=DEFAULT_SCREENSHOTS,
        help=f"images the chat keeps, the latest (default {DEFAULT_SCREENSHOTS}, as the policy)",
    )
    gui.add_argument("--addressing", choices=["element", "coordinates"], default="element", help="the policy's")
    gui.add_argument("--marks", action="store_true", help="the run had set-of-marks observations (the prompt says so)")
    gui.add_argument(
        "--image-urls",
        choices=["inline", "file"],
        default="inline",
        help="inline: data: URLs in the records (default); file: file:// URLs of the PNGs",
    )


def training_chats(options: dict[str, Any]) -> training_data.Chats:
    """The GUI policy's chat with its screenshots, for ``orchard-async export`` (``options``:
    the arguments of ``add_export_arguments`` by name)."""
    chats = gui_chats(options)
    return training_data.Chats(chats, chats.finish)


def gui_chats(options: dict[str, Any]) -> GuiChats:
    screenshots = options.get("screenshots") or GuiOptions.from_env().screenshot_dir
    if not screenshots:
        raise ConfigError("--screenshots DIR is required for a gui run: the folder the run kept its screenshots in")
    return GuiChats(
        screenshots,
        screenshots=options.get("last_screenshots", DEFAULT_SCREENSHOTS),
        addressing=options.get("addressing", "element"),
        marks=bool(options.get("marks")),
        image_urls=options.get("image_urls", "inline"),
    )


def run_export(args: argparse.Namespace) -> training_data.ExportSummary:
    chats = gui_chats(vars(args))
    return export(
        args.format,
        [args.trajectories, *getattr(args, "more_trajectories", [])],
        args.out,
        chats,
        **training_data.selection_options(args),
    )
